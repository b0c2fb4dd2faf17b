"""The server's figures as Prometheus samples: what `GET /metrics` answers (the role of
llama-server's `--metrics`), and what each replica of a Ray deployment exports through Ray's
metrics agent (`cluster.py`). Totals are counters (rates come from Prometheus: `rate()` of
`tokens_generated_total` is tokens per second); the rest are gauges of this moment."""

from __future__ import annotations

# name -> (Prometheus type, help, its value from the worker's status and the prefix cache's counters)
METRICS = {
    "dyncomplete_requests_queued": ("gauge", "requests waiting for a slot", lambda w, c: w["queued"]),
    "dyncomplete_requests_running": ("gauge", "requests being generated", lambda w, c: w["running"]),
    "dyncomplete_batch_rows_mean": ("gauge", "mean sequences per batched model call (--parallel > 1)",
                                    lambda w, c: w.get("batching", {}).get("mean_batch_rows", 0.0)),
    "dyncomplete_model_busy_seconds_total": ("counter", "seconds the model thread spent in model calls (--parallel > 1; "
                                             "its rate() is the model's load)",
                                             lambda w, c: w.get("batching", {}).get("busy_s", 0.0)),
    "dyncomplete_requests_rejected_total": ("counter", "requests refused with 503: the queue was full",
                                            lambda w, c: w.get("rejected_busy", 0)),
    "dyncomplete_tokens_generated_total": ("counter", "completion tokens generated",
                                           lambda w, c: w.get("tokens_generated", 0)),
    "dyncomplete_prompt_tokens_evaluated_total": ("counter", "prompt tokens prefilled (not from the prefix cache)",
                                                  lambda w, c: w.get("prompt_tokens_evaluated", 0)),
    "dyncomplete_prefix_cache_lookups_total": ("counter", "prefix-cache lookups", lambda w, c: c.lookups),
    "dyncomplete_prefix_cache_hits_total": ("counter", "prefix-cache lookups that found a cached prefix",
                                            lambda w, c: c.hits),
}


def values(server) -> dict[str, float]:
    """Every metric's value now."""
    status, counters = server.worker.status(), server.prefix_cache.counters
    return {name: float(get(status, counters)) for name, (_, _, get) in METRICS.items()}


def prometheus_text(server) -> str:
    """The text exposition format, one HELP, TYPE and sample line per metric."""
    lines = []
    for name, value in values(server).items():
        kind, help_text, _ = METRICS[name]
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
    return "\n".join(lines) + "\n"
