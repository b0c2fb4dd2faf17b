"""Repository context: code from other files of the project, placed before the current file.

An editor knows more than the file being edited: the files it imports from, the files open
beside it. Qwen2.5-Coder was trained on whole repositories laid out as
`<|repo_name|>NAME\\n<|file_sep|>PATH\\nCONTENT\\n<|file_sep|>PATH\\n...` with the file being
completed last, so its context chunks go in that format. Models without those tokens get each
chunk under a one-line comment naming its file, the way files are concatenated in plain training
text. The chunks come most important first; those that fit the budget are laid out in reverse,
the most important next to the current file. The layout depends only on the chunks, so while a
user types the context part of the prompt stays the same and the prefix cache keeps hitting.

`rank_chunks` is the retrieval baseline of CrossCodeEval: windows of a few lines from the other
files, ranked by the Jaccard similarity of their identifiers with the last lines before the
cursor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from .token_memo import token_ids

REPO_TOKENS = ("<|repo_name|>", "<|file_sep|>")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LINE_COMMENT = {".py": "#", ".sh": "#", ".rb": "#", ".r": "#", ".toml": "#", ".yaml": "#", ".yml": "#"}
WINDOW_LINES = 10  # CrossCodeEval's retrieval windows: 10 lines, a new one every 5
WINDOW_STRIDE = 5
QUERY_LINES = 10


@dataclass
class Chunk:
    filename: str
    text: str


@dataclass
class RepoContext:
    """What the prompt builder needs: the chunks (most important first), the current file's path
    and the repository's name (both may be empty)."""
    chunks: list[Chunk]
    path: str = ""
    repo: str = ""

    @classmethod
    def from_records(cls, extra: list[dict], path: str = "", repo: str = "") -> "RepoContext":
        """From llama.cpp's `input_extra` shape, `[{"filename": ..., "text": ...}]`."""
        return cls([Chunk(str(e.get("filename", "")), str(e["text"])) for e in extra], path, repo)


@cache
def repo_token_ids(tokenizer) -> tuple[int, int] | None:
    """Qwen2.5-Coder's repository markers' ids, or None (once per tokenizer, as `fim_tokens`)."""
    vocab = tokenizer.get_vocab()
    return (vocab[REPO_TOKENS[0]], vocab[REPO_TOKENS[1]]) if all(t in vocab for t in REPO_TOKENS) else None


def _comment(path: str) -> str:
    dot = path.rfind(".")
    return LINE_COMMENT.get(path[dot:].lower(), "//") if dot >= 0 else "#"


def render(tokenizer, context: RepoContext, budget: int) -> tuple[list[int], int]:
    """Token ids of the context part of a prompt, at most `budget` of them, ending with the
    current file's header; and how many chunks fit. Chunks are taken most important first; one
    that does not fit is skipped (later, smaller ones may still go in). They are laid out in the
    reverse order, so that the most important ends next to the current file."""

    def encode(text: str) -> list[int]:
        return list(token_ids(tokenizer, text))

    special = repo_token_ids(tokenizer)
    if special is not None:
        repo_id, sep_id = special
        head = [repo_id, *encode(f"{context.repo}\n")]
        tail = [sep_id, *encode(f"{context.path}\n")]
        pieces = [[sep_id, *encode(f"{c.filename}\n{c.text.rstrip()}\n")] for c in context.chunks]
    else:
        mark = _comment(context.path)
        head = []
        tail = encode(f"{mark} {context.path}\n") if context.path else []
        pieces = [encode(f"{_comment(c.filename)} {c.filename}\n{c.text.rstrip()}\n\n") for c in context.chunks]
    used = len(head) + len(tail)
    if used > budget:
        return [], 0
    kept = []
    for piece in pieces:
        if used + len(piece) <= budget:
            kept.append(piece)
            used += len(piece)
    if not kept:
        return [], 0
    body = [token for piece in reversed(kept) for token in piece]  # the most important next to the file
    return head + body + tail, len(kept)


def identifiers(text: str) -> set[str]:
    return set(IDENTIFIER.findall(text))


def windows(filename: str, text: str, lines: int = WINDOW_LINES, stride: int = WINDOW_STRIDE) -> list[Chunk]:
    """Overlapping windows of `lines` lines, one every `stride` lines, blank-only ones left out."""
    rows = text.splitlines()
    out = []
    for start in range(0, max(len(rows) - lines, 0) + 1, stride):
        piece = "\n".join(rows[start : start + lines])
        if piece.strip():
            out.append(Chunk(filename, piece))
    return out


def rank_chunks(prefix: str, candidates: list[Chunk], limit: int) -> list[Chunk]:
    """The `limit` candidates whose identifiers are most similar (Jaccard) to those of the last
    `QUERY_LINES` lines of `prefix`; ties keep the candidates' order, zero similarity is left out."""
    return rank(query_identifiers(prefix), [(chunk, identifiers(chunk.text)) for chunk in candidates], limit)


def query_identifiers(prefix: str) -> set[str]:
    return identifiers("\n".join(prefix.splitlines()[-QUERY_LINES:]))


def rank(query: set[str], candidates: list[tuple[Chunk, set[str]]], limit: int) -> list[Chunk]:
    """`rank_chunks` over candidates whose identifier sets are already known."""
    if not query:
        return []
    scored = []
    for i, (chunk, ids) in enumerate(candidates):
        overlap = len(query & ids)
        if overlap:
            scored.append((-overlap / len(query | ids), i, chunk))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [chunk for _, _, chunk in scored[:limit]]
