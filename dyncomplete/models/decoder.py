"""The parts of a Hugging Face decoder model that the engines run, found once per architecture."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED = ("llama", "qwen2", "gemma3_text", "gemma3", "gpt2", "opt")


@dataclass(frozen=True)
class Decoder:
    kind: str  # llama, qwen2, gemma3, gpt2 or opt
    config: object
    core: torch.nn.Module  # the decoder stack: embeddings, layers, final norm
    layers: list
    lm_head: torch.nn.Module
    layer_types: list[str]  # full_attention or sliding_attention, per layer
    sliding_window: int | None
    softcap: float | None  # final logit soft-capping (Gemma)

    def window(self, i: int) -> int | None:
        """Layer i's sliding window, None for full attention."""
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None


def decoder_of(hf_model) -> Decoder:
    config = hf_model.config
    kind = config.model_type
    if kind not in SUPPORTED:
        raise ValueError(f"architecture {kind!r} is not supported; supported: {', '.join(SUPPORTED)}")
    kind = "gemma3" if kind.startswith("gemma3") else kind
    core = getattr(hf_model, "model", None) or getattr(hf_model, "transformer", None)
    if kind == "opt":
        core = hf_model.model.decoder
    if kind == "gemma3" and hasattr(core, "language_model"):
        core = core.language_model
    layers = list(core.h if kind == "gpt2" else core.layers)
    layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * len(layers))
    return Decoder(kind, config, core, layers, hf_model.lm_head, layer_types, getattr(config, "sliding_window", None),
                   getattr(config, "final_logit_softcapping", None))
