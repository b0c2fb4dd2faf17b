"""The tokens that end a completion: llama.cpp's end-of-generation list where the vocabulary has
them, and the model's configured end-of-sequence ids."""

from __future__ import annotations

from functools import cache

# Special tokens that end a completion wherever the vocabulary has them, as llama.cpp's
# end-of-generation list: a Qwen2.5-Coder instruct build names only <|im_end|> its end, but
# ends a middle with <|endoftext|>, and its FIM padding and file/repo separators start other text.
END_OF_GENERATION = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                     "<|end_of_text|>", "<EOT>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def eos_ids_of(model) -> set[int]:
    ids = set(_end_tokens(model.tokenizer)) if model.tokenizer is not None else set()
    for source in (getattr(model.hf, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    if model.tokenizer is not None and model.tokenizer.eos_token_id is not None:
        ids.add(model.tokenizer.eos_token_id)
    return ids


@cache
def _end_tokens(tokenizer) -> tuple[int, ...]:
    special = tokenizer.get_added_vocab()
    return tuple(special[t] for t in END_OF_GENERATION if t in special)
