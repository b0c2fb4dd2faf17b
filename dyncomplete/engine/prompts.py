"""Prompt building: fill-in-the-middle templates per model family, and the context budget.

Where the tokenizer knows FIM tokens (Qwen2.5-Coder: <|fim_prefix|>, <|fim_suffix|>,
<|fim_middle|>), a suffix becomes a FIM prompt. Otherwise only the prefix is used and a notice
says so (SmolLM2 has no FIM tokens). The budget keeps the end of the prefix (closest to the
cursor) and the start of the suffix; a prefix over it is first cut at a stable line start
(`window.stable_prefix`), so that the CLI, the benchmark and the server send the model the same
prompt for the same text, and a typing session's prompts share a prefix.

Where the cursor line goes (`CURSOR_LINES`): in the prefix, or after the middle token as the
completion's known start (what llama.cpp's /infill does with llama.vim's `prompt`). After the
middle token, typing within a line changes only the prompt's end, so the suffix before it stays
in the prefix cache. It goes there by default (`serve --cursor-line` and `bench --cursor-line`
choose).

Repository context (`repo_context.RepoContext`: chunks of other files) goes first, in at most
half the budget; the current file gets what it leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from .repo_context import RepoContext, render
from .token_memo import token_ids
from .window import stable_prefix

DEFAULT_CONTEXT_BUDGET = 1024
CURSOR_LINES = ("prefix", "middle")  # where a FIM prompt puts the text of the cursor line before the cursor

FIM_TEMPLATES = {
    # family: (prefix token, suffix token, middle token), checked against the vocabulary
    "qwen-coder": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "codellama": ("<PRE>", "<SUF>", "<MID>"),
}


@dataclass
class Prompt:
    ids: list[int]
    fim: bool
    truncated: bool
    notice: str = ""
    context_chunks: int = 0  # repository-context chunks that fit in the budget
    cursor: int = 0  # where the text before the cursor ends in `ids` (FIM: the suffix marker; else the end)


@cache
def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """The FIM marker ids of this tokenizer's family, or None (once per tokenizer: building the
    vocabulary dict takes tens of milliseconds for Qwen's 151k tokens)."""
    vocab = tokenizer.get_vocab()
    for tokens in FIM_TEMPLATES.values():
        if all(t in vocab for t in tokens):
            return tuple(vocab[t] for t in tokens)
    return None


def build_prompt(tokenizer, prefix: str, suffix: str | None = None, budget: int = DEFAULT_CONTEXT_BUDGET,
                 context: RepoContext | None = None, suffix_budget: int = 0, cursor_line: str = "middle") -> Prompt:
    """`suffix_budget`: at most this many suffix tokens (0: the share of the budget below). With
    the prefix first, every change in it prefills the whole suffix again, so a smaller suffix is
    a shorter prefill at such pauses. `cursor_line`: one of CURSOR_LINES."""
    if cursor_line not in CURSOR_LINES:
        raise ValueError(f"cursor line {cursor_line!r}: use one of {', '.join(CURSOR_LINES)}")
    if budget < 8:
        raise ValueError(f"context budget must be at least 8 tokens, got {budget}")
    if not prefix and not suffix:
        raise ValueError("empty prompt: give the code before the cursor")
    head, kept = render(tokenizer, context, budget // 2) if context and context.chunks else ([], 0)
    prompt = _file_prompt(tokenizer, prefix, suffix, budget - len(head), suffix_budget, cursor_line)
    prompt.ids = head + prompt.ids
    prompt.cursor += len(head)
    prompt.context_chunks = kept
    return prompt


def _file_prompt(tokenizer, prefix: str, suffix: str | None, budget: int, suffix_budget: int,
                 cursor_line: str) -> Prompt:
    fim = fim_tokens(tokenizer) if suffix else None
    mid: list[int] = []
    if fim and cursor_line == "middle":
        line_start = prefix.rfind("\n") + 1
        lines, typed = prefix[:line_start], prefix[line_start:]
        typed_ids = tokenizer(typed, add_special_tokens=False).input_ids
        if len(typed_ids) <= budget // 8:  # a very long line stays in the prefix, which can be cut
            prefix, mid, budget = lines, typed_ids, budget - len(typed_ids)
    prefix, cut = stable_prefix(tokenizer, prefix, budget * 3 // 4 if fim else budget)
    pre = list(token_ids(tokenizer, prefix))
    notice = ""
    if suffix and fim is None:
        notice = "this model has no fill-in-the-middle tokens: the suffix is ignored"
    if fim is None:
        truncated = cut or len(pre) > budget
        ids = pre[-budget:]
        return Prompt(ids, False, truncated, notice, cursor=len(ids))
    suf = list(token_ids(tokenizer, suffix))
    cut_suffix = 0 < suffix_budget < len(suf)
    suf = suf[:suffix_budget] if cut_suffix else suf
    room = budget - 3
    truncated = len(pre) + len(suf) > room
    if truncated:  # keep up to a quarter of the room for the suffix, the rest for the prefix
        keep_suf = min(len(suf), max(room // 4, room - len(pre)))
        suf = suf[:keep_suf]
        pre = pre[-(room - len(suf)) :] if room - len(suf) > 0 else []
    p, s, m = fim
    return Prompt([p, *pre, s, *suf, m, *mid], True, cut or truncated or cut_suffix, notice, cursor=1 + len(pre))
