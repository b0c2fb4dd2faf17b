"""Medians over ab.sh's rounds, before and after, as markdown tables.
python docs/results/attention-kv-major/summarize.py docs/results/attention-kv-major/ab-qwen.txt"""
import json
import statistics
import sys
from collections import defaultdict

passes, steps = defaultdict(list), defaultdict(list)
for line in open(sys.argv[1]):
    variant, kind, payload = line.split(" ", 2)
    (passes if kind == "passes" else steps)[variant].append(json.loads(payload))


def median(runs, *keys):
    values = []
    for run in runs:
        for key in keys:
            run = run[key]
        values.append(run)
    return statistics.median(values)


n = len(passes["before"])
print(f"One sequence's pass, ms (median of {n} rounds, each a median of 7), before -> after:\n")
print("| cached tokens | 1 row | 2 rows | 4 rows | 8 rows | 16 rows | a position's cost |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for cached in passes["before"][0]:
    cells = [f"{median(passes['before'], cached, f'{k} rows ms'):.1f} -> {median(passes['after'], cached, f'{k} rows ms'):.1f}"
             for k in (1, 2, 4, 8, 16)]
    cost = f"{median(passes['before'], cached, 'position cost'):.3f} -> {median(passes['after'], cached, 'position cost'):.3f}"
    print(f"| {cached} | " + " | ".join(cells) + f" | {cost} |")
print(f"\nBatched calls, 1,000 cached tokens a sequence, ms (median of {n} rounds, each a median of 30), before -> after:\n")
print("| rows a sequence | 1 sequence | 2 sequences | 3 sequences | 4 sequences |")
print("|---:|---:|---:|---:|---:|")
for rows in (1, 2, 3):
    cells = [f"{median(steps['before'], f'{s}x{rows}'):.1f} -> {median(steps['after'], f'{s}x{rows}'):.1f}" for s in (1, 2, 3, 4)]
    print(f"| {rows} | " + " | ".join(cells) + " |")
