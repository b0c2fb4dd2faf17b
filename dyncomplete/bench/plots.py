"""PNG plots of a summary: quality against time and energy per token, Pareto front marked, for
--sweep one curve per method family through its thresholds (baseline as a point), for drafting
methods the acceptance per draft depth and the draft sizes per verification, and for early exit
GREEN-CODE's view: energy saved against the change in ROUGE-L, the papers' marks beside."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COSTS = {
    "decode_ms_per_token": "decode time per token (ms)",
    "energy_j_per_token": "energy per token (J)",
    "layer_evals_per_token": "layer evaluations per token",
}
LABELS = {"es": "ES (edit similarity, 0-100)", "em": "EM (exact match, %)", "pass_at_1": "pass@1 (%)"}


def quality_metrics(summary: dict) -> list[str]:
    first = next(iter(summary["methods"].values()), {})
    return ["pass_at_1", "es"] if "pass_at_1" in first else ["es", "em"]


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points that no other point beats (lower or equal cost and higher or equal
    quality, one of them strictly), ordered by cost."""
    front = []
    for i, (x, y) in enumerate(points):
        beaten = any(x2 <= x and y2 >= y and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _usable(summary: dict, cost: str, quality: str) -> list[tuple[str, float, float]]:
    return [(name, m[cost], m[quality]) for name, m in summary["methods"].items()
            if m.get(cost) is not None and m.get(quality) is not None]


def plot_tradeoff(summary: dict, cost: str, path: Path) -> Path:
    metrics = quality_metrics(summary)
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.5), squeeze=False)
    for ax, quality in zip(axes[0], metrics):
        rows = _usable(summary, cost, quality)
        points = [(x, y) for _, x, y in rows]
        ax.scatter([p[0] for p in points], [p[1] for p in points], color="tab:blue", zorder=3)
        for name, x, y in rows:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        front = pareto_front(points)
        if front:
            ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "--o", color="tab:red",
                    markerfacecolor="none", markersize=11, label="Pareto front", zorder=2)
            ax.legend(loc="lower right", fontsize=8)
        _axes(ax, cost, quality)
    return _save(fig, f"{summary['model']} on {summary['dataset']} (n={summary['n']}, {summary['dtype']})", path)


def plot_sweeps(summary: dict, sweeps: dict[str, list[str]], path: Path) -> Path:
    """Rows: quality metrics; columns: layer evals, time and energy per token; one line per family."""
    metrics = quality_metrics(summary)
    fig, axes = plt.subplots(len(metrics), len(COSTS), figsize=(5 * len(COSTS), 4 * len(metrics)), squeeze=False)
    methods = summary["methods"]
    base = methods.get("baseline")
    for r, quality in enumerate(metrics):
        for c, cost in enumerate(COSTS):
            ax = axes[r][c]
            for family, names in sweeps.items():
                pts = [(methods[n][cost], methods[n][quality], n.rsplit("@", 1)[-1]) for n in names
                       if n in methods and methods[n].get(cost) is not None]
                if not pts:
                    continue
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=family)
                for x, y, t in pts:
                    ax.annotate(t, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
            if base and base.get(cost) is not None:
                ax.scatter([base[cost]], [base[quality]], marker="*", s=150, color="black", label="baseline", zorder=4)
            _axes(ax, cost, quality)
            if r == 0 and c == 0:
                ax.legend(fontsize=8)
    return _save(fig, f"threshold sweeps: {summary['model']} on {summary['dataset']} (n={summary['n']})", path)


def plot_drafting(summary: dict, path: Path) -> Path | None:
    """Left: share of verifications whose accepted tokens reached each depth, of those that
    drafted that deep; right: how many verifications drafted how many tokens (chain or tree)."""
    drafting = {n: m for n, m in summary["methods"].items() if m.get("acceptance_per_position")}
    if not drafting:
        return None
    fig, (depth_ax, size_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, m in drafting.items():
        rates = m["acceptance_per_position"]
        depth_ax.plot(range(1, len(rates) + 1), rates, "o-", label=name)
        sizes = {int(k): v for k, v in m.get("draft_size_steps", {}).items()}
        if sizes:
            total = sum(sizes.values())
            size_ax.plot(sorted(sizes), [sizes[k] / total for k in sorted(sizes)], "o-", label=name)
    depth_ax.set_xlabel("draft depth")
    depth_ax.set_ylabel("accepted, of verifications that drafted this deep")
    size_ax.set_xlabel("tokens drafted in one verification (chain or tree)")
    size_ax.set_ylabel("share of verifications")
    for ax in (depth_ax, size_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, f"drafting: {summary['model']} on {summary['dataset']} (n={summary['n']})", path)


# The published marks drawn on the early-exit plot: GREEN-CODE (energy saved, absolute ROUGE-L
# change) and ICSE 2024's stop rule (time saved, relative ROUGE-L change).
GREEN_CODE = ((23.0, 50.0), -0.015)
ICSE24 = (11.2, -0.011)


def plot_exit_energy(summaries: list[dict], path: Path) -> Path | None:
    """Each early-exit method's energy saved against its run's baseline on the same examples (%,
    the whole request: a method that writes longer lines spends more, where energy per token would
    spread the prompt's cost over more tokens and flatter it), against its ROUGE-L minus that
    baseline's; one colour per run (e.g. a tuned model beside its base); GREEN-CODE's 23-50% at
    -0.015 as a segment, ICSE 2024's 11.2% faster at -1.1% ROUGE-L as a point (time, not energy).
    None where no run has early-exit methods beside a baseline."""
    runs = []
    for summary in summaries:
        methods, base = summary["methods"], summary["methods"].get("baseline")
        exits = {n: m for n, m in methods.items()
                 if n.startswith("early-exit") and m.get("energy_j") and base and m["n"] == base["n"]}
        if exits and base.get("energy_j"):
            runs.append((summary, base, exits))
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (summary, base, exits), color in zip(runs, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        label = (f"{summary['model']}, {summary['dataset']} (baseline ROUGE-L {base['rouge_l']:.3f})"
                 if len(runs) > 1 else None)
        for i, (name, m) in enumerate(exits.items()):
            x = 100 * (1 - m["energy_j"] / base["energy_j"])
            y = m["rouge_l"] - base["rouge_l"]
            ax.scatter([x], [y], color=color, zorder=3, label=label if i == 0 else None)
            ax.annotate(name.removeprefix("early-exit:"), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    (low, high), drop = GREEN_CODE
    ax.plot([low, high], [drop, drop], color="tab:green", linewidth=4, alpha=0.6,
            label=f"GREEN-CODE: {low:.0f}-{high:.0f}% energy saved at {drop} ROUGE-L")
    saved, relative = ICSE24
    ax.scatter([saved], [relative * runs[0][1]["rouge_l"]], marker="s", color="black", zorder=3,
               label=f"ICSE 2024 stop rule: {saved}% faster at {100 * relative:.1f}% ROUGE-L (time)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"energy saved against the baseline, same examples (%; {runs[0][0].get('energy_source', '')})")
    ax.set_ylabel("ROUGE-L minus the baseline's")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if len(runs) > 1:  # the legend names each run
        return _save(fig, "early exit against the papers", path)
    summary = runs[0][0]
    return _save(fig, f"early exit against the papers: {summary['model']} on {summary['dataset']} (n={summary['n']})",
                 path)


def _axes(ax, cost: str, quality: str) -> None:
    ax.set_xlabel(COSTS[cost])
    ax.set_ylabel(LABELS[quality])
    ax.grid(alpha=0.3)


def _save(fig, title: str, path: Path) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
