"""Editor-session replay: type real files line by line through the HTTP server, as an editor
would, and measure what a person waits for.

Two replays. The editor replay (`replay_editor`) sends, at each pause, the body an editor plugin
sends (llama.vim, llama.vscode: `/infill`; Continue: Ollama's `/api/generate`), built from their
literal bodies in tests/editor_bodies/ with the text fields cut from the file as the plugin cuts
them; it runs against any server that speaks the client's API (dyncomplete or llama-server).
llama.vim is replayed with its own suggestion cache and its speculative requests (`llama_vim`).

The line replay (`replay`, `--client line`): at each pause (the cursor at the start of a non-blank line) one streamed completion is requested
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

import dataclasses
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from . import llama_vim, llama_vim_typing
from .llama_vim import indent_of
from ..serve.forward import REPLICA_HEADER
from ..serve.suggestions import shown
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
        **token_medians([{"prompt_evaluated": r["prompt_tokens"] - r["cached_prompt_tokens"],
                          "prompt_reused": r["cached_prompt_tokens"], "generated": r["new_tokens"]} for r in results]),
    }


def token_medians(results: list[dict]) -> dict:
    """Per request, the median prompt tokens evaluated and reused (from a cache) and tokens
    generated; over the pauses that sent one (llama.vim shows some from its own cache)."""
    def median(key: str) -> float:
        values = [r[key] for r in results if r[key] is not None]
        return float(np.median(values)) if values else 0.0

    return {"prompt_tokens_evaluated": median("prompt_evaluated"), "prompt_tokens_reused": median("prompt_reused"),
            "tokens_generated": median("generated")}


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


# -- the editor replay: what llama.vim, llama.vscode and Continue send ------------------------------

REUSED_FIELD = "dyncomplete/reused"  # how dyncomplete says it answered from a kept answer (None: generated)
BODIES = Path(__file__).resolve().parents[2] / "tests" / "editor_bodies"  # the plugins' literal bodies
N_PREFIX, N_SUFFIX = llama_vim.N_PREFIX, llama_vim.N_SUFFIX  # llama.vim's and llama.vscode's (lines)
RING_CHUNK_LINES, RING_CHUNKS = 64, 16  # their ring_chunk_size and ring_n_chunks


@dataclass(frozen=True)
class Cursor:
    """The file at a pause, cut around the cursor as llama.vim's s:fim_ctx_local cuts it."""
    file: str
    line: int  # 1-based
    before: str  # the up to N_PREFIX lines above the cursor line, each ending in "\n"
    typed: str  # the cursor line up to the cursor
    after: str  # the cursor line's rest (not typed yet, so ""), "\n", the up to N_SUFFIX lines below, "\n"
    line_text: str  # the cursor line once typed


@dataclass(frozen=True)
class Request:
    body: dict
    target: str  # what the completion's first line should be
    following: tuple[str, ...] = ()  # the file's lines after the cursor line: what further lines should be
    drops_leading_blanks: bool = False  # the client shows the answer without its leading blanks


def following_lines(cursor: Cursor) -> tuple[str, ...]:
    return tuple(cursor.after.split("\n")[1:])


def down_columns(line: str) -> list[int]:
    """`down`: one pause per line, the cursor after the indentation an editor's auto-indent put there."""
    return [indent_of(line)]


def within_columns(line: str) -> list[int]:
    """`within`: typing the line, pauses after the indentation and a third and two thirds into the rest."""
    indent, rest = indent_of(line), len(line) - indent_of(line)
    return sorted({indent, indent + rest // 3, indent + 2 * rest // 3})


PATTERNS: dict[str, Callable[[str], list[int]]] = {"down": down_columns, "within": within_columns}


def cursors_of(path: Path, pattern: str, start: float, count: int) -> list[Cursor]:
    """The pauses of up to `count` non-blank lines from the line at fraction `start` of the file onwards."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    out, typed_lines = [], 0
    for i in range(int(len(lines) * start), len(lines)):
        line = lines[i].rstrip()
        before = "\n".join(lines[max(0, i - N_PREFIX):i]) + "\n"
        if not line.strip() or not before.strip():
            continue  # nothing to complete, or nothing before the cursor
        after = "\n" + "\n".join(lines[i + 1:i + 1 + N_SUFFIX]) + "\n"
        out += [Cursor(str(path), i + 1, before, line[:column], after, line) for column in PATTERNS[pattern](line)]
        typed_lines += 1
        if typed_lines == count:
            break
    return out


def ring_chunks(path: Path) -> list[dict]:
    """llama.vim's ring buffer once the other .py files of `path`'s folder were opened: the first
    RING_CHUNK_LINES lines of each (by name), at most RING_CHUNKS, as `input_extra` records."""
    out = []
    for other in sorted(path.parent.glob("*.py")):
        lines = other.read_text(encoding="utf-8", errors="replace").splitlines()[:RING_CHUNK_LINES]
        if other != path and len(lines) >= 3 and len(out) < RING_CHUNKS:  # llama.vim skips chunks under 3 lines
            out.append({"text": "\n".join(lines) + "\n", "time": other.stat().st_mtime,
                        "filename": f"{path.parent.name}/{other.name}"})
    return out


def template(name: str) -> dict:
    return json.loads((BODIES / name).read_text())


def infill_request(template_name: str, cursor: Cursor, extra: list[dict], n_predict: int, n_indent: int,
                   keeps_indent: bool = False) -> Request:
    """Both llama plugins send a cursor line of only whitespace as an empty `prompt`. `keeps_indent`:
    the plugin shows the answer after the blanks already typed, without its own leading blanks."""
    prompt = cursor.typed if cursor.typed.strip() else ""
    body = template(template_name) | {"input_prefix": cursor.before, "input_suffix": cursor.after,
                                      "input_extra": extra, "prompt": prompt, "n_indent": n_indent,
                                      "n_predict": n_predict}
    kept = keeps_indent and not prompt
    target = cursor.line_text[len(cursor.typed):] if kept else cursor.line_text[len(prompt):]
    return Request(body, target, following_lines(cursor), drops_leading_blanks=kept)


def llama_vim_request(cursor: Cursor, extra: list[dict], n_predict: int, model: str) -> Request:
    """llama.vim: `n_indent` 0 on a line of only whitespace (the model writes the indentation,
    and the plugin takes off what is already there), else the line's indentation."""
    indent = indent_of(cursor.typed) if cursor.typed.strip() else 0
    return infill_request("llama_vim_infill.json", cursor, extra, n_predict, indent)


def llama_vscode_request(cursor: Cursor, extra: list[dict], n_predict: int, model: str) -> Request:
    """llama.vscode: `n_indent` is the indentation of the line's text up to the cursor, always
    (the server puts those blanks back before the cursor); on a line of only whitespace it shows
    the answer without leading blanks after the ones typed."""
    return infill_request("llama_vscode_infill.json", cursor, extra, n_predict, indent_of(cursor.typed), True)


def continue_request(cursor: Cursor, extra: list[dict], n_predict: int, model: str) -> Request:
    """Continue's Ollama provider: `prompt` is the text before the cursor, `suffix` the text after; no ring chunks."""
    body = template("continue_ollama_generate.json")
    body |= {"model": model, "prompt": cursor.before + cursor.typed, "suffix": cursor.after,
             "options": body["options"] | {"num_predict": n_predict}}
    return Request(body, cursor.line_text[len(cursor.typed):], following_lines(cursor))


def llama_vim_warm(extra: list[dict]) -> Request:
    """llama.vim's ring update (s:ring_update): the chunks sent on their own so the server caches them."""
    return Request(template("llama_vim_ring_update.json") | {"input_extra": extra}, "")


def llama_vscode_warm(extra: list[dict]) -> Request:
    """llama.vscode's cache-warming request (`n_predict` 0) with the chunks."""
    return Request(template("llama_vscode_warm.json") | {"input_extra": extra}, "")


def checked(r: httpx.Response, body: str) -> None:
    if r.status_code != 200:
        raise RuntimeError(f"server answered {r.status_code}: {body[:300]}")


def answer_field(data: dict, path: str):
    """A field of llama.cpp's answer, whole (`data["timings"]["prompt_n"]`) or cut down to the
    `response_fields` asked for, which names it by its path (`data["timings/prompt_n"]`)."""
    if path in data:
        return data[path]
    for key in path.split("/"):
        data = data[key]
    return data


def post_infill(http: httpx.Client, endpoint: str, request: Request) -> dict:
    """A whole (not streamed) `/infill` answer; the token counts from llama.cpp's fields, which
    dyncomplete fills the same way (`tokens_evaluated`: the prompt, `timings.prompt_n`: its part
    evaluated). Where the body asks for some fields only, as llama.vim's does, `tokens_evaluated`
    is asked for too: the replay reads it, the plugin does not."""
    body = request.body
    if body.get("response_fields"):
        body = body | {"response_fields": [*body["response_fields"], "tokens_evaluated", REUSED_FIELD]}
    started = time.perf_counter()
    r = http.post(endpoint, json=body)
    latency = time.perf_counter() - started
    checked(r, r.text)
    data = r.json()
    evaluated = answer_field(data, "timings/prompt_n")
    reused = data[REUSED_FIELD] if REUSED_FIELD in data else data.get("dyncomplete", {}).get("reused")
    return {"latency_s": latency, "ttft_s": None, "text": data["content"], "prompt_evaluated": evaluated,
            "prompt_reused": answer_field(data, "tokens_evaluated") - evaluated,
            "generated": answer_field(data, "timings/predicted_n"), "replica": r.headers.get(REPLICA_HEADER),
            "reused": reused}


def post_ollama(http: httpx.Client, endpoint: str, request: Request) -> dict:
    """A streamed (NDJSON) `/api/generate` answer; the token counts from dyncomplete's stats in the last line."""
    started = time.perf_counter()
    first, text, final = None, "", {}
    with http.stream("POST", endpoint, json=request.body) as r:
        checked(r, r.read().decode() if r.status_code != 200 else "")
        for line in r.iter_lines():
            if not line:
                continue
            final = json.loads(line)
            if final["response"] and first is None:
                first = time.perf_counter() - started
            text += final["response"]
    latency = time.perf_counter() - started
    stats = final["dyncomplete"]
    return {"latency_s": latency, "ttft_s": first if first is not None else latency, "text": text,
            "prompt_evaluated": stats["prompt_tokens"] - stats["cached_prompt_tokens"],
            "prompt_reused": stats["cached_prompt_tokens"], "generated": stats["new_tokens"],
            "replica": r.headers.get(REPLICA_HEADER), "reused": stats.get("reused")}


class Pauses:
    """What a client without a cache of its own does at each pause: send the request, show the answer."""

    def __init__(self, client: "Client", n_predict: int, model: str):
        self.client, self.n_predict, self.model = client, n_predict, model

    def pause(self, http: httpx.Client, endpoint: str, cursor: Cursor, extra: list[dict]) -> dict:
        request = self.client.request(cursor, extra, self.n_predict, self.model)
        return scored(self.client.send(http, endpoint, request), request)

    def held_back_s(self, paused_s: float, running_s: float) -> float:
        """How long a pause's request waits for the client's own requests that run `running_s`
        after the last answer showed, when the user pauses `paused_s` after it (none run here)."""
        return 0.0


def llama_vim_body(context: llama_vim.Context, extra: list[dict], n_predict: int, predict_ms: int) -> Request:
    """llama.vim's request for `context`, with its generation budget `predict_ms`."""
    return Request(template("llama_vim_infill.json") | {
        "input_prefix": context.prefix, "input_suffix": context.suffix, "input_extra": extra,
        "prompt": context.middle, "n_indent": context.indent, "n_predict": n_predict,
        "t_max_predict_ms": predict_ms}, "")


class LlamaVimPauses(Pauses):
    """llama.vim at each pause (`llama_vim`): the suggestion from its own cache where it has one
    (nothing sent, nothing waited for), else the request with its 250 ms budget; then, once the
    suggestion shows, the speculative request for the text with it accepted, and after a cache
    hit also the request for the pause itself (both in the background, while the user types;
    `background_s` says how long they took). A pause that comes before they are answered shows
    a cached suggestion at once, but its request waits for them (`llama_vim.held_back_s`)."""

    def __init__(self, client: "Client", n_predict: int, model: str):
        super().__init__(client, n_predict, model)
        self.cache, self.last_indent, self.files = llama_vim.SuggestionCache(), 0, {}

    def lines_of(self, file: str) -> list[str]:
        if file not in self.files:
            self.files[file] = Path(file).read_text(encoding="utf-8", errors="replace").splitlines()
        return self.files[file]

    def ask(self, http: httpx.Client, endpoint: str, context: llama_vim.Context, extra: list[dict],
            predict_ms: int) -> dict:
        self.last_indent = context.indent
        answer = post_infill(http, endpoint, llama_vim_body(context, extra, self.n_predict, predict_ms))
        self.cache.insert(context, answer["text"])
        return answer

    def held_back_s(self, paused_s: float, running_s: float) -> float:
        return llama_vim.held_back_s(paused_s, running_s)

    def pause(self, http: httpx.Client, endpoint: str, cursor: Cursor, extra: list[dict]) -> dict:
        lines, y = self.lines_of(cursor.file), cursor.line - 1
        here = llama_vim.local_context(lines, y, cursor.typed)
        request = self.client.request(cursor, extra, self.n_predict, self.model)  # the target lines
        started = time.perf_counter()
        cached = self.cache.suggestion(here)
        if cached is None:
            answer = self.ask(http, endpoint, here, extra, llama_vim.FIRST_PREDICT_MS)
        else:
            answer = {"latency_s": time.perf_counter() - started, "ttft_s": None, "text": cached,
                      "prompt_evaluated": None, "prompt_reused": None, "generated": None, "replica": None,
                      "reused": None}
        started, sent = time.perf_counter(), 0
        accepted = llama_vim.shown_lines(answer["text"], cursor.typed, lines, y)
        after = llama_vim.local_context(lines, y, cursor.typed, accepted, self.last_indent)
        for context, predict_ms in ((after, llama_vim.SPECULATIVE_PREDICT_MS), (here, llama_vim.FIRST_PREDICT_MS)):
            if not self.cache.holds(context):
                self.ask(http, endpoint, context, extra, predict_ms)
                sent += 1
        return scored(answer, request) | {"from_cache": cached is not None, "background_s": time.perf_counter() - started,
                                          "background_requests": sent}


@dataclass(frozen=True)
class Client:
    request: Callable[[Cursor, list[dict], int, str], Request]  # (cursor, ring chunks, n_predict, model)
    warm: Callable[[list[dict]], Request] | None  # sent once per typed file, before its pauses
    route: str  # the API the client calls
    send: Callable[[httpx.Client, str, Request], dict]  # (http, endpoint, request) -> the answer
    pauses: type[Pauses] = Pauses  # what the client does at a pause


CLIENTS = {
    "llama-vim": Client(llama_vim_request, llama_vim_warm, "/infill", post_infill, LlamaVimPauses),
    "llama-vscode": Client(llama_vscode_request, llama_vscode_warm, "/infill", post_infill),
    "continue": Client(continue_request, None, "/api/generate", post_ollama),
}


def scored(answer: dict, request: Request) -> dict:
    """The answer as the client shows it (`text`), its first line's exactness and ES; and, for a
    suggestion taken whole, how many of its lines are the file's (from the first, up to the first
    that is not) and how many it has."""
    text = answer["text"].lstrip(" \t") if request.drops_leading_blanks else answer["text"]
    lines = text.split("\n") if text.strip() else []
    right = 0
    for got, want in zip(lines, (request.target, *request.following)):
        if got.rstrip() != want.rstrip():
            break
        right += 1
    first_line = lines[0].rstrip() if lines else ""
    return answer | {"text": text, "accepted": first_line == request.target.rstrip(),
                     "es": edit_similarity(first_line, request.target.rstrip()),
                     "lines_right": right, "lines_suggested": len(lines)}


def takes(result: dict) -> bool:
    """Whether the user takes a suggestion whole: one line, the rest of the cursor's line."""
    return result["accepted"] and result["lines_suggested"] == 1


def taken(cursor: Cursor, text: str) -> Cursor:
    """The cursor after a suggestion of the line's rest was taken: at the end of the line, the
    suggestion inserted as the server expects the plugins to insert it (after blanks only, without
    its own leading blanks up to as many: llama.vim's answer holds the whole indentation)."""
    return dataclasses.replace(cursor, typed=cursor.typed + shown(cursor.typed, text))


def replay_editor(url: str, model: str, client: str, cursors: list[Cursor], n_predict: int,
                  headers: dict | None = None, progress=None, accept_ms: int = 0, think_ms: int = 0,
                  seed: int = 0, keystroke_ms: int = 0) -> list[dict]:
    """Every cursor's request as `client` sends it, after a warm-up request that is not counted;
    a client with a warming request sends it once per typed file, before that file's pauses.
    `accept_ms` > 0: a suggestion the user `takes` is taken that long after the pause's background
    requests are answered (the wait for them is not counted), and the editor asks again at the end
    of the line (llama.vim and llama.vscode ask whenever the cursor moves);
    the line's later pauses are then skipped (it is typed). `think_ms` > 0: the user types between
    pauses for 0.5-1.5x `think_ms` (uniform, from `seed`) after an answer shows, and starts after a
    random part of one `think_ms`, so that editors typing at once do not keep in step; the next
    pause comes then; a request it asks waits for the client's own background requests as the
    client does (`Pauses.held_back_s`), and `waited_s` counts from the pause to the answer. 0 asks
    again as soon as the background requests are answered (a closed loop: the server never idles).
    `keystroke_ms` > 0 (llama-vim only): every character typed between the pauses, as `replay_typing`."""
    check_keystrokes(client, keystroke_ms, accept_ms, think_ms)
    if keystroke_ms:
        return replay_typing(url, model, cursors, n_predict, headers, progress, keystroke_ms, seed)
    spec = CLIENTS[client]
    chunks = {file: ring_chunks(Path(file)) for file in sorted({c.file for c in cursors})}
    endpoint, results, pauses = f"{url}{spec.route}", [], spec.pauses(spec, n_predict, model)
    taken_line = None  # a line whose suggestion was taken: its later pauses are not typed
    typing, replay_start = random.Random(seed), time.perf_counter()
    held_back = 0.0  # how long the next pause's request waits for this editor's background requests
    time.sleep(typing.uniform(0, think_ms / 1000))
    with httpx.Client(headers=headers or {}, timeout=600) as http:
        for i, cursor in enumerate(cursors):
            if (cursor.file, cursor.line) == taken_line:
                continue
            if spec.warm and (i == 0 or cursor.file != cursors[i - 1].file):  # its answer is not read
                r = http.post(endpoint, json=spec.warm(chunks[cursor.file]).body)
                checked(r, r.text)
            if i == 0:  # one token: a longer warm-up would leave the server the first pause's answer to reuse
                spec.send(http, endpoint, spec.request(cursor, chunks[cursor.file], 1, model))
            asked = time.perf_counter() - replay_start
            result = pauses.pause(http, endpoint, cursor, chunks[cursor.file]) | {
                "pause": i, "where": f"{cursor.file}:{cursor.line}:{len(cursor.typed)}", "after_accept": False,
                "at_s": asked}
            result["held_back_s"] = 0.0 if result.get("from_cache") else held_back
            result["waited_s"] = result["held_back_s"] + result["latency_s"]
            results.append(result)
            if accept_ms and takes(result):
                time.sleep(accept_ms / 1000)
                asked = time.perf_counter() - replay_start
                result = pauses.pause(http, endpoint, taken(cursor, result["text"]), chunks[cursor.file])
                results.append(result | {"pause": i, "after_accept": True, "at_s": asked, "held_back_s": 0.0,
                                         "waited_s": result["latency_s"]})
                taken_line = (cursor.file, cursor.line)
            typed_s = typing.uniform(0.5, 1.5) * think_ms / 1000
            running_s = result.get("background_s", 0.0)
            held_back = pauses.held_back_s(typed_s, running_s) if think_ms else 0.0
            results[-1]["think_s"] = max(0.0, typed_s + held_back - running_s)
            time.sleep(results[-1]["think_s"])
            if progress:
                progress(i + 1, len(cursors))
    return results


def check_keystrokes(client: str, keystroke_ms: int, accept_ms: int, think_ms: int) -> None:
    """Refuse a keystroke replay (`keystroke_ms` > 0) that is not llama.vim's alone."""
    if keystroke_ms and (client != "llama-vim" or accept_ms or think_ms):
        raise ValueError("--keystroke-ms replays llama.vim's keystrokes: for --client llama-vim only, "
                         "without --think-ms and --accept-ms")


SHOW_LIMIT_S = 120.0  # a pause whose suggestion has not shown by then fails the replay


def replay_typing(url: str, model: str, cursors: list[Cursor], n_predict: int, headers: dict | None,
                  progress, keystroke_ms: int, seed: int) -> list[dict]:
    """llama.vim while its user types every character between the pauses (`llama_vim_typing`),
    0.5-1.5x `keystroke_ms` apart (uniform, from `seed`), from the moment the suggestion of the
    pause before shows; a pause on another line types the rest of the line before it, then Enter.
    `waited_s` (and `latency_s`) count from a pause's last keystroke to the suggestion shown there;
    `held_back_s` is how long the pause's own request waited for an earlier one (0 where none was
    sent after the pause); `background_requests`, the other requests sent since the pause before."""
    spec = CLIENTS["llama-vim"]
    chunks = {file: ring_chunks(Path(file)) for file in sorted({c.file for c in cursors})}
    endpoint, files, results = f"{url}{spec.route}", {}, []
    keys, before, replay_start = random.Random(seed), None, time.perf_counter()
    time.sleep(keys.uniform(0, 1))  # editors typing at once do not keep in step
    with httpx.Client(headers=headers or {}, timeout=600) as http:
        extra = {}  # "now": the ring chunks of the file being typed, which every request sends
        editor = llama_vim_typing.TypingEditor(
            lambda context, predict_ms: post_infill(http, endpoint, llama_vim_body(
                context, extra["now"], n_predict, predict_ms)))
        try:
            shown_s = time.perf_counter()
            for i, cursor in enumerate(cursors):
                if cursor.file not in files:
                    text = Path(cursor.file).read_text(encoding="utf-8", errors="replace")
                    files[cursor.file] = tuple(text.splitlines())
                lines = files[cursor.file]
                if i == 0:  # one token, as the pause replay warms up
                    spec.send(http, endpoint, spec.request(cursor, chunks[cursor.file], 1, model))
                if i and cursor.file != cursors[i - 1].file:
                    editor.settle(SHOW_LIMIT_S)
                extra["now"] = chunks[cursor.file]
                pause = llama_vim_typing.At(lines, cursor.line - 1, cursor.typed)
                line_text = cursors[i - 1].line_text if i else None
                at_s = shown_s
                for at in llama_vim_typing.typed_between(lines, before, pause, line_text):
                    at_s += keys.uniform(0.5, 1.5) * keystroke_ms / 1000
                    editor.run_until(at_s)
                    paused_s = time.perf_counter()
                    editor.move(at)
                shown = editor.wait_shown(pause, SHOW_LIMIT_S)
                previous_shown_s, shown_s = shown_s, time.perf_counter()
                waited = shown_s - paused_s
                own = shown.answer[1] if shown.answer is not None and shown.answer[0] >= paused_s else None
                answer = own if own is not None else {
                    "ttft_s": None, "text": shown.content, "prompt_evaluated": None, "prompt_reused": None,
                    "generated": None, "replica": None, "reused": None}
                request = spec.request(cursor, chunks[cursor.file], n_predict, model)
                held = editor.held_back_s(editor.context(pause, None), paused_s) if own is not None else 0.0
                results.append(scored(answer | {"latency_s": waited}, request) | {
                    "pause": i, "where": f"{cursor.file}:{cursor.line}:{len(cursor.typed)}", "after_accept": False,
                    "at_s": paused_s - replay_start, "from_cache": own is None, "held_back_s": held,
                    "waited_s": waited, "think_s": paused_s - previous_shown_s,
                    "background_s": editor.busy_s(previous_shown_s, paused_s),
                    "background_requests": editor.requests_between(previous_shown_s, shown_s) - (own is not None)})
                before = pause
                if progress:
                    progress(i + 1, len(cursors))
            editor.settle(SHOW_LIMIT_S)
        finally:
            editor.close()
    return results


def server_counters(http: httpx.Client, url: str) -> dict | None:
    """dyncomplete's /health counters that a replay's rows show (None from another server)."""
    try:
        health = http.get(f"{url}/health").json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(health, dict) or "prefix_cache" not in health:
        return None
    batching = health["worker"].get("batching", {})
    return {"hits": health["prefix_cache"]["hits"], "lookups": health["prefix_cache"]["lookups"],
            "tokens": health["worker"].get("tokens_generated", 0),
            "reused": sum(n for key, n in health["worker"].items() if key.startswith("reused_")),
            "drafted_rows": batching.get("drafted_rows", 0), "drafted_rows_cut": batching.get("drafted_rows_cut", 0),
            "batch_sizes": {int(k): v for k, v in batching.get("batch_sizes", {}).items()},
            "batch_seconds": {int(k): v for k, v in batching.get("batch_seconds", {}).items()},
            "busy_s": batching.get("busy_s", 0.0)}


def served_columns(before: dict | None, after: dict | None, requests: int, wall_s: float) -> dict:
    """Completions the server answered per second of the replay, and over the replay, where the
    server reports them, the tokens it generated per second, its prefix-cache hits per lookup, the
    share of the requests it answered from kept answers (without the model), the median sequences
    per batched call, the mean milliseconds of a batched call by its sequences, the share of the
    replay its model thread was busy, and the drafted rows its batches verified and cut."""
    out = {"completions_per_s": requests / wall_s, "server_requests": requests, "wall_s": wall_s,
           "tokens_per_s": None, "prefix_cache_hit_share": None, "server_reused_share": None, "batch_p50": None,
           "batch_sizes": None, "batch_ms": None, "model_busy_share": None, "drafted_rows": None,
           "drafted_rows_cut": None}
    if before is None or after is None:
        return out
    out["server_reused_share"] = (after.get("reused", 0) - before.get("reused", 0)) / requests if requests else None
    lookups = after["lookups"] - before["lookups"]
    out["prefix_cache_hit_share"] = (after["hits"] - before["hits"]) / lookups if lookups else None
    out["tokens_per_s"] = (after["tokens"] - before["tokens"]) / wall_s
    for key in ("drafted_rows", "drafted_rows_cut"):
        out[key] = after[key] - before[key]
    sizes = {k: n - before["batch_sizes"].get(k, 0) for k, n in after["batch_sizes"].items()}
    sizes = {k: n for k, n in sorted(sizes.items()) if n}
    if sizes:
        out["batch_sizes"] = sizes
        out["batch_p50"] = float(np.median(np.repeat(list(sizes), list(sizes.values()))))
        out["batch_ms"] = {k: 1000 * (after["batch_seconds"].get(k, 0) - before["batch_seconds"].get(k, 0)) / n
                           for k, n in sizes.items()}
        out["model_busy_share"] = (after["busy_s"] - before["busy_s"]) / wall_s
    return out


def replay_editors(url: str, model: str, client: str, cursors: list[Cursor], n_predict: int,
                   headers: dict | None = None, editors: int = 1, progress=None,
                   accept_ms: int = 0, think_ms: int = 0, keystroke_ms: int = 0) -> tuple[list[dict], dict]:
    """`editors` editors typing at once (`replay_editor` each, in its own thread), each its own
    files (round-robin over the cursors' files in order) and its own X-Client-Id. Returns the
    results, editor by editor, and `served_columns` (its requests: every pause the server answered,
    background and warm-up requests included)."""
    files = list(dict.fromkeys(c.file for c in cursors))
    if not 1 <= editors <= len(files):
        raise ValueError(f"--concurrent {editors} needs 1 to {len(files)} editors: one file at least each")
    groups = [[c for c in cursors if files.index(c.file) % editors == k] for k in range(editors)]
    done, lock = [0], threading.Lock()

    def tick(_done, _total):
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], len(cursors))

    def editor(k: int) -> list[dict]:
        own = (headers or {}) | ({"X-Client-Id": f"editor-{k}"} if editors > 1 else {})
        return [r | {"editor": k} for r in replay_editor(url, model, client, groups[k], n_predict, own, tick,
                                                         accept_ms, think_ms, seed=k, keystroke_ms=keystroke_ms)]

    with httpx.Client(headers=headers or {}, timeout=60) as http:
        before = server_counters(http, url)
        started = time.perf_counter()
        with ThreadPoolExecutor(editors) as pool:
            results = [r for rs in pool.map(editor, range(editors)) for r in rs]
        wall = time.perf_counter() - started
        after = server_counters(http, url)
    requests = editors + sum(not r.get("from_cache", False) for r in results) + \
        sum(r.get("background_requests", 0) for r in results)
    return results, served_columns(before, after, requests, wall)


def client_cache_columns(results: list[dict]) -> dict:
    """llama.vim's rows: the pauses shown from its own cache, the latency of those it asked the
    server for, the time from each pause to its suggestion (with the wait for the editor's own
    background requests) and the background requests after each pause."""
    if "from_cache" not in results[0]:
        return {}
    asked = [1000 * r["latency_s"] for r in results if not r["from_cache"]]
    waited = [1000 * r["waited_s"] for r in results]
    return {"from_client_cache": float(np.mean([r["from_cache"] for r in results])),
            "p50_asked_ms": float(np.percentile(asked, 50)) if asked else None,
            "waited_p50_ms": float(np.percentile(waited, 50)), "waited_p95_ms": float(np.percentile(waited, 95)),
            "held_back_share": float(np.mean([r["held_back_s"] > 0 for r in results])),
            "background_ms": 1000 * float(np.median([r["background_s"] for r in results])),
            "background_requests": float(np.mean([r["background_requests"] for r in results]))}


def prompt_reused_share(results: list[dict]) -> float | None:
    """Of the prompt tokens of the pauses that asked a server, the share it took from its cache:
    read from the answers, so it holds for any server and for replicas behind one address."""
    known = [r for r in results if r["prompt_reused"] is not None and r["prompt_evaluated"] is not None]
    total = sum(r["prompt_reused"] + r["prompt_evaluated"] for r in known)
    return sum(r["prompt_reused"] for r in known) / total if total else None


def home_replica_share(results: list[dict]) -> float | None:
    """Behind `serve --ray`: of the pauses answered by a replica, the share each editor got from
    the replica that answered it most (1.0: every editor stayed on one replica)."""
    by_editor: dict[int, Counter] = {}
    for r in results:
        if r.get("replica"):
            by_editor.setdefault(r["editor"], Counter())[r["replica"]] += 1
    total = sum(sum(c.values()) for c in by_editor.values())
    return sum(max(c.values()) for c in by_editor.values()) / total if total else None


def reused_columns(results: list[dict]) -> dict:
    """The answers the server gave from kept answers (serve/suggestions.py), and the requests made
    after a suggestion was taken: how many, their p50, the share the prefetch answered."""
    after = [r for r in results if r["after_accept"]]
    out = {"reused_share": float(np.mean([r.get("reused") is not None for r in results])), "after_accept": len(after)}
    if after:
        out |= {"after_accept_p50_ms": 1000 * float(np.median([r["latency_s"] for r in after])),
                "prefetch_hits": float(np.mean([r.get("reused") == "prefetch" for r in after]))}
    return out


def summarise_editor(results: list[dict]) -> dict:
    """A row of the editor replay: latency over every request the editor waited for, quality over
    the pauses (not the requests after a suggestion was taken); time to first token is None for
    answers that are not streamed."""
    lat = np.array([r["latency_s"] for r in results]) * 1000
    ttft = np.array([r["ttft_s"] for r in results if r["ttft_s"] is not None]) * 1000
    waited, results = results, [r for r in results if not r["after_accept"]]
    return client_cache_columns(results) | reused_columns(waited) | {
        "requests": len(waited),
        "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
        "ttft_p50_ms": float(np.percentile(ttft, 50)) if len(ttft) else None,
        "ttft_p95_ms": float(np.percentile(ttft, 95)) if len(ttft) else None,
        **token_medians(waited),
        "prompt_reused_share": prompt_reused_share(waited),
        "home_replica_share": home_replica_share(waited),
        "replicas": len({r["replica"] for r in results if r.get("replica")}) or None,
        "accepted": sum(r["accepted"] for r in results),
        "accepted_share": float(np.mean([r["accepted"] for r in results])),
        "es": float(np.mean([r["es"] for r in results])),
        "lines_right": float(np.mean([r["lines_right"] for r in results])),
        "lines_suggested": float(np.median([r["lines_suggested"] for r in results])),
    }
