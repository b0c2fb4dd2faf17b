"""The engine over the Hugging Face modules: every architecture, and the only one that trains
(LoRA adapters and gradients need the modules). It calls the decoder-layer modules themselves,
so the arithmetic is theirs; it builds only the positions' rotary tables and the masks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoder import Decoder
from .kv_cache import KVCache
from .masks import Masks
from .rotary import RotaryTables
from .step import StepContext


@dataclass
class HFStep:
    rotary: dict  # layer type -> (cos, sin) as the modules take them
    masks: Masks


def module_weight_bytes(modules) -> int:
    """Bytes of the modules' parameters and buffers, each tensor once."""
    seen, total = set(), 0
    for module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


class HFEngine:
    def __init__(self, decoder: Decoder, tables: RotaryTables | None = None):
        """`tables`: rotary tables to use instead of the rotary module (the fast engine's, so that
        both engines of one model see the same values)."""
        self.d, self.tables = decoder, tables

    def ready(self) -> bool:
        return True

    def prepare(self, ctx: StepContext) -> HFStep:
        d, rotary = self.d, {}
        if self.tables is not None:
            cos, sin, _ = self.tables.at(ctx.positions[0].tolist())
            for layer_type in set(d.layer_types):
                rotary[layer_type] = (cos[None], sin[None])
        elif getattr(d.core, "rotary_emb", None) is not None:
            weight = d.lm_head.weight
            probe = torch.empty(0, dtype=weight.dtype, device=weight.device)
            for layer_type in set(d.layer_types):
                if d.kind == "gemma3":
                    rotary[layer_type] = d.core.rotary_emb(probe, ctx.positions, layer_type)
                else:
                    rotary[layer_type] = d.core.rotary_emb(probe, ctx.positions)
        return HFStep(rotary, Masks(ctx, d.lm_head.weight.dtype))

    def embed(self, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        core = self.d.core
        if self.d.kind == "gpt2":
            return core.wte(ids) + core.wpe(ctx.positions)
        if self.d.kind == "opt":
            h = core.embed_tokens(ids)
            if core.project_in is not None:
                h = core.project_in(h)
            return h + core.embed_positions(None, 0, position_ids=ctx.positions)
        return core.embed_tokens(ids)

    def run_layer(self, i: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor:
        step = ctx.state_of(self)
        past = cache.lengths[i] if cache is not None else 0
        kwargs = {"attention_mask": step.masks.get(past + hidden.shape[1], self.d.window(i)), "cache": cache}
        if self.d.kind != "gpt2":
            kwargs["position_ids"] = ctx.positions
            if step.rotary:
                kwargs["position_embeddings"] = step.rotary[self.d.layer_types[i]]
        out = self.d.layers[i](hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def run_layers(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor:
        for i in layers:
            hidden = self.run_layer(i, hidden, ctx, cache)
        return hidden

    def project_kv(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache) -> None:
        """llama/qwen2 layouts: input norm, key/value projections, rotary embedding."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        rotary = ctx.state_of(self).rotary
        for i in layers:
            layer = self.d.layers[i]
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            cos, sin = rotary[self.d.layer_types[i]]
            k, _ = apply_rotary_pos_emb(k, k, cos, sin)
            cache.update(k, v, i)

    def forward_chain(self, input_ids, cache, start, last_only) -> None:
        return None  # LayeredModel.forward's five calls are this engine's path

    def forward_chains(self, steps) -> None:
        return None  # it runs no batches

    def run_exit(self, hidden, resume, ctx, cache, exits, propagate) -> None:
        return None  # the decisions run in Python, between layers

    def batchable(self, cache, start, q_len) -> bool:
        return False  # sequences run one at a time: Hugging Face's attention takes one cache

    def run_batch(self, steps):
        raise ValueError("the hf engine runs one sequence at a time")

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        core = self.d.core
        if self.d.kind == "gpt2":
            return core.ln_f(hidden)
        if self.d.kind == "opt":
            if core.final_layer_norm is not None:
                hidden = core.final_layer_norm(hidden)
            return core.project_out(hidden) if core.project_out is not None else hidden
        return core.norm(hidden)

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        logits = self.d.lm_head(normed)
        if self.d.softcap is not None:
            logits = torch.tanh(logits / self.d.softcap) * self.d.softcap
        return logits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.final_norm(hidden)).float()

    def weight_bytes_per_token(self) -> int:
        """Every decoder layer and the LM head, each tensor once (a tied embedding is the head; of
        the embedding itself one row is read, left out)."""
        return module_weight_bytes([*self.d.layers, self.d.lm_head])
