"""The reference decoder: full depth for every token, KV-cached, greedy or sampled."""

from __future__ import annotations

import torch

from ..engine import DecodingMethod
from ..engine.sampling import choose_token


class Baseline(DecodingMethod):
    """Every layer for every token: the quality and speed reference."""

    name = "baseline"
    batchable = True

    def decode(self, model, prompt_ids, logits, cache, emitter, generator):
        position = len(prompt_ids)
        while True:
            token = choose_token(logits, emitter.params, generator)
            if emitter.emit(token, model.num_layers):
                break
            logits = model.forward(torch.tensor([token]), cache, start=position)[0, -1]
            position += 1
        emitter.stats.count_full_steps(emitter.stats.new_tokens, model.num_layers)


def build(name, model) -> Baseline:
    return Baseline()
