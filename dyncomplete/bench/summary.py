"""Per-method aggregates of a run's results: the numbers of summary.json and report.md.

Times, tokens and energy are summed over examples; EM, ES, pass@1 are percentages (0-100),
ROUGE-L a mean F-measure (0-1), BLEU sacrebleu's corpus BLEU. Speedups and the identical share
compare a method with `baseline` on the examples both completed in this run.
"""

from __future__ import annotations

from collections import defaultdict

from .metrics import corpus_bleu

BASELINE = "baseline"


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize_method(rows: list[dict], baseline: dict[str, dict]) -> dict:
    stats = [r["stats"] for r in rows]
    total = lambda key: sum(s[key] for s in stats)  # noqa: E731
    new_tokens, decode_s = total("new_tokens"), total("decode_s")
    energy = sum(r["energy_j"] for r in rows)
    entry = {
        "n": len(rows),
        "em": _mean(r["metrics"]["em"] for r in rows),
        "es": _mean(r["metrics"]["es"] for r in rows),
        "rouge_l": _mean(r["metrics"]["rouge_l"] for r in rows),
        "bleu": corpus_bleu([r["prediction"] for r in rows], [r["target"] for r in rows]),
    }
    if rows and "passed" in rows[0]["metrics"]:
        entry["pass_at_1"] = 100.0 * _mean(r["metrics"]["passed"] for r in rows)
    entry.update({
        "prompt_tokens": total("prompt_tokens"),
        "context_chunks_per_prompt": _mean(r.get("context_chunks", 0) for r in rows),
        "new_tokens": new_tokens,
        "prefill_s": total("prefill_s"),
        "decode_s": decode_s,
        "total_s": total("total_s"),
        "tokens_per_s": _ratio(new_tokens, decode_s),
        "prefill_tokens_per_s": _ratio(total("prompt_tokens") - total("cached_prompt_tokens"), total("prefill_s")),
        "decode_ms_per_token": _ratio(1000 * decode_s, new_tokens),
        "layer_evals_per_token": _ratio(total("layer_evals"), new_tokens),
        "compute_per_token": _ratio(sum(r["compute_per_token"] * r["stats"]["new_tokens"] for r in rows), new_tokens),
        "decision_per_token": _ratio(sum(r.get("decision_per_token", 0.0) * r["stats"]["new_tokens"] for r in rows),
                                     new_tokens),
        "energy_j": energy,
        "energy_j_per_token": _ratio(energy, new_tokens),
        "energy_source": rows[0]["energy_source"] if rows else None,
    })
    common = [r for r in rows if r["id"] in baseline]
    base = [baseline[r["id"]]["stats"] for r in common]
    mine = [r["stats"] for r in common]
    entry["speedup_vs_baseline"] = _ratio(sum(s["decode_s"] for s in base), sum(s["decode_s"] for s in mine))
    entry["e2e_speedup_vs_baseline"] = _ratio(sum(s["total_s"] for s in base), sum(s["total_s"] for s in mine))
    entry["identical_to_baseline"] = _mean(r["prediction"] == baseline[r["id"]]["prediction"] for r in common)
    drafted = total("drafted")
    if drafted:
        entry["acceptance_rate"] = total("accepted") / drafted
        entry["mean_accepted_length"] = _ratio(new_tokens, total("verify_steps"))
        entry["acceptance_per_position"] = _per_position(stats)
        entry["draft_sources"] = _by_source(stats)
        sizes = _count(size for s in stats for size in s.get("draft_sizes", []))
        entry["draft_size_steps"] = {str(k): v for k, v in sorted(sizes.items())}  # draft size -> verification steps
    entry["stopped_by"] = dict(sorted(_count(s["stopped_by"] for s in stats).items()))
    read = rows[0].get("weight_bytes") if rows else None
    entry["weight_bytes"] = read
    # gpt-fast's "bandwidth achieved": weights read per decode step x tokens per second
    entry["bandwidth_gbs"] = read * entry["tokens_per_s"] / 1e9 if read and entry["tokens_per_s"] else None
    return entry


def _per_position(stats: list[dict]) -> list[float]:
    drafted, accepted = defaultdict(int), defaultdict(int)
    for s in stats:
        for pos, (d, a) in enumerate(zip(s["drafted_per_position"], s["accepted_per_position"])):
            drafted[pos] += d
            accepted[pos] += a
    return [accepted[p] / drafted[p] for p in sorted(drafted) if drafted[p]]


def _by_source(stats: list[dict]) -> dict:
    """Per draft source: verification steps, drafted and accepted tokens (what each source gave)."""
    totals = defaultdict(lambda: [0, 0, 0])
    for s in stats:
        for source, counts in s.get("by_source", {}).items():
            totals[source] = [a + b for a, b in zip(totals[source], counts)]
    return {k: dict(zip(("steps", "drafted", "accepted"), v)) for k, v in sorted(totals.items())}


def _count(values) -> dict:
    counts = defaultdict(int)
    for v in values:
        counts[v] += 1
    return counts


def stop_rule_effect(rows: list[dict], wrapped: dict[str, dict]) -> dict | None:
    """What `METHOD+stop:T` did against METHOD alone on the same examples: the share of METHOD's
    wrong completions (not an exact match) it cut, the share of its right ones it damaged (cut
    and no longer exact), and the decode work (tokens, layer evaluations) it saved in all."""
    pairs = [(wrapped[r["id"]], r) for r in rows if r["id"] in wrapped]
    if not pairs:
        return None
    wrong = [(a, b) for a, b in pairs if a["metrics"]["em"] < 100]
    right = [(a, b) for a, b in pairs if a["metrics"]["em"] == 100]
    cut = lambda b: b["stats"]["stopped_by"] == "stop_rule"  # noqa: E731

    def saved(key: str) -> float | None:
        alone, stopped = (sum(pair[side]["stats"][key] for pair in pairs) for side in (0, 1))
        return 1 - stopped / alone if alone else None

    return {
        "examples": len(pairs), "wrong": len(wrong), "right": len(right),
        "wrong_cut": sum(cut(b) for _, b in wrong),
        "right_damaged": sum(cut(b) and b["metrics"]["em"] < 100 for _, b in right),
        "tokens_saved": saved("new_tokens"),
        "layer_evals_saved": saved("layer_evals"),
    }


def summarize(records: list[dict], methods: list[str], header: dict) -> dict:
    """summary.json: the run's header (model, dataset, n, ...) and one entry per method."""
    by_method = defaultdict(list)
    for r in records:
        by_method[r["method"]].append(r)
    baseline = {r["id"]: r for r in by_method.get(BASELINE, [])}
    n = len({r["id"] for r in records})
    entries = {m: summarize_method(by_method[m], baseline) for m in methods if by_method[m]}
    machine = header.get("memory_bandwidth_gbs")
    for entry in entries.values():
        entry["bandwidth_share"] = _ratio(entry["bandwidth_gbs"], machine) if entry["bandwidth_gbs"] else None
    for m, entry in entries.items():
        base, sep, _ = m.rpartition("+stop:")
        if sep and by_method.get(base):
            entry["stop_rule"] = stop_rule_effect(by_method[m], {r["id"]: r for r in by_method[base]})
    return {**header, "n": n, "methods": entries}
