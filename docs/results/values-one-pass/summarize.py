"""Medians of ab.sh's output per model and depth: each process's median step and native layer
call, before against after, and each round's after/before ratio (a round's two processes ran one
after the other): python docs/results/values-one-pass/summarize.py steps-*.txt"""
import re
import statistics as st
import sys

HEAD = re.compile(r"(before|after) (\d+) (\S+) at (\d+) cached tokens: (.*)")
ROUND = re.compile(r"step ([\d.]+) ms, layers ([\d.]+)")

runs = {}  # (model, depth, build, file:round) -> (median step, median layers)
for name in sys.argv[1:]:
    for line in open(name):
        if m := HEAD.match(line):
            parts = [tuple(float(x) for x in r) for r in ROUND.findall(m[5])]
            runs[(m[3], int(m[4]), m[1], f"{name}:{m[2]}")] = tuple(st.median(c) for c in zip(*parts))
for model, depth in sorted({k[:2] for k in runs}):
    rounds = sorted({k[3] for k in runs if k[:2] == (model, depth)
                     and (model, depth, "before", k[3]) in runs and (model, depth, "after", k[3]) in runs})
    for i, part in enumerate(("step", "layers")):
        before = [runs[(model, depth, "before", r)][i] for r in rounds]
        after = [runs[(model, depth, "after", r)][i] for r in rounds]
        ratios = sorted(a / b for a, b in zip(after, before))
        print(f"{model} at {depth}, {part}: before {st.median(before):.2f} ms ({min(before):.2f}-{max(before):.2f}), "
              f"after {st.median(after):.2f} ({min(after):.2f}-{max(after):.2f}), after/before in a round: median "
              f"{st.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}), lower in {sum(x < 1 for x in ratios)} of {len(rounds)}")
