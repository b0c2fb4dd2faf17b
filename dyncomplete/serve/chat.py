"""OpenAI's chat completions (`/v1/chat/completions`): llama.vim's instruction endpoint and
Continue's chat. The messages are rendered with the model's own chat template into one prompt,
which then runs as a completion with the same methods, limits and statistics; the answer and its
stream take OpenAI's `chat.completion` shapes."""

from __future__ import annotations

from collections.abc import Sequence

from .request import (NEUTRAL, ApiError, CompletionRequest, allowed_method, check_text, ngram_cache,
                      sampling_params, served_model, shown, typed)

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 256
DEFAULT_MAX_TOKENS = 256
# chat fields accepted only at a value that asks for nothing (anything else would be silently ignored)
CHAT_NEUTRAL = {"tools": (None, []), "functions": (None, []), "tool_choice": (None, "none", "auto"),
                "function_call": (None, "none", "auto"), "response_format": (None, {"type": "text"})}
KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "stream",
         "stream_options", "seed", "user", "method", "prefix_cache", "ngram_cache", *NEUTRAL, *CHAT_NEUTRAL}


def message_text(message, i: int) -> tuple[str, str]:
    """(role, text) of messages[i]; content is a string or a list of text parts."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object with role and content", where)
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {shown(role)}", f"{where}.role")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise ApiError(400, f"{where}.content parts must be text parts ({{\"type\": \"text\", \"text\": ...}})",
                           f"{where}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string or a list of text parts", f"{where}.content")
    return role, check_text(content, f"{where}.content")


def parse_chat(obj: dict, model_name: str, methods: Sequence[str], max_tokens_limit: int, render,
               client_header: str | None = None) -> CompletionRequest:
    """`render(messages)`: the prompt the model's chat template makes of them (ending where the
    assistant's answer starts)."""
    model = served_model(obj, model_name)
    for key, allowed in CHAT_NEUTRAL.items():
        if key in obj and obj[key] not in allowed:
            raise ApiError(400, f"{key}={shown(obj[key])} is not supported by this server", key)
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages is required: a non-empty list of {role, content}", "messages")
    if len(messages) > MAX_MESSAGES:
        raise ApiError(400, f"at most {MAX_MESSAGES} messages, got {len(messages)}", "messages")
    turns = [dict(zip(("role", "content"), message_text(m, i))) for i, m in enumerate(messages)]
    limit_key = "max_completion_tokens" if "max_completion_tokens" in obj else "max_tokens"
    max_tokens = typed(obj, limit_key, (int,), "an integer", min(DEFAULT_MAX_TOKENS, max_tokens_limit))
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ApiError(400, f"{limit_key} must be between 1 and {max_tokens_limit}, got {shown(max_tokens)}", limit_key)
    method = allowed_method(obj, methods)
    params = sampling_params({**obj, "token_healing": False}, max_tokens, None)  # the template ends the prompt
    return CompletionRequest(
        model=model, prefix=render(turns), suffix=None, params=params, method=method,
        stream=typed(obj, "stream", (bool,), "a boolean", False),
        client_id=client_header or typed(obj, "user", (str,), "a string"),
        prefix_cache=typed(obj, "prefix_cache", (bool,), "a boolean", True),
        ignored_fields=sorted(set(obj) - KNOWN), client_memory=False, ngram_cache=ngram_cache(obj),
    )


def openai_body(kind: str, rid: str, created: int, model: str, choice: dict, usage=None, stats=None) -> dict:
    """One OpenAI response object or stream chunk of one choice, with `usage` and the `dyncomplete`
    statistics where given (the completions and chat endpoints share it)."""
    body = {"id": rid, "object": kind, "created": created, "model": model,
            "choices": [{"index": 0, **choice, "logprobs": None}]}
    if usage is not None:
        body["usage"] = usage
    if stats is not None:
        body["dyncomplete"] = stats
    return body


def chat_body(rid: str, created: int, model: str, text: str, finish: str | None, usage=None, stats=None):
    return openai_body("chat.completion", rid, created, model,
                       {"message": {"role": "assistant", "content": text}, "finish_reason": finish}, usage, stats)


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish: str | None = None, usage=None, stats=None):
    return openai_body("chat.completion.chunk", rid, created, model, {"delta": delta, "finish_reason": finish},
                       usage, stats)
