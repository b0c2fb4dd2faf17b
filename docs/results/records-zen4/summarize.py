"""Medians of ab.sh's output, before against after, and each round's after/before ratio (a round's
two processes ran one after the other, so the ratio leaves out the VM's slower spells):
python docs/results/records-zen4/summarize.py steps-*.txt"""
import re
import statistics as st
import sys

LINE = re.compile(r"(\w+) (\d+) (\S+): step ([\d.]+) ms = layers ([\d.]+) \+ head ([\d.]+) \+ rest ([\d.]+)")
PARTS = ("step", "layers", "head", "rest")

runs = {}  # (model, build, file:round) -> [[step, layers, head, rest], ...]
for name in sys.argv[1:]:
    for line in open(name):
        if m := LINE.match(line):
            key = (m[3], m[1], f"{name}:{m[2]}")
            runs.setdefault(key, []).append([float(m[i]) for i in range(4, 8)])
for model in sorted({k[0] for k in runs}):
    rounds = sorted({k[2] for k in runs if k[0] == model and (model, "before", k[2]) in runs and (model, "after", k[2]) in runs})
    med = {(b, r): [st.median(c) for c in zip(*runs[(model, b, r)])] for b in ("before", "after") for r in rounds}
    for i, part in enumerate(PARTS):
        before, after = [med[("before", r)][i] for r in rounds], [med[("after", r)][i] for r in rounds]
        if not all(before) or not all(after):  # builds since the native logits call time no head product apart
            continue
        ratios = sorted(a / b for a, b in zip(after, before))
        print(f"{model} {part}: before {st.median(before):.2f} ms ({min(before):.2f}-{max(before):.2f}), "
              f"after {st.median(after):.2f} ({min(after):.2f}-{max(after):.2f}), after/before in a round: median "
              f"{st.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}), lower in {sum(x < 1 for x in ratios)} of {len(rounds)}")
