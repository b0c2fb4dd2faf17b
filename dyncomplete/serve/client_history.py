"""Per-client memory of generated tokens: the cross-request n-gram cache.

What a client was offered before is often what it is offered next: a completion the user did
not take comes back a line later, a name the model wrote in one request recurs in the next.
llama.cpp keeps an n-gram cache across generations and vLLM drafts from a suffix tree of earlier
outputs; here each sender (address and key, as for `client_files.py`) keeps the tokens of its
recent completions, at most `max_tokens`, the oldest dropped first, and n-gram lookup
(`methods.proposers.LookupProposer`) drafts from them where the request's own text has no
match. Drafting is verified, so outputs stay those of plain decoding; only speed changes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_CLIENTS = 64
MAX_TOKENS = 4096


class ClientHistory:
    def __init__(self, max_clients: int = MAX_CLIENTS, max_tokens: int = MAX_TOKENS):
        self.max_clients, self.max_tokens = max_clients, max_tokens
        self._tokens: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()  # the worker writes; /health reads the sizes

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def total_tokens(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._tokens.values())

    def tokens(self, client: str) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._tokens.get(client, ()))

    def add(self, client: str, token_ids: list[int]) -> None:
        with self._lock:
            kept = self._tokens.pop(client, [])
            kept = (kept + list(token_ids))[-self.max_tokens :]
            self._tokens[client] = kept
            while len(self._tokens) > self.max_clients:
                self._tokens.popitem(last=False)
