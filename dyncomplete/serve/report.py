"""The `dyncomplete` object of a response: where the compute of one completion went.

Built in the worker thread (it uses the tokenizer, which is not safe to share across threads).
`tokens` splits the completion text at token boundaries so the web page can colour each token by
the layer it exited at, or by whether it was drafted and accepted.
"""

from __future__ import annotations

from ..engine import Completion

# Only the values OpenAI's clients know ("stop", "length"; the SDK types list no other for a text
# completion). "stop": the completion ended where the model or the request said it should.
# "length": it was cut short by a limit, as OpenAI and vLLM report max_tokens and the context length;
# here also the editor guards' time cap (time_limit), the deadline (--timeout), a newer request of the same client, a disconnect or a shutdown.
# `dyncomplete.stopped_by` tells them apart.
STOPPED = {"eos", "newline", "stop", "stop_rule",
           "suffix_repeat", "indent", "bracket", "blank_line"}  # the editor guards (engine/guards.py)


def token_pieces(tokenizer, ids: list[int], text: str, healed: str = "") -> list[str]:
    """The text each token adds (decoding prefixes, so multi-byte characters split across tokens
    land on the token that completes them), clipped to the final text (stop strings removed);
    `healed`, the prompt text that token healing made the first token repeat, is left out."""
    pieces, done = [], ""
    for i in range(len(ids)):
        now = tokenizer.decode(ids[: i + 1], skip_special_tokens=True).rstrip("\ufffd")
        now = now[len(healed):] if healed and now.startswith(healed) else now
        now = now[: len(text)] if len(now) > len(text) else now
        pieces.append(now[len(done):] if now.startswith(done) else "")
        done = now if now.startswith(done) else done
    return pieces


def finish_reason(stopped_by: str) -> str:
    return "stop" if stopped_by in STOPPED else "length"


def stats_object(model, completion: Completion, energy, extra: dict) -> dict:
    s = completion.stats
    pieces = token_pieces(model.tokenizer, completion.token_ids, completion.text, completion.healed)
    return {
        **s.summary(model),
        "num_layers": model.num_layers,
        "energy_j": energy.joules,
        "energy_source": energy.source,
        "energy_formula": energy.formula,
        "token_layers": s.token_layers,
        "token_sources": s.token_sources,
        "draft_sources": {source: dict(zip(("steps", "drafted", "accepted"), counts))
                          for source, counts in s.by_source.items()},
        "tokens": [{"text": t, "layers": n, "source": src}
                   for t, n, src in zip(pieces, s.token_layers, s.token_sources)],
        **extra,
    }
