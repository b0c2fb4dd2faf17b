"""Training data for exit heads and classifiers: one full forward per chunk of real code.

For every token of the chunks we keep the hidden state at each exit layer, the final layer's
normed hidden state (so the teacher's logits over any token subset can be recomputed cheaply)
and the teacher's top-k tokens. Every trainer (translators, classifier, calibration) reads this
one cache instead of running the model again; `cached_collect` keeps it on disk between commands.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..data.splits import source_files
from ..paths import cache_root

CHUNK = 384  # tokens per chunk
SKIP = 16  # first positions of a chunk: attention-sink states unlike those of a long prompt


@dataclass
class Collected:
    layers: list[int]
    hidden: dict[int, torch.Tensor]  # exit layer -> (N, d) bfloat16
    final_normed: torch.Tensor  # (N, d) bfloat16
    top_ids: torch.Tensor  # (N, k) the teacher's top-k tokens, best first
    input_ids: torch.Tensor  # (N,) the token at each position (its next token is predicted)

    def __len__(self) -> int:
        return len(self.top_ids)


def code_chunks(tokenizer, split: str, tokens: int, chunk: int = CHUNK, seed: int = 0, root=None,
                lang: str = "python") -> list[list[int]]:
    """Chunks of `chunk` tokens, one from each of shuffled files of the split, until `tokens`
    (`root`, `lang`: another corpus than the standard library, as `source_files` takes them)."""
    files = source_files(root, lang, split=split)
    random.Random(seed).shuffle(files)
    chunks, total = [], 0
    for path in files:
        ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
        if len(ids) < chunk:
            continue
        start = random.Random(f"{seed}:{path.name}").randrange(len(ids) - chunk + 1)
        chunks.append(ids[start : start + chunk])
        total += chunk - SKIP
        if total >= tokens:
            break
    return chunks


@torch.inference_mode()
def collect(model, layers, chunks, top_k: int = 16, progress: bool = True) -> Collected:
    """Run every chunk through all layers once, keeping what the trainers need."""
    layers = sorted(layers)
    hidden = {e: [] for e in layers}
    finals, tops, inputs = [], [], []
    for ids in tqdm(chunks, desc="collect", disable=not progress, unit="chunk"):
        ctx = model.context(torch.arange(len(ids)))
        h = model.embed(torch.tensor(ids), ctx)
        cache = model.new_cache()  # with a cache, a prompt takes the path decoding takes (native_prompt)
        for i in range(model.num_layers):
            h = model.run_layer(i, h, ctx, cache)
            if i + 1 in hidden:
                hidden[i + 1].append(h[0, SKIP:].to(torch.bfloat16))
        normed = model.final_norm(h)[0, SKIP:]
        finals.append(normed.to(torch.bfloat16))
        tops.append(model.head(normed).topk(top_k, dim=-1).indices)
        inputs.append(torch.tensor(ids[SKIP:]))
    return Collected(
        layers,
        {e: torch.cat(v) for e, v in hidden.items()},
        torch.cat(finals),
        torch.cat(tops),
        torch.cat(inputs),
    )


def cached_collect(model, layers, split: str, tokens: int, chunk: int = CHUNK, seed: int = 0,
                   refresh: bool = False, progress: bool = True) -> Collected:
    """`collect` on `tokens` tokens of a split, stored under the cache directory for reuse, keyed by
    the weights, dtype, split, size, chunking, seed and layers."""
    layers = sorted(layers)
    dtype = str(model.dtype).removeprefix("torch.")
    layer_key = hashlib.sha256(str(layers).encode()).hexdigest()[:8]
    key = f"{(model.source_sha256 or model.name)[:12]}-{dtype}-{split}-{tokens}-{chunk}-{seed}-{layer_key}.pt"
    path = cache_root() / "exit-data" / key
    if path.is_file() and not refresh:
        return Collected(**torch.load(path))
    data = collect(model, layers, code_chunks(model.tokenizer, split, tokens, chunk, seed), progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(vars(data), path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return data
