"""Decode and prefill speed of one model configuration, and the memory bandwidth it reaches.

    python -m dyncomplete.bench.speed --engine fast --quant int8 --runs 5
    python -m dyncomplete.bench.speed --verify-rows 1,2,4,8,16   # what a verification pass costs
    python -m dyncomplete.bench.speed --model qwen2.5-coder-0.5b --reference llama-bench

Prompt: the first 480 tokens of the standard library's `json/decoder.py`; 64 greedy tokens, one
`LayeredModel.forward` per token (the baseline's decode loop without its emitter). Reports
medians over runs. Bandwidth achieved = weight bytes one decode token reads x tokens/s, over the
bandwidth of a copy and of a read alone, both measured in the same run after the decode: a
virtual machine's bandwidth moves within minutes, so a figure cached from another hour misleads.
`--reference llama-bench` runs llama.cpp's own benchmark (built by install-reference.sh) on the
model's GGUF file after ours, with the same threads: a prefill of as many tokens and as many
generated tokens after that many in the cache (`-d`), and prints our figures over its.
`--rounds K` runs the two in turn K times (which goes first alternates) and gives the median of
the K ratios: a virtual machine's speed drifts within minutes, and a ratio from one pair of runs
moves with it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import sysconfig
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..engine.sampling import greedy_index
from ..models import load
from ..models.verify_cost import pass_times
from ..paths import cpu_has_bf16, cpu_name
from .bandwidth import measure_copy_bandwidth, measure_read_bandwidth

PROMPT_FILE = Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py"


@torch.inference_mode()
def measure(model, prompt_tokens: int = 480, new_tokens: int = 64, runs: int = 5) -> dict:
    ids = model.tokenizer(PROMPT_FILE.read_text(), add_special_tokens=False).input_ids[:prompt_tokens]
    prompt = torch.tensor(ids)
    model.forward(prompt[:32], model.new_cache())  # warm-up
    decode_ms, prefill_tps, outputs = [], [], []
    for _ in range(runs):
        cache = model.new_cache()
        start = time.perf_counter()
        logits = model.forward(prompt, cache)[0, -1]
        tokens = [greedy_index(logits)]  # on a GPU, this waits for the prefill
        prefill_tps.append(len(ids) / (time.perf_counter() - start))
        start = time.perf_counter()
        for k in range(new_tokens - 1):
            logits = model.forward(torch.tensor([tokens[-1]]), cache, start=len(ids) + k)[0, -1]
            tokens.append(greedy_index(logits))
        decode_ms.append((time.perf_counter() - start) * 1000 / (new_tokens - 1))
        outputs.append(tokens)
    ms = statistics.median(decode_ms)
    per_token = model.weight_bytes_per_token()
    return {
        "engine": model.engine, "quant": model.quant, "dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "runs": runs, "prompt_tokens": len(ids), "new_tokens": new_tokens,
        "decode_ms_per_token": round(ms, 2), "decode_ms_all": [round(x, 2) for x in decode_ms],
        "decode_tok_s": round(1000 / ms, 1), "prefill_tok_s": round(statistics.median(prefill_tps), 1),
        "weight_mb_per_token": round(per_token / 1e6, 1),
        "bandwidth_gb_s": round(per_token * 1000 / ms / 1e9, 2),
        "tokens": outputs[0],
    }


def verify_passes(model, rows: list[int], prompt_tokens: int = 480, runs: int = 7) -> dict:
    """Time of one pass over k new positions after the prompt (a verification pass of k - 1
    drafted tokens), median of `runs` rounds (`verify_cost.pass_times`), and its ratio to the
    one-position pass (a decode step)."""
    ids = model.tokenizer(PROMPT_FILE.read_text(), add_special_tokens=False).input_ids[: prompt_tokens + max(rows)]
    ms = {k: t * 1000 for k, t in pass_times(model, ids, prompt_tokens, rows, runs).items()}
    one = ms[1] if 1 in ms else None
    return {"pass_ms": {k: round(v, 2) for k, v in ms.items()},
            "relative_to_one": {k: round(v / one, 2) for k, v in ms.items()} if one else None}


def llama_bench(model: str, threads: int, prompt_tokens: int, new_tokens: int, runs: int) -> dict:
    """llama-bench on the model's own GGUF file: prompt tokens/s with an empty cache and generated
    tokens/s after `prompt_tokens` in the cache (the shape `measure` times), medians of `runs`."""
    from ..models.loading import registered_gguf
    from .launch import llama_cpp_binary

    gguf = registered_gguf(model, progress=lambda m: None)
    tests = {"prefill_tok_s": ["-p", str(prompt_tokens), "-n", "0", "-d", "0"],
             "decode_tok_s": ["-p", "0", "-n", str(new_tokens), "-d", str(prompt_tokens)]}
    out = {"gguf": gguf.name}
    for key, shape in tests.items():
        cmd = [str(llama_cpp_binary("llama-bench")), "-m", str(gguf), "-t", str(threads), "-r", str(runs),
               "-o", "json", *shape]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"llama-bench exited with {done.returncode}: {done.stderr[-500:]}")
        (test,) = json.loads(done.stdout)
        out[key] = round(statistics.median(test["samples_ts"]), 1)
    return out


def combine_rounds(rounds: list[tuple[dict, dict | None]]) -> dict:
    """One result from rounds of (`measure`, `llama_bench` or None): our figures the medians over
    the rounds, each ratio to llama-bench the median of the rounds' ratios (with every round's
    figures under `rounds` where there were several)."""
    result = dict(rounds[0][0])
    if len(rounds) > 1:
        for key in ("decode_tok_s", "prefill_tok_s", "bandwidth_gb_s"):
            result[key] = round(statistics.median(ours[key] for ours, _ in rounds), 2 if key == "bandwidth_gb_s" else 1)
        result["decode_ms_per_token"] = round(1000 / result["decode_tok_s"], 2)
        result["decode_ms_all"] = [ms for ours, _ in rounds for ms in ours["decode_ms_all"]]
        result["rounds"] = [{"decode_tok_s": ours["decode_tok_s"], "prefill_tok_s": ours["prefill_tok_s"],
                             "llama_bench": ref} for ours, ref in rounds]
    if rounds[0][1] is not None:
        ratios = {f"{key.removesuffix('_tok_s')}_x": statistics.median(ours[key] / ref[key] for ours, ref in rounds)
                  for key in ("prefill_tok_s", "decode_tok_s")}
        medians = {key: round(statistics.median(ref[key] for _, ref in rounds), 1)
                   for key in ("prefill_tok_s", "decode_tok_s")}
        result["llama_bench"] = {"gguf": rounds[0][1]["gguf"], **medians, "rounds": len(rounds),
                                 **{key: round(x, 2) for key, x in ratios.items()}}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--engine", default="auto", choices=["auto", "fast", "hf"])
    p.add_argument("--quant", default="auto", choices=["auto", "none", "int8", "int4"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=480)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--bandwidth", action="store_true", help="also report the share of copy and of read bandwidth reached")
    p.add_argument("--reference", choices=["llama-bench"], default=None,
                   help="also run llama.cpp's llama-bench on the model's GGUF file and give our speed over its")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --reference: ours and llama-bench in turn this many times, the median ratio")
    p.add_argument("--verify-rows", default=None, metavar="K,K,...",
                   help="instead of decoding, time passes over K positions (verification) against one")
    args = p.parse_args(argv)
    if args.rounds < 1 or (args.rounds > 1 and not args.reference):
        p.error("--rounds takes a count of 1 or more, and more than 1 only with --reference")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = load(args.model, dtype=args.dtype, device=args.device, quant=args.quant, engine=args.engine,
                 progress=lambda m: None)
    load_s = time.perf_counter() - start
    if args.verify_rows:
        rows = sorted({1, *(int(k) for k in args.verify_rows.split(","))})
        result = {"model": args.model, "engine": model.engine, "quant": model.quant, "runs": args.runs,
                  **verify_passes(model, rows, args.prompt_tokens, args.runs)}
        print(json.dumps(result))
        return 0
    def ours():
        return measure(model, args.prompt_tokens, args.new_tokens, args.runs)

    def reference():
        if args.reference:
            return llama_bench(args.model, args.threads, args.prompt_tokens, args.new_tokens, args.runs)
        return None

    rounds = []
    for k in range(args.rounds):
        if k % 2:  # llama-bench first every other round, so that a drift weighs on both alike
            theirs = reference()
            rounds.append((ours(), theirs))
        else:
            rounds.append((ours(), reference()))
    result = combine_rounds(rounds)
    result["load_s"] = round(load_s, 2)
    if args.bandwidth:
        result["copy_gb_s"] = round(measure_copy_bandwidth(), 2)
        result["read_gb_s"] = round(measure_read_bandwidth(), 2)
        result["bandwidth_share"] = round(result["bandwidth_gb_s"] / result["copy_gb_s"], 3)
        result["read_share"] = round(result["bandwidth_gb_s"] / result["read_gb_s"], 3)
    result["tokens"] = result["tokens"][:16]
    result |= {"model": args.model, "command": shlex.join(["python", "-m", "dyncomplete.bench.speed", *sys.argv[1:]]),
               "cpu": cpu_name(), "cpu_bf16": cpu_has_bf16(),
               "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
               "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
