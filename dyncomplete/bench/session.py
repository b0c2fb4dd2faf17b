"""Editor-session replay: type real files line by line through the HTTP server, as an editor
would, and measure what a person waits for.

At each pause (the cursor at the start of a non-blank line) one streamed completion is requested
with `stop=["\\n"]`; it is accepted when it equals the line typed next (trailing spaces aside).
The pause is at the line start, not after the indentation, because a prompt ending in spaces
splits a whitespace token the model never saw split (the BPE "token healing" problem) and
small models then answer with an empty line. Every pause is sent twice, prefix cache on and off
(alternating which goes first), so both rows see the same prompts and the same machine load.

With repository context (`context_files`), the replay first sends, per typed file, one
cache-warming `/infill` request whose `input_extra` holds the other files of its folder, as
llama.vscode does when files are opened; the completions then ask for the server's memory of
sent files (`"client_memory": true`), and a third row asks without it, prefix cache on.
With `ngram_row`, a row without the server's cross-request n-gram cache (`"ngram_cache": false`,
prefix cache on) shows what drafting from the client's earlier completions is worth.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from .metrics import edit_similarity

CONTEXT_FILE_BYTES = 256 * 2**10  # a sibling file larger than this is not sent


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


def sibling_files(path: Path, count: int) -> list[dict]:
    """Up to `count` other Python files of `path`'s folder, as `input_extra` records."""
    out = []
    for other in sorted(path.parent.glob("*.py")):
        if other != path and other.stat().st_size <= CONTEXT_FILE_BYTES and len(out) < count:
            out.append({"filename": f"{path.parent.name}/{other.name}", "text": other.read_text(errors="replace")})
    return out


def send_files(http: httpx.Client, url: str, path: Path, count: int) -> None:
    """A cache-warming `/infill` request carrying `path`'s sibling files (answered without the model)."""
    body = {"input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0,
            "input_extra": sibling_files(path, count)}
    r = http.post(f"{url}/infill", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"server answered {r.status_code} to the files sent: {r.text[:300]}")


def request_once(http: httpx.Client, url: str, model: str, method: str, pause: Pause, max_tokens: int,
                 cache: bool, healing: bool = True, memory: bool = False, ngram: bool = True) -> dict:
    body = {"model": model, "prompt": pause.prefix, "max_tokens": max_tokens, "temperature": 0, "stop": ["\n"],
            "stream": True, "method": method, "prefix_cache": cache, "token_healing": healing,
            "client_memory": memory, "ngram_cache": ngram}
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
            "accepted": text.rstrip() == pause.target, "es": edit_similarity(text.rstrip(), pause.target),
            "prompt_tokens": stats["prompt_tokens"], "cached_prompt_tokens": stats["cached_prompt_tokens"],
            "prefill_s": stats["prefill_s"], "context_chunks": stats["context_chunks"],
            "drafted": stats["drafted"], "accepted_drafts": stats["accepted"], "new_tokens": stats["new_tokens"],
            "decode_s": stats["decode_s"]}


def summarise(results: list[dict]) -> dict:
    lat = np.array([r["latency_s"] for r in results]) * 1000
    ttft = np.array([r["ttft_s"] for r in results]) * 1000

    def total(key: str) -> float:
        return sum(r[key] for r in results)

    prompt = total("prompt_tokens")
    return {
        "requests": len(results),
        "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
        "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "cached_prompt_share": total("cached_prompt_tokens") / prompt if prompt else 0.0,
        "mean_prompt_tokens": prompt / len(results),
        "mean_prefill_ms": 1000 * float(np.mean([r["prefill_s"] for r in results])),
        "accepted": total("accepted"),
        "accepted_share": float(np.mean([r["accepted"] for r in results])),
        "es": float(np.mean([r["es"] for r in results])),
        "mean_context_chunks": float(np.mean([r["context_chunks"] for r in results])),
        "decode_ms_per_token": 1000 * total("decode_s") / max(total("new_tokens"), 1),
        "accepted_per_drafted": total("accepted_drafts") / max(total("drafted"), 1),
    }


def replay(url: str, model: str, method: str, pauses: list[Pause], max_tokens: int, api_key: str | None = None,
           progress=None, healing: bool = True, context_files: int = 0, ngram_row: bool = False) -> dict:
    """`context_files` > 0: send each typed file's siblings first and add the no-context row;
    `ngram_row`: add the row without the cross-request n-gram cache."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    memory = bool(context_files)
    rows = {"cache on": (True, memory, True), "cache off": (False, memory, True)}  # prefix cache, memory, n-grams
    if context_files:
        rows["no context"] = (True, False, True)
    if ngram_row:
        rows["no n-gram cache"] = (True, memory, False)
    runs = {row: [] for row in rows}
    names = list(rows)
    with httpx.Client(headers=headers, timeout=600) as http:
        sent = set()
        for i, pause in enumerate(pauses):
            if context_files and pause.file not in sent:
                send_files(http, url, Path(pause.file), context_files)
                sent.add(pause.file)
            if i == 0:  # warm-up, not counted
                request_once(http, url, model, method, pause, max_tokens, False, healing, memory)
            for row in names[i % len(names):] + names[: i % len(names)]:  # each row goes first in turn
                cache, with_memory, ngram = rows[row]
                runs[row].append(request_once(http, url, model, method, pause, max_tokens, cache, healing,
                                              with_memory, ngram))
            if progress:
                progress(i + 1, len(pauses))
    summaries = {row: summarise(results) for row, results in runs.items()}
    on, off = summaries["cache on"], summaries["cache off"]
    same = float(np.mean([a["text"] == b["text"] for a, b in zip(runs["cache on"], runs["cache off"])]))
    return {
        "model": model, "method": method, "max_tokens": max_tokens, "token_healing": healing,
        "context_files": context_files, "files": sorted({p.file for p in pauses}), "pauses": len(pauses),
        "rows": summaries,
        "p50_speedup": off["p50_ms"] / on["p50_ms"] if on["p50_ms"] else 0.0,
        "identical_completions": same,
    }
