"""report.md: the run's header and one table, readable in ten seconds."""

from __future__ import annotations


WEIGHTS = {"int8": "int8 (weight-only, groups of 32)", "int4": "int4 (weight-only, groups of 32)"}


def _fmt(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _context_note(summary: dict) -> str:
    if summary.get("repo_context") == "off":
        return ", repository context off"
    chunks = max((m.get("context_chunks_per_prompt") or 0 for m in summary["methods"].values()), default=0)
    return f", repository context: {chunks:.1f} chunks per prompt" if chunks else ""


def render(summary: dict, plots: list[str]) -> str:
    methods = summary["methods"]
    has_pass = any("pass_at_1" in m for m in methods.values())
    has_decisions = any(m.get("decision_per_token") for m in methods.values())
    cols = ["method", "EM", "ES", "ROUGE-L", "BLEU"] + (["pass@1"] if has_pass else []) + [
        "tok/s", "prefill tok/s", "ms/token", "layers/token", "compute/token"] + (
        ["deciding/token"] if has_decisions else []) + [
        "speedup", "e2e speedup", "bandwidth", "J/token", "same as baseline"]
    lines = [
        f"# {summary['model']} on {summary['dataset']}",
        "",
        f"n = {summary['n']} examples, {summary['date']}, dtype {summary['dtype']}, weights "
        f"{WEIGHTS.get(summary.get('quant', 'none'), summary['dtype'])}, device {summary['device']} "
        f"({summary['cpu']}, {summary['threads']} threads), prompts of at most {summary.get('context_budget')} tokens"
        f"{_context_note(summary)}.",
        f"Energy: {summary['energy_source']} ({summary['energy_formula']}).",
        "EM, ES, pass@1 in %; ROUGE-L 0-1; ms/token = decode time per new token; speedup = baseline "
        "decode time / method decode time (e2e: prefill included), on the same examples; bandwidth = "
        "weight bytes read per decode step x tok/s, as a share of the machine's copy bandwidth "
        f"({_fmt(summary.get('memory_bandwidth_gbs'))} GB/s).",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|",
    ]
    for name, m in methods.items():
        row = [f"`{name}`", _fmt(m["em"]), _fmt(m["es"]), _fmt(m["rouge_l"], 3), _fmt(m["bleu"])]
        if has_pass:
            row.append(_fmt(m.get("pass_at_1")))
        row += [_fmt(m["tokens_per_s"]), _fmt(m.get("prefill_tokens_per_s"), 0), _fmt(m["decode_ms_per_token"]),
                _fmt(m["layer_evals_per_token"]), _fmt(m["compute_per_token"], 2)]
        if has_decisions:
            row.append(_fmt(m.get("decision_per_token"), 3))
        row += [_fmt(m["speedup_vs_baseline"], 2, "x"), _fmt(m["e2e_speedup_vs_baseline"], 2, "x"),
                _fmt(None if m.get("bandwidth_share") is None else 100 * m["bandwidth_share"], 0, "%"),
                _fmt(m["energy_j_per_token"], 3),
                _fmt(None if m["identical_to_baseline"] is None else 100 * m["identical_to_baseline"], 0, "%")]
        lines.append("| " + " | ".join(row) + " |")
    drafting = {n: m for n, m in methods.items() if "acceptance_rate" in m}
    if drafting:
        lines += ["", "| method | acceptance rate | tokens per verification | drafted per verification | "
                  "acceptance by draft depth | accepted / drafted by source |", "|---|---:|---:|---:|---|---|"]
        for name, m in drafting.items():
            positions = " ".join(f"{a:.2f}" for a in m["acceptance_per_position"][:10])
            sources = ", ".join(f"{k} {v['accepted']}/{v['drafted']}" for k, v in m.get("draft_sources", {}).items())
            steps = sum(v["steps"] for v in m.get("draft_sources", {}).values())
            per_step = sum(v["drafted"] for v in m.get("draft_sources", {}).values()) / steps if steps else None
            lines.append(f"| `{name}` | {m['acceptance_rate']:.2f} | {_fmt(m['mean_accepted_length'], 2)} | "
                         f"{_fmt(per_step, 2)} | {positions} | {sources} |")
    stopping = {n: m["stop_rule"] for n, m in methods.items() if m.get("stop_rule")}
    if stopping:
        lines += ["", "Stop rule against the same method without it (wrong/right: exact match of the method alone):",
                  "", "| method | wrong completions cut | right ones damaged | tokens saved | layer evaluations saved |",
                  "|---|---:|---:|---:|---:|"]
        for name, e in stopping.items():
            lines.append(f"| `{name}` | {e['wrong_cut']} of {e['wrong']} | {e['right_damaged']} of {e['right']} | "
                         f"{_fmt(None if e['tokens_saved'] is None else 100 * e['tokens_saved'], 0, '%')} | "
                         f"{_fmt(None if e['layer_evals_saved'] is None else 100 * e['layer_evals_saved'], 0, '%')} |")
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"
