"""Editor-session replay: type real files line by line through the HTTP server, as an editor
would, and measure what a person waits for.

At each pause (the cursor at the start of a non-blank line) one streamed completion is requested
with `stop=["\\n"]`; it is accepted when it equals the line typed next (trailing spaces aside).
The pause is at the line start, not after the indentation, because a prompt ending in spaces
splits a whitespace token the model never saw split (the BPE "token healing" problem) and
small models then answer with an empty line. Every pause is sent twice, prefix cache on and off
(alternating which goes first), so both rows see the same prompts and the same machine load.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np


@dataclass
class Pause:
    file: str
    line: int
    prefix: str
    target: str


def pauses_of(path: Path, start: float, count: int) -> list[Pause]:
    """Up to `count` pauses from the line at fraction `start` of the file onwards."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    out = []
    for i in range(int(len(lines) * start), len(lines)):
        target = lines[i].rstrip()
        prefix = "".join(lines[:i])
        if not target.strip() or not prefix.strip():
            continue  # nothing to complete, or nothing before the cursor
        out.append(Pause(str(path), i + 1, prefix, target))
        if len(out) == count:
            break
    return out


def request_once(http: httpx.Client, url: str, model: str, method: str, pause: Pause, max_tokens: int,
                 cache: bool, healing: bool = True) -> dict:
    body = {"model": model, "prompt": pause.prefix, "max_tokens": max_tokens, "temperature": 0, "stop": ["\n"],
            "stream": True, "method": method, "prefix_cache": cache, "token_healing": healing}
    started = time.perf_counter()
    first, text, stats = None, "", None
    with http.stream("POST", f"{url}/v1/completions", json=body,
                     headers={"X-Client-Id": f"bench-session-{'on' if cache else 'off'}"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"server answered {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"server error: {chunk['error']['message']}")
            piece = chunk["choices"][0]["text"]
            if piece and first is None:
                first = time.perf_counter() - started
            text += piece
            stats = chunk.get("dyncomplete", stats)
    latency = time.perf_counter() - started
    return {"latency_s": latency, "ttft_s": first if first is not None else latency, "text": text,
            "accepted": text.rstrip() == pause.target, "prompt_tokens": stats["prompt_tokens"],
            "cached_prompt_tokens": stats["cached_prompt_tokens"], "prefill_s": stats["prefill_s"]}


def summarise(results: list[dict]) -> dict:
    lat = np.array([r["latency_s"] for r in results]) * 1000
    ttft = np.array([r["ttft_s"] for r in results]) * 1000
    prompt = sum(r["prompt_tokens"] for r in results)
    return {
        "requests": len(results),
        "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
        "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "cached_prompt_share": sum(r["cached_prompt_tokens"] for r in results) / prompt if prompt else 0.0,
        "mean_prompt_tokens": prompt / len(results),
        "mean_prefill_ms": 1000 * float(np.mean([r["prefill_s"] for r in results])),
        "accepted": sum(r["accepted"] for r in results),
        "accepted_share": float(np.mean([r["accepted"] for r in results])),
    }


def replay(url: str, model: str, method: str, pauses: list[Pause], max_tokens: int, api_key: str | None = None,
           progress=None, healing: bool = True) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    runs = {True: [], False: []}
    with httpx.Client(headers=headers, timeout=600) as http:
        request_once(http, url, model, method, pauses[0], max_tokens, False, healing)  # warm-up, not counted
        for i, pause in enumerate(pauses):
            for cache in ((True, False) if i % 2 else (False, True)):
                runs[cache].append(request_once(http, url, model, method, pause, max_tokens, cache, healing))
            if progress:
                progress(i + 1, len(pauses))
    on, off = summarise(runs[True]), summarise(runs[False])
    same = float(np.mean([a["text"] == b["text"] for a, b in zip(runs[True], runs[False])]))
    return {
        "model": model, "method": method, "max_tokens": max_tokens, "token_healing": healing,
        "files": sorted({p.file for p in pauses}), "pauses": len(pauses),
        "rows": {"cache on": on, "cache off": off},
        "p50_speedup": off["p50_ms"] / on["p50_ms"] if on["p50_ms"] else 0.0,
        "identical_completions": same,
    }
