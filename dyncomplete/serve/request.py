"""Validation of a `/v1/completions` body into a `CompletionRequest`, with OpenAI-style errors.

Written by hand rather than with a schema library so that every refusal names the field and
says what is allowed, in the shape OpenAI clients already parse:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ..engine import EditorGuards, GenerationParams
from ..engine.repo_context import RepoContext
from ..methods import parse_method

MAX_STOP_STRINGS = 16
# A prefix longer than budget x this many characters is cut before it is tokenised: code averages
# 3-4 characters a token, so the cut text still holds several times the budget, and tokenising
# it stays quick whatever the body's size (a 2 MiB prompt tokenised whole took seconds of the
# only worker and hundreds of MiB).
CHARS_PER_TOKEN = 16
MIN_TOP_P = 1e-30  # smaller values round to 0 in float32 and would keep no token; this keeps the top one
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
# OpenAI fields we accept only at their neutral value (anything else would be silently wrong).
NEUTRAL = {"n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, 0),
           "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {})}
KNOWN = {"model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "stop", "stream", "seed",
         "user", "method", "prefix_cache", "token_healing", "stream_options", "editor_guards", "client_memory",
         "ngram_cache", *NEUTRAL}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class CompletionRequest:
    model: str
    prefix: str
    suffix: str | None
    params: GenerationParams
    method: str
    stream: bool
    client_id: str | None
    prefix_cache: bool
    ignored_fields: list[str]
    context: RepoContext | None = None  # /infill's input_extra
    budget: int | None = None  # a smaller context budget than the server's (Ollama's num_ctx)
    warm_only: bool = False  # an editor's cache-warming request: answered without the model
    client_memory: bool = False  # add context retrieved from the files this sender sent before
    ngram_cache: bool = True  # n-gram drafting may copy this sender's earlier completions

    def ignored(self) -> dict:
        """What the response's `dyncomplete` object says about fields this server does not use."""
        return {"ignored_fields": self.ignored_fields} if self.ignored_fields else {}


def decode_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except ValueError:  # an integer over Python's 4300-digit conversion limit
        raise ApiError(400, "request body holds a number with too many digits", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "request body nests arrays or objects too deeply", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return obj


def check_text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} contains an unpaired surrogate (not valid Unicode)", param, "invalid_utf8") from None
    return value


def shown(value, limit: int = 40) -> str:
    """A client's value in an error message, cut short (a number may have thousands of digits)."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def typed(obj: dict, key: str, types: tuple, what: str, default=None):
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise ApiError(400, f"{key} must be {what}, got {type(value).__name__} {shown(value)}", key)
    return value


def _prompt(obj: dict) -> str:
    prompt = obj.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise ApiError(400, "prompt must be a string (or a list of exactly one string): batches and "
                           "token-id prompts are not supported", "prompt")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt is required and must be a string", "prompt")
    return check_text(prompt, "prompt")


def _stop(obj: dict, prefix: str = "") -> tuple[str, ...]:
    stop, name = obj.get("stop"), f"{prefix}stop"
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, f"{name} must be a string or a list of strings", name)
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", name)
    return tuple(check_text(s, name) for s in stops)


def allowed_method(obj: dict, methods: Sequence[str]) -> str:
    """The request's method, which must be one of the server's allowed ones (built at start: a
    request never makes the server build a method, load a model or read a path)."""
    method = typed(obj, "method", (str,), "a string", methods[0])
    if method in methods:
        return method
    try:  # say what is wrong with the name when it is not even well formed
        parse_method(method)
        why = "not allowed on this server"
    except ValueError as exc:
        why = str(exc)[:240]
    raise ApiError(400, f"method {shown(method, 120)}: {why}; this server allows: {', '.join(methods)} "
                   "(set with `dyncomplete serve --methods`)", "method", "method_not_allowed")


def sampling_params(obj: dict, max_tokens: int, editor: EditorGuards | None, prefix: str = "") -> GenerationParams:
    """`temperature`, `top_p`, `seed`, `stop` and `token_healing` of `obj` (whose fields are named
    `prefix` + name in the error messages: Ollama's sit in `options`)."""
    temperature = typed(obj, "temperature", (int, float), "a number", 0.0)
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"{prefix}temperature must be between 0 and 2, got {shown(temperature)}",
                       f"{prefix}temperature")
    top_p = typed(obj, "top_p", (int, float), "a number", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, f"{prefix}top_p must be in (0, 1], got {shown(top_p)}", f"{prefix}top_p")
    seed = typed(obj, "seed", (int,), "an integer")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ApiError(400, f"{prefix}seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}, got {shown(seed)}",
                       f"{prefix}seed")
    return GenerationParams(max_new_tokens=max_tokens, temperature=float(temperature),
                            top_p=max(float(top_p), MIN_TOP_P), seed=seed, stop=_stop(obj, prefix),
                            token_healing=typed(obj, "token_healing", (bool,), "a boolean", True), editor=editor)


def clip_prompt(prefix: str, suffix: str | None, budget: int) -> tuple[str, str | None, bool]:
    """(prefix, suffix, whether either was cut): text far beyond the context budget cut by
    characters, before anything tokenises it. The prefix keeps its end, cut at a line start that
    moves in steps of a quarter of the bound (as `engine.window.stable_prefix` does by tokens, so a
    typing session's prompts still share a start); the suffix keeps its start."""
    limit = budget * CHARS_PER_TOKEN
    clipped = False
    if len(prefix) > limit:
        step = limit // 4
        drop = -(-(len(prefix) - limit) // step) * step
        newline = prefix.find("\n", drop - 1, drop + step)
        prefix, clipped = prefix[newline + 1 if newline >= 0 else drop:], True
    if suffix is not None and len(suffix) > limit:
        suffix, clipped = suffix[:limit], True
    return prefix, suffix, clipped


def clip_context(context: RepoContext | None, budget: int) -> RepoContext | None:
    """Repository context cut by characters like the prompt: chunks, most important first, while
    they fit in half the budget's characters (the prompt builder gives context at most half the
    budget), so a body full of `input_extra` is never tokenised whole."""
    if context is None:
        return None
    room, kept = budget * CHARS_PER_TOKEN // 2, []
    for chunk in context.chunks:
        if len(chunk.text) + len(chunk.filename) <= room:
            kept.append(chunk)
            room -= len(chunk.text) + len(chunk.filename)
    return RepoContext(kept, context.path, context.repo) if kept else None


def served_model(obj: dict, model_name: str) -> str:
    """The body's `model`, which must be the one served, after refusing OpenAI fields we do not
    honour at other than their neutral value."""
    model = typed(obj, "model", (str,), "a string")
    if model is None:
        raise ApiError(400, "model is required", "model")
    if model != model_name:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {model_name!r}", "model",
                       "model_not_found")
    for key, allowed in NEUTRAL.items():
        if key in obj and obj[key] not in allowed:
            raise ApiError(400, f"{key}={shown(obj[key])} is not supported (only {allowed[1]!r})", key)
    return model


def parse_completion(obj: dict, model_name: str, methods: Sequence[str], max_tokens_limit: int,
                     client_header: str | None = None) -> CompletionRequest:
    """`methods`: the allowed ones, the default first."""
    model = served_model(obj, model_name)
    prefix = _prompt(obj)
    suffix = typed(obj, "suffix", (str,), "a string")
    if suffix is not None:
        check_text(suffix, "suffix")
    if not prefix and not suffix:
        raise ApiError(400, "prompt is empty: give the code before the cursor", "prompt")
    max_tokens = typed(obj, "max_tokens", (int,), "an integer", 16)
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ApiError(400, f"max_tokens must be between 1 and {max_tokens_limit}, got {shown(max_tokens)}",
                       "max_tokens")
    method = allowed_method(obj, methods)
    user = typed(obj, "user", (str,), "a string")
    guards = EditorGuards.for_cursor(prefix, suffix) if typed(obj, "editor_guards", (bool,), "a boolean") else None
    params = sampling_params(obj, max_tokens, guards)
    return CompletionRequest(
        model=model, prefix=prefix, suffix=suffix, params=params, method=method,
        stream=typed(obj, "stream", (bool,), "a boolean", False),
        client_id=client_header or user,
        prefix_cache=typed(obj, "prefix_cache", (bool,), "a boolean", True),
        ignored_fields=sorted(set(obj) - KNOWN), client_memory=client_memory(obj, False),
        ngram_cache=ngram_cache(obj),
    )


def client_memory(obj: dict, default: bool) -> bool:
    """Whether a request uses its sender's memory of files: by default on the editor endpoints,
    off on `/v1/completions`, where unrelated prompts (scripts, benchmarks) would otherwise get
    context from one another and answers would depend on what was sent before."""
    return typed(obj, "client_memory", (bool,), "a boolean", default)


def ngram_cache(obj: dict) -> bool:
    """Whether n-gram drafting may copy the sender's earlier completions (on by default: drafts are
    verified, so only speed depends on it)."""
    return typed(obj, "ngram_cache", (bool,), "a boolean", True)
