"""Per-client memory of the code an editor sent, and retrieval from it into each prompt.

An editor sends other files' code now and then: llama.vscode and llama.vim put chunks of the
files open beside the cursor in `input_extra`, often in a cache-warming request (`n_predict`
0) when a file is opened or saved, and every request carries the document being edited. The
server keeps that per client (its address and API key: one editor), within a byte bound, the
least recently sent file dropped first. For each completion, windows of the remembered files
(not the document being edited) are ranked by CrossCodeEval's Jaccard retrieval
(`repo_context.rank_chunks`) against the last lines before the cursor, and the best go into the
prompt after the chunks the request itself sent.

Repository context is the start of the prompt, so a new choice of windows costs a full prefill.
The choice is therefore kept until it holds none of the `WINDOWS_KEPT_WHILE` best windows for
the current cursor, or something new was remembered: while the user types in one place or moves
down a few lines the prompt's start stays the same and the prefix cache keeps hitting. The
document being edited is one slot however its window slides (`same_document`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ..engine.repo_context import Chunk, RepoContext, identifiers, query_identifiers, rank, windows

MAX_CLIENTS = 32
MAX_BYTES = 2 * 2**20  # remembered text per client
# Windows and their identifier sets take about 20 times the text (40 MiB for a full memory), so
# only the most recently served clients keep them; another client's are made again when it
# returns (0.5 s for a full memory).
INDEXED_CLIENTS = 4
MAX_FILE_BYTES = 256 * 2**10  # a longer file keeps its start
WINDOWS_CHOSEN = 8  # ranked windows offered to the prompt builder (it keeps what fits in the budget)
WINDOWS_KEPT_WHILE = 4  # the choice stands while it holds one of this many best windows for the cursor
DOCUMENT_HEAD = 256  # characters that name a document sent without a file name (see `document_key`)
UNNAMED = "(recent file)"


def document_key(text: str) -> str:
    """The key of a document sent without a name (the text around a cursor): its first
    `DOCUMENT_HEAD` characters, which stay the same while the user types further down. Two files
    with the same head share one slot, and only memory is lost by that."""
    return "doc:" + hashlib.sha256(text[:DOCUMENT_HEAD].encode()).hexdigest()[:16]


def same_document(old: str, new: str) -> bool:
    """Whether `new` is `old`'s file seen through a window that slid: llama.vim sends the lines
    around the cursor, so moving down drops the start. Either's first `DOCUMENT_HEAD` characters
    lie inside the other."""
    return new[:DOCUMENT_HEAD] in old or old[:DOCUMENT_HEAD] in new


@dataclass
class _Client:
    files: OrderedDict = field(default_factory=OrderedDict)  # key -> Chunk, least recently sent first
    nbytes: int = 0
    version: int = 0  # bumped when remembered text that could be chosen changes
    windows: dict = field(default_factory=dict)  # key -> [(window, its identifiers)], made on first use
    chosen: list = field(default_factory=list)
    chosen_for: tuple = (-1, "")  # (version, excluded document) of `chosen`


class ClientFiles:
    def __init__(self, max_clients: int = MAX_CLIENTS, max_bytes: int = MAX_BYTES):
        self.max_clients, self.max_bytes = max_clients, max_bytes
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._lock = threading.Lock()  # the event loop calls in; /health reads the sizes

    def __len__(self) -> int:
        return len(self._clients)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._clients.values())

    def _client(self, client: str) -> _Client:
        state = self._clients.pop(client, None) or _Client()
        self._clients[client] = state
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        return state

    def _remember(self, state: _Client, key: str, chunk: Chunk, new_choice: bool = True) -> None:
        """`new_choice`: whether a change of this file calls for choosing windows anew (not for
        the document being edited, which is never a candidate for its own prompt)."""
        chunk = Chunk(chunk.filename, chunk.text[:MAX_FILE_BYTES])
        old = state.files.pop(key, None)
        state.files[key] = chunk
        if old is not None and old.text == chunk.text:
            return  # sent again unchanged: only its recency moves
        state.nbytes += len(chunk.text) - (len(old.text) if old else 0)
        state.windows.pop(key, None)
        state.version += new_choice
        while state.nbytes > self.max_bytes and len(state.files) > 1:
            dropped_key, dropped = state.files.popitem(last=False)
            state.nbytes -= len(dropped.text)
            state.windows.pop(dropped_key, None)

    def remember(self, client: str, extra: RepoContext | None, document: str = "") -> str:
        """Keep the chunks a request sent (by file name and text) and the document being edited;
        the key the document is kept under."""
        with self._lock:
            state = self._client(client)
            for chunk in extra.chunks if extra else ():
                self._remember(state, f"extra:{chunk.filename}:{hash(chunk.text)}", chunk)
            slot = self._document_slot(state, document)
            if document.strip():
                self._remember(state, slot, Chunk(UNNAMED, document), new_choice=False)
            return slot

    @staticmethod
    def _document_slot(state: _Client, document: str) -> str:
        """The key a document is kept under: the slot of the remembered unnamed document whose
        window it slid from, else its own `document_key`."""
        key = document_key(document)
        if key in state.files or not document.strip():
            return key
        return next((old for old, chunk in reversed(state.files.items())
                     if old.startswith("doc:") and same_document(chunk.text, document)), key)

    def context(self, client: str, prefix: str, suffix: str | None, extra: RepoContext | None) -> RepoContext | None:
        """Remember what this request sent; the repository context for its prompt: the request's
        own chunks first, then the windows of other remembered files that best match the code
        before the cursor (None when there is neither)."""
        document = prefix + (suffix or "")
        current = self.remember(client, extra, document)
        sent = {chunk.text for chunk in extra.chunks} if extra else set()
        with self._lock:
            state = self._client(client)
            candidates = [w for key, chunk in state.files.items() if key != current and chunk.text not in sent
                          for w in self._windows(state, key, chunk)]
            ranked = [w for w in rank(query_identifiers(prefix), candidates, 4 * WINDOWS_CHOSEN)
                      if w.text not in document]
            best = ranked[:WINDOWS_KEPT_WHILE]
            if state.chosen_for != (state.version, current) or best and not any(w in state.chosen for w in best):
                state.chosen = ranked[:WINDOWS_CHOSEN]
                state.chosen_for = (state.version, current)
            chosen = list(state.chosen)
            for other in list(self._clients.values())[:-INDEXED_CLIENTS]:
                other.windows.clear()
        chunks = (list(extra.chunks) if extra else []) + chosen
        if not chunks:
            return None
        return RepoContext(chunks, extra.path if extra else "", extra.repo if extra else "")

    @staticmethod
    def _windows(state: _Client, key: str, chunk: Chunk) -> list[tuple[Chunk, set[str]]]:
        if key not in state.windows:
            state.windows[key] = [(w, identifiers(w.text)) for w in windows(chunk.filename, chunk.text)]
        return state.windows[key]
