"""Validation of a `/v1/completions` body into a `CompletionRequest`, with OpenAI-style errors.

Written by hand rather than with a schema library so that every refusal names the field and
says what is allowed, in the shape OpenAI clients already parse:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..engine import GenerationParams
from ..methods import parse_method

MAX_STOP_STRINGS = 16
# OpenAI fields we accept only at their neutral value (anything else would be silently wrong).
NEUTRAL = {"n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, 0),
           "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {})}
KNOWN = {"model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "stop", "stream", "seed",
         "user", "method", "prefix_cache", "token_healing", "stream_options", *NEUTRAL}


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


def decode_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return obj


def _check_text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} contains an unpaired surrogate (not valid Unicode)", param, "invalid_utf8") from None
    return value


def _typed(obj: dict, key: str, types: tuple, what: str, default=None):
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise ApiError(400, f"{key} must be {what}, got {type(value).__name__} {json.dumps(value)[:40]}", key)
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
    return _check_text(prompt, "prompt")


def _stop(obj: dict) -> tuple[str, ...]:
    stop = obj.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", "stop")
    return tuple(_check_text(s, "stop") for s in stops)


def parse_completion(obj: dict, model_name: str, default_method: str, max_tokens_limit: int,
                     client_header: str | None = None) -> CompletionRequest:
    model = _typed(obj, "model", (str,), "a string")
    if model is None:
        raise ApiError(400, "model is required", "model")
    if model != model_name:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {model_name!r}", "model",
                       "model_not_found")
    for key, allowed in NEUTRAL.items():
        if key in obj and obj[key] not in allowed:
            raise ApiError(400, f"{key}={json.dumps(obj[key])[:40]} is not supported (only {allowed[1]!r})", key)
    prefix = _prompt(obj)
    suffix = _typed(obj, "suffix", (str,), "a string")
    if suffix is not None:
        _check_text(suffix, "suffix")
    if not prefix and not suffix:
        raise ApiError(400, "prompt is empty: give the code before the cursor", "prompt")
    max_tokens = _typed(obj, "max_tokens", (int,), "an integer", 16)
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ApiError(400, f"max_tokens must be between 1 and {max_tokens_limit}, got {max_tokens}", "max_tokens")
    temperature = _typed(obj, "temperature", (int, float), "a number", 0.0)
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"temperature must be between 0 and 2, got {temperature}", "temperature")
    top_p = _typed(obj, "top_p", (int, float), "a number", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}", "top_p")
    seed = _typed(obj, "seed", (int,), "an integer")
    method = _typed(obj, "method", (str,), "a string", default_method)
    try:  # the grammar and the family's form, checked before the request takes a queue slot
        parse_method(method)
    except ValueError as exc:
        raise ApiError(400, str(exc), "method", "method_not_found") from None
    user = _typed(obj, "user", (str,), "a string")
    params = GenerationParams(max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                              seed=seed, stop=_stop(obj),
                              token_healing=_typed(obj, "token_healing", (bool,), "a boolean", True))
    return CompletionRequest(
        model=model, prefix=prefix, suffix=suffix, params=params, method=method,
        stream=_typed(obj, "stream", (bool,), "a boolean", False),
        client_id=client_header or user,
        prefix_cache=_typed(obj, "prefix_cache", (bool,), "a boolean", True),
        ignored_fields=sorted(set(obj) - KNOWN),
    )
