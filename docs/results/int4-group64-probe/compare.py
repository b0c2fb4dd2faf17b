"""Line-py ES and EM of the three probe runs and the share of completions identical to bf16's:
python docs/results/int4-group64-probe/compare.py > docs/results/int4-group64-probe/compare.txt"""
import json
from pathlib import Path

HERE = Path(__file__).parent
runs = {name: {r["id"]: r for r in map(json.loads, (HERE / f"{name}-line-py.jsonl").open())}
        for name in ("bf16", "g32", "g64")}
print("| weights | n | ES | EM | same as bf16 |\n|---|---:|---:|---:|---:|")
for name, rows in runs.items():
    n = len(rows)
    es = sum(r["es"] for r in rows.values()) / n
    em = sum(r["em"] for r in rows.values()) / n
    same = sum(r["prediction"] == runs["bf16"][i]["prediction"] for i, r in rows.items()) / n
    print(f"| {name} | {n} | {es:.1f} | {em:.1f} | {same:.0%} |")
