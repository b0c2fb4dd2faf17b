"""`DecodingMethod`, the interface every method implements, and `prefill`, the prompt pass they
all share (including reuse of a cache that already holds a prefix of the prompt: the server's
prefix cache)."""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..models import KVCache, LayeredModel
from ..models.end_tokens import eos_ids_of
from . import healing
from .emitter import Emitter
from .params import GenerationParams
from .sampling import make_generator
from .stats import Completion, Stats


PREFILL_CHUNK = 32  # prompt tokens per forward call where a request can be cancelled: it stops within one


def full_prompt_pass(model: LayeredModel, ids: list[int], cache: KVCache, last: bool) -> torch.Tensor | None:
    """Every layer over prompt tokens that follow the cache's contents; with `last` (the prompt's
    last part) its last position's logits."""
    if last:
        return model.forward(torch.tensor(ids), cache)[0, -1]
    model.fill(ids, cache)
    return None


def prefill(model: LayeredModel, prompt_ids: list[int], cache: KVCache, stats: Stats,
            cancelled: Callable[[], bool] | None = None, run=full_prompt_pass) -> torch.Tensor | None:
    """Run the prompt tokens the cache does not hold yet; return the last position's logits.
    `run(model, ids, cache, last)` computes a part (a method's `prompt_pass`).
    With `cancelled`, in chunks of PREFILL_CHUNK, and None where it said so between two: the cache
    and `stats` then hold the prompt's start that was computed (a prefix cache can keep it). The
    int4 engine gives the same bits in chunks (its rows do not depend on the row count), and the
    same speed; PyTorch's bfloat16 products may not, so a call that cannot stop runs each part whole."""
    if not prompt_ids:
        raise ValueError("empty prompt: nothing to complete")
    reused = min(cache.lengths[0], len(prompt_ids) - 1)  # at least one token must run
    cache.crop(reused)
    holes = [(a, min(b, reused)) for a, b in cache.holes if a < reused]
    cache.holes = []
    stats.prompt_tokens = len(prompt_ids)
    stats.cached_prompt_tokens = reused - sum(b - a for a, b in holes)
    start = time.perf_counter()
    runs = [*holes, (reused, len(prompt_ids))]  # each gap attends to what precedes it only; the chunks after it stay put
    step = PREFILL_CHUNK if cancelled is not None else len(prompt_ids)
    evaluated = 0
    for a, b in runs:
        cache.crop(a)
        for c in range(a, b, step):
            if cancelled is not None and cancelled():
                cache.crop(c)  # everything before c is computed or reused; what follows may not be
                stats.prompt_tokens, stats.cached_prompt_tokens = c, c - evaluated
                stats.prefill_s = time.perf_counter() - start
                return None
            piece = prompt_ids[c:min(c + step, b)]
            # the prompt's last chunk, the loop's last step, gives its last position's logits
            logits = run(model, piece, cache, c + len(piece) == len(prompt_ids))
            evaluated += len(piece)
        cache.lengths = [max(reused, b)] * cache.num_layers
    stats.prefill_s = time.perf_counter() - start
    return logits


class DecodingMethod:
    """A way of choosing the next tokens. Subclasses implement `decode` (after the prefill), and
    may implement `prepare` (other prompt work, such as a draft model's prompt pass, timed as
    prefill as vLLM's time to first token counts it) and `guard` (a check before each token)."""

    name = "method"
    prompt_depth: int | None = None  # layers a prompt token runs where not all (see prompt_pass)
    batchable = False  # its passes are `model.forward` and `score_chain` only: a server may batch them (serve/batching.py)

    def generate(
        self,
        model: LayeredModel,
        prompt_ids: list[int],
        params: GenerationParams,
        cache: KVCache | None = None,
        on_text: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Completion:
        cache = cache if cache is not None else model.new_cache()
        stats = Stats(model=model.name, method=self.name)
        prompt_ids, heal = healing.heal_prompt(model.tokenizer, prompt_ids, params.token_healing)
        with torch.inference_mode():  # a method's own prompt pass too (`prompt=L` runs layers directly)
            logits = prefill(model, prompt_ids, cache, stats, cancelled, self.prompt_pass)
        if logits is None:
            stats.stopped_by = "cancelled"
            return Completion("", [], stats)
        if heal is not None:
            logits = heal.constrain(logits)
        emitter = Emitter(model.tokenizer, params, eos_ids_of(model), stats, on_text, cancelled,
                          healed=heal.tail_text if heal else "")
        generator = make_generator(params, model.device)
        start = time.perf_counter()
        with torch.inference_mode():
            self.prepare(model, prompt_ids, params, generator, stats)
        stats.prefill_s += time.perf_counter() - start
        start = time.perf_counter()
        with torch.inference_mode():
            self.decode(model, prompt_ids, logits, cache, emitter, generator)
        stats.decode_s = time.perf_counter() - start
        return Completion(emitter.text, emitter.ids, stats, emitter.healed)

    def prompt_pass(self, model, ids: list[int], cache: KVCache, last: bool) -> torch.Tensor | None:
        """The prompt pass over a part of the prompt (`full_prompt_pass`). A method that overrides it
        sets `prompt_depth`, so that a server keeps its caches apart from exact ones."""
        return full_prompt_pass(model, ids, cache, last)

    def prepare(self, model, prompt_ids, params, generator, stats) -> None:
        """Prompt work besides the model's own prompt pass (a draft model's); timed as prefill."""

    def decode(self, model, prompt_ids, logits, cache, emitter: Emitter, generator) -> None:
        raise NotImplementedError
