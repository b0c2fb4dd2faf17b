"""What every route reads: the settings, and the model with what serves it (`Server`: its worker,
the prefix cache, the per-sender memories, the allowed methods), built once by `create_app` and
kept as `app.state.server`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fastapi import Request

from ..engine import DEFAULT_CONTEXT_BUDGET, healing
from ..methods import families
from ..models.rotary import shift_frequencies
from .client_files import ClientFiles
from .client_history import ClientHistory
from .http import Limits
from .prefix_cache import PrefixCache
from .suggestions import Suggestions
from .worker import Worker

# Allowed besides the default method unless --methods says otherwise: built-ins that load nothing.
DEFAULT_METHODS = ("baseline", "lookup")


@dataclass
class Settings:
    default_method: str = "baseline"  # `dyncomplete serve` passes its --method (default commands._common.EDITOR_METHOD)
    methods: tuple[str, ...] = DEFAULT_METHODS  # what a request may pick, besides default_method
    check_host: bool = True  # answer only Host names of loopback (set when bound to loopback)
    limits: Limits = Limits()
    api_key: str | None = None
    queue_size: int = 16
    parallel: int = 1  # requests generated at once; past 1, baseline's and lookup's steps are batched (serve/batching.py)
    verify_budget: str = "shared"  # with parallel: drafted rows chosen across the batch, or each request's own ("per-request")
    request_timeout_s: float = 60.0
    max_tokens_limit: int = 1024
    context_budget: int = DEFAULT_CONTEXT_BUDGET
    suffix_budget: int = 0  # suffix tokens kept at most (0: the share of context_budget the prompt builder gives)
    cursor_line: str = "middle"  # where a FIM prompt puts the typed part of the cursor line (prompts.CURSOR_LINES)
    cache_bytes: int = 512 * 2**20
    cache_reuse: int = 32  # reuse runs of at least this many tokens of the last prompt at new positions (0: off)
    cache_reuse_copies: int = 2  # a position is copied at most this many times, then prefilled again (0: no limit)
    cache_reuse_near: int = 64  # the copy limit holds within this many positions of the cursor (0: everywhere)
    client_memory: bool = True  # remember the files each editor sent and retrieve from them
    ngram_cache: bool = True  # n-gram drafting may copy a client's earlier completions
    suggestions: bool = True  # answer from an editor's kept answers where its typing continues one (suggestions.py)
    prefetch: bool = True  # with suggestions and one slot: prefetch the request for a suggestion accepted
    max_body_bytes: int = 2 * 2**20


class Server:
    """Builds every allowed method now (ValueError on a bad one); the worker starts with the app."""

    def __init__(self, model, settings: Settings):
        self.model, self.settings = model, settings
        self.prefix_cache = PrefixCache(settings.cache_bytes, settings.cache_reuse, shift_frequencies(model),
                                        settings.cache_reuse_copies, settings.cache_reuse_near)
        self.client_files = ClientFiles() if settings.client_memory else None
        self.client_history = ClientHistory() if settings.ngram_cache else None
        self.methods = list(dict.fromkeys((settings.default_method, *settings.methods)))
        self.worker = Worker(model, self.methods, settings.queue_size, settings.context_budget, self.prefix_cache,
                             self.client_files, self.client_history, settings.suffix_budget, settings.cursor_line,
                             settings.parallel, Suggestions() if settings.suggestions else None, settings.prefetch,
                             settings.verify_budget)
        self.method_families = families()
        healing.sorted_token_texts(model.tokenizer)  # decoded and sorted once now, not by the first request's token healing


def server_of(request: Request) -> Server:
    return request.app.state.server


def sender(request: Request) -> str:
    """What the server can verify about who sent a request: its address (not X-Forwarded-For) and
    a digest of the key it presented. The memory of sent files is kept per sender (one editor)."""
    key = hashlib.sha256(request.headers.get("authorization", "").encode()).hexdigest()[:16]
    peer = request.client.host if request.client else ""
    return f"{peer}|{key}"
