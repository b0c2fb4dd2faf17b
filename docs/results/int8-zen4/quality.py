"""Weight formats against the model's own bfloat16 weights on the same examples: EM, ES and the
share of completions identical to bfloat16's, from `dyncomplete bench` runs (one per format).

    cd docs/results/int8-zen4 && python3 quality.py quality-qwen2.5 quality-smollm2 > quality.json
"""
import json
import sys
from pathlib import Path


def predictions(run: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (run / "examples.jsonl").open()) if r["method"] == "baseline"}


rows = []
for stem in sys.argv[1:]:
    plain = predictions(Path(f"{stem}-none"))
    for quant in ("none", "int8", "int4"):
        run = predictions(Path(f"{stem}-{quant}"))
        ids = sorted(run.keys() & plain.keys())
        rows.append({"model": json.loads(Path(f"{stem}-{quant}/run.json").read_text()).get("model", stem),
                     "quant": quant, "n": len(ids),
                     "em": round(sum(run[i]["metrics"]["em"] for i in ids) / len(ids), 1),
                     "es": round(sum(run[i]["metrics"]["es"] for i in ids) / len(ids), 1),
                     "same_as_bf16": round(sum(run[i]["prediction"] == plain[i]["prediction"] for i in ids) / len(ids), 3)})
print(json.dumps(rows, indent=1))
