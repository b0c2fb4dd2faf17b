"""The editor plugins' own APIs: llama.cpp's `POST /infill` (llama.vscode, llama.vim) and Ollama's
`POST /api/generate` with `suffix` (Continue's `ollama` provider), with `/api/tags`, `/api/show`
and `/api/version`, which Ollama clients call to list models and to learn whether a model fills
the middle (Continue looks for `.Suffix` in `/api/show`'s template).

Each body becomes the same `CompletionRequest` as a `/v1/completions` body, with the editor guards
(`engine/guards.py`) on unless `"editor_guards": false`, and each response keeps the
`dyncomplete` object (per-token layers, drafts) as an extra field the clients ignore. Requests
that only warm llama.cpp's cache (`n_predict` 0, or no text around the cursor: llama.vscode and
llama.vim send them while the user moves around) are answered at once, without the model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from ..engine import EditorGuards
from ..engine.repo_context import RepoContext
from ..engine.stats import Stats
from .request import (ApiError, CompletionRequest, allowed_method, check_text, client_memory, ngram_cache,
                      sampling_params, shown, typed)

# llama.cpp fields we accept and do not use (its own sampler chain, LoRA, prompt-time cap, slots).
INFILL_IGNORED = {"samplers", "t_max_prompt_ms", "lora", "id_slot", "model", "n_probs",
                  "min_p", "top_k", "typical_p", "repeat_penalty", "repeat_last_n", "timings_per_token"}
INFILL_KNOWN = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "t_max_predict_ms", "n_indent",
                "stream", "cache_prompt", "stop", "temperature", "top_p", "seed", "method", "token_healing",
                "editor_guards", "client_memory", "ngram_cache", "response_fields", *INFILL_IGNORED}
OLLAMA_IGNORED = {"keep_alive", "context"}  # the model stays loaded; no conversation memory
OLLAMA_KNOWN = {"model", "prompt", "suffix", "raw", "stream", "options", "method", "prefix_cache", "token_healing",
                "editor_guards", "client_memory", "ngram_cache", "system", "template", "images", "format",
                *OLLAMA_IGNORED}
OLLAMA_OPTIONS = {"num_predict", "temperature", "top_p", "stop", "num_ctx", "seed", "top_k", "min_p",
                  "repeat_penalty", "repeat_last_n", "num_thread", "num_gpu", "use_mmap", "mirostat", "num_keep"}
# What Ollama's /api/show gives as a FIM model's template: Continue sends a suffix when it holds `.Suffix`.
FIM_TEMPLATE = "{{- if .Suffix }}<prefix>{{ .Prompt }}<suffix>{{ .Suffix }}<middle>{{- else }}{{ .Prompt }}{{- end }}"
OLLAMA_VERSION = "0.5.0"  # an Ollama version whose /api/generate takes `suffix`


def _max_tokens(value, limit: int) -> int:
    """llama.cpp's `n_predict` and Ollama's `num_predict`, capped at the server's limit as llama.cpp
    caps them (clients send large values: Continue its 4096 default); negative: the limit."""
    return limit if value is None or value < 0 else min(value, limit)


def _extra(obj: dict) -> RepoContext | None:
    extra = typed(obj, "input_extra", (list,), "a list of {filename, text} objects", [])
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise ApiError(400, f"input_extra[{i}] must be an object with a string text and filename", "input_extra")
        check_text(chunk["text"], "input_extra")
    # llama.cpp lays the chunks out in the order sent, the last next to the file, and keeps the
    # last ones when space is short; RepoContext wants the most important first
    return RepoContext.from_records(extra[::-1]) if extra else None


def _guards(obj: dict, prefix: str, suffix: str, time_limit_ms: int = 0, n_indent: int = 0) -> EditorGuards | None:
    """All the guards, or with `"editor_guards": false` only llama.cpp's own (time cap, n_indent)."""
    limit = time_limit_ms / 1000 if time_limit_ms > 0 else None
    if typed(obj, "editor_guards", (bool,), "a boolean", True):
        return EditorGuards.for_cursor(prefix, suffix, limit, n_indent)
    return EditorGuards(limit, n_indent) if limit or n_indent else None


def cursor_indent(input_prefix: str, input_suffix: str, n_indent: int) -> str:
    """The blanks before the cursor that the client left out. llama.vscode sends a cursor line
    holding only blanks as `prompt: ""` (and strips leading blanks from the answer), with their
    width as `n_indent`: where nothing follows the cursor on its line, that line was exactly
    `n_indent` blanks, which tell the model where the cursor is (without them Qwen2.5-Coder writes
    a new function there). Tabs when the last indented line of the prefix starts with one."""
    if n_indent <= 0 or not input_prefix.endswith("\n") or input_suffix.partition("\n")[0].strip():
        return ""
    indented = [line for line in input_prefix.splitlines() if line[:1] in (" ", "\t")]
    return ("\t" if indented and indented[-1][0] == "\t" else " ") * n_indent


def parse_infill(obj: dict, model_name: str, methods: Sequence[str], max_tokens_limit: int) -> CompletionRequest:
    """llama.cpp's `/infill` body. The text before the cursor is `input_prefix` + `prompt` (the
    plugins send the cursor's line up to the cursor as `prompt`)."""
    texts = {}
    for key in ("input_prefix", "input_suffix", "prompt"):
        texts[key] = check_text(typed(obj, key, (str,), "a string", ""), key)
    n_predict = typed(obj, "n_predict", (int,), "an integer")
    t_max = typed(obj, "t_max_predict_ms", (int, float), "a number", 0)
    n_indent = typed(obj, "n_indent", (int,), "an integer", 0)
    if n_indent < 0:
        raise ApiError(400, f"n_indent must be >= 0, got {shown(n_indent)}", "n_indent")
    prompt = texts["prompt"] or cursor_indent(texts["input_prefix"], texts["input_suffix"], n_indent)
    prefix, suffix = texts["input_prefix"] + prompt, texts["input_suffix"]
    max_tokens = _max_tokens(n_predict, max_tokens_limit)
    params = sampling_params(obj, max(max_tokens, 1), _guards(obj, prefix, suffix, t_max, n_indent))
    return CompletionRequest(
        model=model_name, prefix=prefix, suffix=suffix, params=params, method=allowed_method(obj, methods),
        stream=typed(obj, "stream", (bool,), "a boolean", False), client_id=None,
        prefix_cache=typed(obj, "cache_prompt", (bool,), "a boolean", True),
        ignored_fields=sorted(set(obj) - INFILL_KNOWN | set(obj) & INFILL_IGNORED),
        context=_extra(obj), warm_only=max_tokens == 0 or not (prefix or suffix),
        client_memory=client_memory(obj, True), ngram_cache=ngram_cache(obj))


def response_fields(obj: dict) -> list[str]:
    """llama.cpp's `response_fields` (llama.vim sends them): the answer holds only these paths."""
    fields = typed(obj, "response_fields", (list,), "a list of strings", [])
    if not all(isinstance(field, str) for field in fields):
        raise ApiError(400, "response_fields must be a list of strings", "response_fields")
    return fields


def only_fields(paths: list[str], answer: dict) -> dict:
    """As llama.cpp answers with `response_fields`: each path that exists ("timings/prompt_n"),
    under its own name, flat; the whole answer when no path is asked for."""
    if not paths:
        return answer
    out = {}
    for path in paths:
        value = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def ollama_model_matches(name: str, model_name: str) -> bool:
    """Ollama names a model `family:size` (Continue maps `qwen2.5-coder-0.5b` to
    `qwen2.5-coder:0.5b`) and `:latest` when no tag is given."""
    name = name.removesuffix(":latest")
    return name == model_name or name.replace(":", "-") == model_name


def parse_generate(obj: dict, model_name: str, methods: Sequence[str], max_tokens_limit: int,
                   context_budget: int) -> CompletionRequest:
    """Ollama's `/api/generate` body (`stream` defaults to true there)."""
    model = typed(obj, "model", (str,), "a string")
    if model is None:
        raise ApiError(400, "model is required", "model")
    if not ollama_model_matches(model, model_name):
        raise ApiError(404, f"model {shown(model, 80)} is not served here; this server serves {model_name!r}",
                       "model", "model_not_found")
    for key in ("system", "template", "images", "format"):
        if obj.get(key):
            raise ApiError(400, f"{key} is not supported (code completion takes prompt and suffix)", key)
    prefix = check_text(typed(obj, "prompt", (str,), "a string", ""), "prompt")
    suffix = check_text(typed(obj, "suffix", (str,), "a string", ""), "suffix")
    typed(obj, "raw", (bool,), "a boolean")  # no template is applied either way
    options = typed(obj, "options", (dict,), "an object", {})
    max_tokens = _max_tokens(typed(options, "num_predict", (int,), "an integer"), max_tokens_limit)
    num_ctx = typed(options, "num_ctx", (int,), "an integer")
    if num_ctx is not None and num_ctx < 8:
        raise ApiError(400, f"options.num_ctx must be at least 8, got {shown(num_ctx)}", "options.num_ctx")
    params = sampling_params(options, max(max_tokens, 1), _guards(obj, prefix, suffix), "options.")
    params = dataclasses.replace(params, token_healing=typed(obj, "token_healing", (bool,), "a boolean", True))
    ignored = sorted(set(obj) - OLLAMA_KNOWN | set(obj) & OLLAMA_IGNORED) + \
        [f"options.{k}" for k in sorted(set(options) - OLLAMA_OPTIONS)]
    return CompletionRequest(
        model=model, prefix=prefix, suffix=suffix or None, params=params, method=allowed_method(obj, methods),
        stream=typed(obj, "stream", (bool,), "a boolean", True), client_id=None,
        prefix_cache=typed(obj, "prefix_cache", (bool,), "a boolean", True), ignored_fields=ignored,
        budget=min(num_ctx, context_budget) if num_ctx else None,
        warm_only=max_tokens == 0 or not (prefix or suffix), client_memory=client_memory(obj, True),
        ngram_cache=ngram_cache(obj))


# -- responses ------------------------------------------------------------------------------------

LLAMA_STOP_TYPES = {"eos": "eos", "stop": "word"}  # any other end is llama.cpp's "limit"


def infill_timings(s: Stats) -> dict:
    prompt_n, prompt_ms, predicted_ms = s.prompt_tokens - s.cached_prompt_tokens, s.prefill_s * 1e3, s.decode_s * 1e3
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / s.prefill_s if s.prefill_s else 0.0,
            "predicted_n": s.new_tokens, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / s.new_tokens if s.new_tokens else 0.0,
            "predicted_per_second": s.new_tokens / s.decode_s if s.decode_s else 0.0}


def infill_final(model_name: str, req: CompletionRequest, budget: int, text: str, result: dict | None,
                 extra: dict) -> dict:
    """llama.cpp's final `/infill` object (streamed: `content` is "" and the text came before)."""
    s = result["completion"].stats if result else Stats()
    stopped_by = result["stats"]["stopped_by"] if result else "limit"
    return {"index": 0, "content": text, "tokens": [], "id_slot": 0, "stop": True, "model": model_name,
            "tokens_predicted": s.new_tokens, "tokens_evaluated": s.prompt_tokens,
            "generation_settings": {"n_ctx": budget, "n_predict": req.params.max_new_tokens,
                                    "temperature": req.params.temperature, "top_p": req.params.top_p,
                                    "stop": list(req.params.stop), "stream": req.stream},
            "prompt": "", "has_new_line": "\n" in text,
            "truncated": bool(result and result["stats"]["truncated_prompt"]),
            "stop_type": LLAMA_STOP_TYPES.get(stopped_by, "limit"), "stopping_word": "",
            "tokens_cached": s.prompt_tokens, "timings": infill_timings(s),
            **({"dyncomplete": {**result["stats"], **extra}} if result else {})}


def infill_chunk(text: str, tokens_predicted: int) -> dict:
    return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1,
            "tokens_predicted": tokens_predicted, "tokens_evaluated": 0}


def iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def ollama_final(model: str, text: str, result: dict | None, finish: str, started: float, extra: dict) -> dict:
    """Ollama's last `/api/generate` object; durations in nanoseconds."""
    s = result["completion"].stats if result else Stats()
    body = {"model": model, "created_at": iso_now(), "response": text, "done": True, "done_reason": finish,
            "context": [], "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": s.prompt_tokens, "prompt_eval_duration": int(s.prefill_s * 1e9),
            "eval_count": s.new_tokens, "eval_duration": int(s.decode_s * 1e9)}
    if result:
        body["dyncomplete"] = {**result["stats"], **extra}
    return body


def ollama_chunk(model: str, text: str) -> dict:
    return {"model": model, "created_at": iso_now(), "response": text, "done": False}


def ollama_details(model) -> dict:
    return {"format": "safetensors", "family": getattr(model.config, "model_type", ""), "parameter_size": "",
            "quantization_level": ""}


def ollama_tags(model) -> dict:
    return {"models": [{"name": model.name, "model": model.name, "modified_at": "1970-01-01T00:00:00Z", "size": 0,
                        "digest": "", "details": ollama_details(model)}]}


def ollama_show(model, fim: bool) -> dict:
    """A FIM model's template names `.Suffix` (Continue then sends the suffix; otherwise it puts
    its own template's text in `prompt`); "insert" is Ollama's capability for a suffix."""
    return {"template": FIM_TEMPLATE if fim else "{{ .Prompt }}", "parameters": "", "modelfile": "",
            "details": ollama_details(model), "model_info": {},
            "capabilities": ["completion", "insert"] if fim else ["completion"]}
