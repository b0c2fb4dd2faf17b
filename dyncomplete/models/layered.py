"""`LayeredModel`: one per-layer view over Hugging Face decoder models.

Everything in dyncomplete runs a model one decoder layer at a time: early exit stops between
layers, self-speculation drafts with the first layers and verifies with the rest. This class
hides the differences between architectures (how positions enter, which norm is final, whether
some layers use a sliding window, logit soft-capping) behind five calls:
`embed`, `run_layer` (`run_layers` for several in a row), `final_norm`, `head`, and `forward` (all
layers at once).

Two engines compute them. `hf` calls the Hugging Face modules (every architecture; the only one
that trains: LoRA adapters and gradients need the modules). `fast` (llama and qwen2, the default
for them) runs `fast.FastEngine`: fused weights, plain tensor functions, optional int8/int4
weights. The fast engine hands a call back to the modules while the model is in training mode or
its modules were wrapped (peft), so training code sees its adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import fast as fast_engine
from .attention import use_short_query_attention
from .invariant import make_batch_invariant
from .kv_cache import KVCache

SUPPORTED = ("llama", "qwen2", "gemma3_text", "gemma3", "gpt2", "opt")


@dataclass
class StepContext:
    """What all layers share for one forward step: positions, rotary tables, masks (memoised)."""

    positions: torch.Tensor  # (1, q) absolute positions of the step's tokens
    rotary: dict = field(default_factory=dict)  # layer type -> (cos, sin)
    masks: dict = field(default_factory=dict)  # (kv_len, window) -> additive mask or None
    position_list: list[int] | None = None  # the positions as ints (fast engine)
    fast_cos: torch.Tensor | None = None  # (1, q, 1, head_dim) rotary tables (fast engine)
    fast_sin_signed: torch.Tensor | None = None
    fast_sin: torch.Tensor | None = None  # (q, head_dim), for the native layers
    # a token tree (verification of several drafts at once): the step's tokens occupy cache slots
    # tree_start, tree_start + 1, ... at positions tree_start + depth; tree_parents[r] is row r's
    # parent row (-1 for the first row), and a row attends to the cache and its ancestors only
    tree_parents: list[int] | None = None
    tree_start: int = 0


ENGINES = ("auto", "fast", "hf")


class LayeredModel:
    def __init__(self, hf_model, tokenizer=None, name: str = "model", source_sha256: str | None = None,
                 engine: str = "auto", quant: str = "none"):
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.source_sha256 = source_sha256
        self.config = hf_model.config
        kind = self.config.model_type
        if kind not in SUPPORTED:
            raise ValueError(f"architecture {kind!r} is not supported; supported: {', '.join(SUPPORTED)}")
        self.kind = "gemma3" if kind.startswith("gemma3") else kind
        core = getattr(hf_model, "model", None) or getattr(hf_model, "transformer", None)
        if self.kind == "opt":
            core = hf_model.model.decoder
        if self.kind == "gemma3" and hasattr(core, "language_model"):
            core = core.language_model
        self.core = core
        self.layers = list(core.h if self.kind == "gpt2" else core.layers)
        self.num_layers = len(self.layers)
        self.lm_head = hf_model.lm_head
        self.layer_types = list(getattr(self.config, "layer_types", None) or ["full_attention"] * self.num_layers)
        self.sliding_window = getattr(self.config, "sliding_window", None)
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        self.hidden_size = self.config.hidden_size
        self.vocab_size = self.lm_head.out_features
        self.head_tap = None  # called with every input of `head` (the stop rule reads those rows)
        if self.kind in ("llama", "qwen2", "gemma3"):
            use_short_query_attention(hf_model)
        if self.device.type == "cpu" and self.dtype != torch.float32:
            make_batch_invariant(self.layers)
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}: use {', '.join(ENGINES)}")
        if engine == "auto":
            engine = "fast" if fast_engine.supports(self) else "hf"
        if quant == "auto":
            quant = fast_engine.default_quant(engine, self.device, self.dtype)
        if quant != "none" and engine != "fast":
            raise ValueError(f"quantized weights (--quant {quant}) need the fast engine: llama or qwen2, not {kind}")
        self.engine = engine
        self.quant = quant
        self.fast = fast_engine.FastEngine(self, quant) if engine == "fast" else None
        # the modules the fast engine was built from: if peft wraps them, the hf engine runs
        self._fast_guard = (self.layers[0].self_attn.q_proj, self.layers[0].mlp.down_proj) if self.fast else None

    def set_engine(self, engine: str) -> None:
        """Switch between `fast` and `hf` on the same weights (a quantized model's modules hold
        the dequantized weights, so `hf` is then a reference for, not a copy of, its products)."""
        if engine not in ("fast", "hf") or (engine == "fast" and self.fast is None):
            raise ValueError(f"engine {engine!r} is not available for this model")
        self.engine = engine

    def _fast(self):
        """The fast engine where it applies now: not while training, not on wrapped modules."""
        fast = self.fast
        if fast is None or self.engine != "fast" or self.hf.training:
            return None
        first = self.layers[0]
        if first.self_attn.q_proj is not self._fast_guard[0] or first.mlp.down_proj is not self._fast_guard[1]:
            return None
        return fast

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    # -- the five calls -------------------------------------------------------------------------

    def context(self, positions: torch.Tensor, tree_parents: list[int] | None = None) -> StepContext:
        """Shared inputs for one step whose tokens sit at `positions` (a 1-D or (1, q) tensor);
        `tree_parents` for a token tree (see StepContext), whose first row sits at positions[0]
        and takes the next cache slot."""
        positions = positions.reshape(1, -1).to(self.device)
        ctx = StepContext(positions)
        if tree_parents is not None:
            ctx.tree_parents, ctx.tree_start = list(tree_parents), int(positions[0, 0])
        if self.fast is not None:
            ctx.position_list = positions[0].tolist()
            cos, sin, sin_signed = self.fast.rotary.at(ctx.position_list)
            ctx.fast_cos, ctx.fast_sin_signed = cos[None, :, None], sin_signed[None, :, None]
            ctx.fast_sin = sin
            for layer_type in set(self.layer_types):  # what the modules (and project_kv) read
                ctx.rotary[layer_type] = (cos[None], sin[None])
            return ctx
        rotary = getattr(self.core, "rotary_emb", None)
        if rotary is not None:
            probe = torch.empty(0, dtype=self.dtype, device=self.device)
            for layer_type in set(self.layer_types):
                if self.kind == "gemma3":
                    ctx.rotary[layer_type] = rotary(probe, positions, layer_type)
                else:
                    ctx.rotary[layer_type] = rotary(probe, positions)
        return ctx

    def embed(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        ids = input_ids.reshape(1, -1).to(self.device)
        if self.fast is not None:
            return self.fast.embed(ids)
        if self.kind == "gpt2":
            return self.core.wte(ids) + self.core.wpe(ctx.positions)
        if self.kind == "opt":
            h = self.core.embed_tokens(ids)
            if self.core.project_in is not None:
                h = self.core.project_in(h)
            return h + self.core.embed_positions(None, 0, position_ids=ctx.positions)
        return self.core.embed_tokens(ids)

    def run_layer(self, i: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor:
        """Run decoder layer i on the step's tokens, appending their keys/values to `cache`."""
        layer_type = self.layer_types[i]
        past = cache.lengths[i] if cache is not None else 0
        window = self.sliding_window if layer_type == "sliding_attention" else None
        fast = self._fast()
        if fast is not None:
            kv_len = fast.attended_length(past + hidden.shape[1], hidden.shape[1]) if cache is not None else hidden.shape[1]
            return fast.run_layer(i, hidden, ctx, cache, self._mask(ctx, kv_len, window))
        mask = self._mask(ctx, past + hidden.shape[1], window)
        kwargs = {"attention_mask": mask, "cache": cache}
        if self.kind in ("gpt2",):
            out = self.layers[i](hidden, **kwargs)
        else:
            kwargs["position_ids"] = ctx.positions
            if ctx.rotary:
                kwargs["position_embeddings"] = ctx.rotary[layer_type]
            out = self.layers[i](hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def run_layers(self, first: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None,
                   end: int | None = None) -> torch.Tensor:
        """`run_layer` for layers first..end-1 (default: to the last); the fast engine's native
        kernels run them in one call where they can (the same results, without Python between
        layers)."""
        layers = range(first, self.num_layers if end is None else end)
        fast = self._fast()
        done = fast.run_native(layers, hidden, ctx, cache) if fast is not None else None
        if done is not None:
            return done
        for i in layers:
            hidden = self.run_layer(i, hidden, ctx, cache)
        return hidden

    def project_kv(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache) -> None:
        """Keys and values of `layers` for the step's positions computed from `hidden` alone (input
        norm, key/value projections, rotary embedding) and appended to `cache`: what early exit's
        propagation (CALM, GREEN-CODE) writes for the layers a token skipped. llama/qwen2 layouts."""
        fast = self._fast()
        if fast is not None:
            return fast.project_kv(layers, hidden, ctx, cache)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        for i in layers:
            attn = self.layers[i].self_attn
            x = self.layers[i].input_layernorm(hidden)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            cos, sin = ctx.rotary[self.layer_types[i]]
            k, _ = apply_rotary_pos_emb(k, k, cos, sin)
            cache.update(k, v, i)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        fast = self._fast()
        if fast is not None:
            return fast.final_norm(hidden)
        if self.kind == "gpt2":
            return self.core.ln_f(hidden)
        if self.kind == "opt":
            if self.core.final_layer_norm is not None:
                hidden = self.core.final_layer_norm(hidden)
            return self.core.project_out(hidden) if self.core.project_out is not None else hidden
        return self.core.norm(hidden)

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        if self.head_tap is not None:
            self.head_tap(normed)
        fast = self._fast()
        if fast is not None:
            return fast.head(normed)
        logits = self.lm_head(normed)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: KVCache | None = None, start: int | None = None, last_only: bool = True
    ) -> torch.Tensor:
        """All layers over new tokens that follow the cache's contents; returns float32 logits."""
        ids = input_ids.reshape(1, -1)
        start = cache.lengths[0] if (start is None and cache is not None) else (start or 0)
        ctx = self.context(torch.arange(start, start + ids.shape[1]))
        hidden = self.run_layers(0, self.embed(ids, ctx), ctx, cache)
        if last_only:
            hidden = hidden[:, -1:]
        return self.head(self.final_norm(hidden)).float()

    # -- masks ----------------------------------------------------------------------------------

    def _tree_mask(self, ctx: StepContext, kv_len: int, window: int | None) -> torch.Tensor:
        """(1, 1, q, kv_len): row r sees the slots before the tree (within the window of its
        position) and the slots of itself and its ancestors."""
        start = ctx.tree_start
        allowed = torch.zeros(len(ctx.tree_parents), kv_len, dtype=torch.bool, device=self.device)
        k_pos = torch.arange(start, device=self.device)
        allowed[:, :start] = True
        if window is not None:
            allowed[:, :start] &= k_pos[None, :] > ctx.positions[0][:, None] - window
        for r, slots in enumerate(fast_engine.tree_slots(ctx.tree_parents, start)):
            allowed[r, slots] = True
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)[None, None]

    def _mask(self, ctx: StepContext, kv_len: int, window: int | None) -> torch.Tensor | None:
        """Additive attention mask (1, 1, q, kv_len): a query sees keys at positions <= its own
        (and within the sliding window). None where nothing needs masking (one query, last key)."""
        key = (kv_len, window)
        if key in ctx.masks:
            return ctx.masks[key]
        if ctx.tree_parents is not None:
            ctx.masks[key] = mask = self._tree_mask(ctx, kv_len, window)
            return mask
        q_pos = ctx.positions[0]
        listed = ctx.position_list
        last = listed[0] if listed is not None and len(listed) == 1 else (int(q_pos[0]) if len(q_pos) == 1 else None)
        if last == kv_len - 1 and (window is None or kv_len <= window):
            mask = None
        else:
            k_pos = torch.arange(kv_len, device=self.device)
            allowed = k_pos[None, :] <= q_pos[:, None]
            if window is not None:
                allowed &= k_pos[None, :] > q_pos[:, None] - window
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            mask = mask[None, None]
        ctx.masks[key] = mask
        return mask
