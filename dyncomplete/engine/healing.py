"""Token healing: back the prompt up by its last token and let the model choose how to go on.

Editors cut the prompt at the cursor, which rarely falls on a token boundary the model knows:
byte-level BPE merges a newline with the next line's indentation ("\\n" + 8 spaces is one token in
SmolLM2's vocabulary), so a prompt that ends in "\\n" ends in a token that code almost never
contains, and a small model answers with an empty line. Healing drops the last prompt token and
constrains the first generated token to those whose text starts with the dropped text (the token
itself included); the completion's text then begins after the dropped text. The same idea as
`generate(token_healing=True)` in transformers and guidance's default.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cache, lru_cache

import torch


@cache
def token_texts(tokenizer) -> tuple[str, ...]:
    """The text of every token id, decoded alone (once per tokenizer)."""
    return tuple(tokenizer.batch_decode([[i] for i in range(len(tokenizer))]))


@cache
def sorted_token_texts(tokenizer) -> tuple[list[str], list[int]]:
    """Every token's text in sorted order, with its id: the tokens that start with a text are
    one run of it (once per tokenizer)."""
    pairs = sorted((text, i) for i, text in enumerate(token_texts(tokenizer)))
    return [text for text, _ in pairs], [i for _, i in pairs]


# an editor's prompts end in the same few texts (an indentation, a space, a dot), and a short one
# starts tens of thousands of tokens: their ids are kept, not searched again at every request
EXTENSIONS_KEPT = 256
PAST_ANY_CHAR = chr(0x10FFFF)  # above every character a token's text holds


@lru_cache(maxsize=EXTENSIONS_KEPT)
def _extensions(tokenizer, tail: str) -> torch.Tensor:
    """Ids of the tokens whose text starts with `tail`, in id order: the run of the sorted texts
    from `tail` up to `tail` followed by the highest character (read only: shared by requests)."""
    texts, ids = sorted_token_texts(tokenizer)
    start = bisect.bisect_left(texts, tail)
    end = bisect.bisect_left(texts, tail + PAST_ANY_CHAR, start)
    return torch.tensor(sorted(ids[start:end]), dtype=torch.long)


@dataclass
class Healing:
    tail_id: int  # the prompt's last token, dropped from the prompt
    tail_text: str
    allowed: torch.Tensor  # token ids whose text starts with tail_text (shared: read only)

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """The first token's logits with every token that does not start with the tail masked out."""
        out = torch.full_like(logits, float("-inf"))
        out[..., self.allowed] = logits[..., self.allowed]
        return out


def plan(tokenizer, prompt_ids: list[int]) -> Healing | None:
    """How to heal this prompt, or None where healing cannot change anything: a prompt of one
    token, a special last token (the FIM markers), or a last token that no other token extends."""
    if tokenizer is None or len(prompt_ids) < 2 or prompt_ids[-1] in set(tokenizer.all_special_ids):
        return None
    texts = token_texts(tokenizer)
    tail_id = prompt_ids[-1]
    tail = texts[tail_id] if tail_id < len(texts) else ""
    if not tail or "\ufffd" in tail:  # empty, or part of a multi-byte character
        return None
    allowed = _extensions(tokenizer, tail)
    if len(allowed) < 2 or tail_id not in allowed:
        return None
    return Healing(tail_id, tail, allowed)


def heal_prompt(tokenizer, prompt_ids: list[int], enabled: bool) -> tuple[list[int], Healing | None]:
    """(the prompt to prefill, the healing plan or None): the prompt loses its last token when
    healing is enabled and can change something."""
    heal = plan(tokenizer, prompt_ids) if enabled else None
    return (prompt_ids[:-1], heal) if heal is not None else (prompt_ids, None)
