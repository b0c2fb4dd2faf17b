"""ES, EM and the share of completions identical to bfloat16's (`--quant none`) for each weight
format's line-py run, from their examples.jsonl:
python docs/results/int4-g64/compare.py > docs/results/int4-g64/compare.txt"""
import json
from pathlib import Path

HERE = Path(__file__).parent
RUNS = {  # model -> format -> run folder
    "qwen2.5-coder-0.5b": {"none": HERE.parent / "int8-zen4/quality-qwen2.5-none",
                           "int4": HERE / "quality-qwen2.5-coder-0.5b-int4",
                           "int4-g64": HERE / "quality-qwen2.5-coder-0.5b-int4-g64"},
    "smollm2-135m": {"none": HERE.parent / "int8-zen4/quality-smollm2-none",
                     "int4": HERE / "quality-smollm2-135m-int4",
                     "int4-g64": HERE / "quality-smollm2-135m-int4-g64"},
}


def rows(folder: Path) -> dict:
    return {r["id"]: r for r in map(json.loads, (folder / "examples.jsonl").open())}


print("| model | weights | n | ES | EM | same as bfloat16 |\n|---|---|---:|---:|---:|---:|")
for model, formats in RUNS.items():
    bf16 = rows(formats["none"])
    for name, folder in formats.items():
        got = rows(folder)
        n = len(got)
        es = sum(r["metrics"]["es"] for r in got.values()) / n
        em = sum(r["metrics"]["em"] for r in got.values()) / n
        same = sum(r["prediction"] == bf16[i]["prediction"] for i, r in got.items()) / n
        print(f"| {model} | {name} | {n} | {es:.1f} | {em:.1f} | {same:.0%} |")
