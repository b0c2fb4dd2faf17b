"""A lean per-layer engine for llama and qwen2 decoders, with optional weight-only quantization.

For llama and qwen2 at inference `LayeredModel`'s calls land here instead of in the Hugging Face
modules, which spend most of a small model's decode step in module dispatch, hooks, keyword
plumbing and small tensors made per call. This engine holds:

- per layer one fused query/key/value weight and one fused gate/up weight (the Hugging Face
  modules keep theirs as views into the fused tensors, so training code, peft and the `hf`
  engine still find `q_proj`, `k_proj`, ... with the same values and no second copy);
- the model's own RMSNorm as two tensor operations (the same arithmetic as Hugging Face's:
  float32 normalisation, rounded to the model dtype, then times the weight);
- rotary tables (`rotary.py`) sliced by position, applied to queries and keys at once;
- the KV cache of `kv_cache.py` (per-layer lengths, crop, copy, keys in blocks of positions
  stored feature by feature), written in place, its buffers sized in whole multiples of SPAN
  positions;
- attention for short queries with grouped heads and the split reduction of `invariant.py`
  (the same operations as `attention.short_query_attention`), SDPA otherwise. Short queries
  read the cache in whole multiples of SPAN positions, the positions past the last key masked
  out (their probabilities are exactly 0 and the buffers start as zeros): the products then run
  on whole buffers, with a shape the CPU's bfloat16 GEMM has seen.

In the model's own dtype the engine computes bit for bit what the Hugging Face modules compute
(fused products give each output the same sums as separate ones; checked by the tests), so
`generate` on the same weights stays a reference. Each position's result does not depend on how
many positions run together for queries of up to `SHORT_QUERY` tokens (verification passes),
as `invariant.py` requires for lossless speculative decoding in bfloat16.

Quantized weights (`quant="int8"` or `"int4"`, `weights.py`) replace every linear layer, the LM
head included; with int4 the native kernels also run whole layers for short queries
(`run_native`). The Hugging Face modules then hold the dequantized weights, so the `hf` engine
and prompt passes on CPUs with AMX (more than `SHORT_QUERY` positions, where oneDNN's bfloat16
GEMM wins there) multiply by the same model; every method prefills the same way, so identity
between methods holds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..paths import cpu_has_amx
from . import native
from .attention import SHORT_QUERY, gpu_padding, with_rows_repeated
from .decoder import Decoder
from .invariant import split_k_matmul
from .kv_cache import KVCache
from .masks import Masks, tree_slots
from .native import bindings
from .rotary import RotaryTables
from .step import StepContext
from .weights import BITS, QUANTS, Linear

FAST_KINDS = ("llama", "qwen2")
SPAN = 256  # short-query attention reads the cache in whole multiples of this many positions
# prompt positions per call of decode.c (`native_prompt_max`; the scratch of `bindings.Layers`): a
# call streams every weight from memory once, so longer calls read them less often (AMD Zen 4,
# Qwen 0.5B: 16 -> 128 rows 1.2x; 512 no more)
PROMPT_CHUNK = 128
# the longest prompt part (positions of one pass) decode.c takes on CPUs with AMX, where oneDNN's
# bfloat16 GEMM prefills long prompts faster but costs about as much for a few tokens as for 90:
# 32 new tokens after 480 cached took 45 ms against 85 on the AMX Xeon, 96 tokens 120 against
# 126, 256 tokens 320 against 210 (Qwen 0.5B, docs/results.md)
AMX_NATIVE_PROMPT = 96
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope types whose frequencies never change


def default_quant(engine: str, device: torch.device, dtype: torch.dtype) -> str:
    """What `quant="auto"` means: int4 where this engine runs on a CPU in bfloat16 (the fastest
    format on the benchmarks and within 0.3 ES of bfloat16 weights on line-py; README, "Speed
    against llama.cpp") and the native kernels build here, otherwise the model's own weights."""
    cpu_bf16 = engine == "fast" and device.type == "cpu" and dtype == torch.bfloat16
    return "int4" if cpu_bf16 and native.available() else "none"


def rows_waiting(resume: list[int], layers: int) -> list[int]:
    """Per layer j < `layers`, how many rows of an early-exit step join after it (resume[r]: the
    layer row r joins at, never increasing along the rows): the rows layer j does not run."""
    ascending = resume[::-1]
    return [len(resume) - bisect.bisect_right(ascending, j) for j in range(layers)]


def supports(decoder: Decoder) -> bool:
    """Whether the fast engine can run this decoder (llama or qwen2 with a static RoPE, SiLU)."""
    if decoder.kind not in FAST_KINDS:
        return False
    rotary = getattr(decoder.core, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    return rotary is not None and rope_type in STATIC_ROPE and getattr(decoder.config, "hidden_act", "silu") == "silu"


class FastLayer:
    __slots__ = ("in_norm", "post_norm", "qkv", "o", "gate_up", "down", "attn_module")

    def __init__(self, in_norm, post_norm, qkv, o, gate_up, down, attn_module):
        self.in_norm, self.post_norm = in_norm, post_norm
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.attn_module = attn_module

    def weight_bytes(self) -> int:
        """Bytes of the layer's linear weights, in the format the engine reads them."""
        return sum(lin.weight_bytes() for lin in (self.qkv, self.o, self.gate_up, self.down))


@dataclass
class FastStep:
    """The engine's inputs for one step."""

    positions: list[int]
    cos: torch.Tensor  # (q, head_dim), as decode.c reads them
    sin: torch.Tensor
    cos_heads: torch.Tensor  # (1, q, 1, head_dim), as `_project` broadcasts them over heads
    sin_signed_heads: torch.Tensor
    masks: Masks


def _fuse(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) made of the linears' rows; each linear then holds views into it."""
    weight = torch.cat([lin.weight.detach() for lin in linears]).contiguous()
    biases = [lin.bias for lin in linears]
    bias = torch.cat([b.detach() for b in biases]).contiguous() if all(b is not None for b in biases) else None
    if any(b is not None for b in biases) and bias is None:
        raise ValueError("cannot fuse linear layers where only some have a bias")
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start : start + n], requires_grad=lin.weight.requires_grad)
        if bias is not None:
            lin.bias = torch.nn.Parameter(bias[start : start + n], requires_grad=lin.bias.requires_grad)
        start += n
    return weight, bias


class FastEngine:
    """Per-layer computation for a llama/qwen2 decoder (see the module docstring)."""

    def __init__(self, decoder: Decoder, quant: str = "none", packed: dict[str, torch.Tensor] | None = None):
        """`packed`: the int4/int8 blocks of every linear by its name in `linears` (a snapshot's, `packed.py`),
        the decoder's weights then being their dequantized values already."""
        if not supports(decoder):
            raise ValueError(f"the fast engine runs llama and qwen2 (static RoPE, SiLU), not {decoder.kind}")
        if quant not in QUANTS:
            raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
        self.d = decoder
        self.quant = quant
        config = decoder.config
        dtype, device = decoder.lm_head.weight.dtype, decoder.lm_head.weight.device
        if packed is not None and quant not in BITS:
            raise ValueError(f"packed blocks need --quant int4 or int8, not {quant}")
        if quant != "none" and device.type != "cpu":
            raise ValueError("quantized weights use PyTorch's CPU kernels: run them on the CPU")
        self.dtype, self.device = dtype, device
        invariant = device.type == "cpu" and dtype != torch.float32  # the products' split reductions
        self.short_path = device.type in ("cpu", "cuda") and dtype != torch.float32  # attention.py's rule
        attn0 = decoder.layers[0].self_attn
        self.head_dim = attn0.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.scale = attn0.scaling
        self.intermediate = config.intermediate_size
        self.eps = decoder.core.norm.variance_epsilon
        self.rotary = RotaryTables(decoder.core.rotary_emb, dtype, device)
        # the modules the engine was built from: once peft wraps them, the hf engine runs
        self.built_from = (attn0.q_proj, decoder.layers[0].mlp.down_proj)
        self.layers: list[FastLayer] = []
        dequantize = quant != "none" and packed is None  # the Hugging Face modules get the weights the kernels use

        def linear(key: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            lin = Linear(weight, bias, quant, invariant, packed=packed[key] if packed is not None else None)
            if dequantize:  # tied embeddings get the head's dequantized rows too: one consistent model
                weight.copy_(lin.dequantized())
                lin.levels = None
            return lin

        with torch.no_grad():
            for i, layer in enumerate(decoder.layers):
                attn, mlp = layer.self_attn, layer.mlp
                qkv_w, qkv_b = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
                gu_w, gu_b = _fuse([mlp.gate_proj, mlp.up_proj])
                self.layers.append(FastLayer(
                    layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                    linear(f"layers.{i}.qkv", qkv_w, qkv_b),
                    linear(f"layers.{i}.o", attn.o_proj.weight, attn.o_proj.bias),
                    linear(f"layers.{i}.gate_up", gu_w, gu_b),
                    linear(f"layers.{i}.down", mlp.down_proj.weight, mlp.down_proj.bias),
                    attn,
                ))
            self.final_norm_weight = decoder.core.norm.weight
            self.native = self._native_layers() if quant in BITS else None
            head = decoder.lm_head
            self.lm_head = linear("lm_head", head.weight, head.bias)
        self.embedding = decoder.core.embed_tokens.weight
        # prompts through decode.c too (None: at any length), except long ones where oneDNN's
        # bfloat16 GEMM runs on AMX tiles: there it prefilled 512 tokens 1.7x faster than decode.c
        # (1.4x with AMX's integer products in decode.c, not kept); on AVX512-BF16 alone (AMD
        # Zen 4) decode.c was 1.3x faster (docs/results.md)
        self.native_prompt_max = AMX_NATIVE_PROMPT if cpu_has_amx() else None
        # `forward_chains` runs: every layer and the head in decode.c, on bfloat16 rows
        self.chains = (self.native is not None and self.native.all_native and self.lm_head.native is not None
                       and self.dtype == self.embedding.dtype == torch.bfloat16 and self.embedding.is_contiguous()
                       and self.d.config.hidden_size <= native.MAX_WIDTH)

    def _native_layers(self) -> bindings.Layers:
        """decode.c's view of every layer (pointers into this engine's tensors); the layers run
        there for short queries on full-attention layers."""
        if self.head_dim % 32:
            raise ValueError(f"{self.quant} decoding needs a head dimension divisible by 32, not {self.head_dim}")
        dims = native.Dims(self.d.config.hidden_size, self.heads, self.kv_heads, self.head_dim, self.intermediate,
                           self.eps, self.scale)
        structs = []
        for layer, kind in zip(self.layers, self.d.layer_types):
            if kind != "full_attention":
                structs.append(None)
                continue
            norms = [w.detach().contiguous() for w in (layer.in_norm, layer.post_norm)]
            layer.in_norm, layer.post_norm = norms  # the same values; decode.c reads them in place
            structs.append(native.Layer(norms[0].data_ptr(), norms[1].data_ptr(),
                                        *(lin.native for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))))
        return bindings.Layers(dims, structs, PROMPT_CHUNK)

    # -- the engine's calls -------------------------------------------------------------------

    def ready(self) -> bool:
        """False once the modules it was built from were replaced (peft's wrappers)."""
        first = self.d.layers[0]
        return first.self_attn.q_proj is self.built_from[0] and first.mlp.down_proj is self.built_from[1]

    def prepare(self, ctx: StepContext) -> FastStep:
        positions = ctx.positions[0].tolist()
        cos, sin, sin_signed = self.rotary.at(positions)
        return FastStep(positions, cos, sin, cos[None, :, None], sin_signed[None, :, None], Masks(ctx, self.dtype))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # normalised in float32 and rounded to the dtype inside rms_norm, then times the weight:
        # Hugging Face's order of roundings (checked bit for bit by the tests)
        return F.rms_norm(x, (x.shape[-1],), None, self.eps) * weight

    def embed(self, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return F.embedding(ids, self.embedding)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._native_tail(hidden):
            return bindings.final_norm(self.native.dims, self.final_norm_weight, hidden)
        return self.rms_norm(hidden, self.final_norm_weight)

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        return self.lm_head(normed)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`head(final_norm(hidden)).float()`, the same values, in one call of decode.c for the rows
        the head's kernel takes."""
        if self._native_tail(hidden) and hidden.numel() <= SHORT_QUERY * hidden.shape[-1]:
            return bindings.final_logits(self.native.dims, self.final_norm_weight, self.lm_head.native, hidden)
        return self.head(self.final_norm(hidden)).float()

    def _native_tail(self, hidden: torch.Tensor) -> bool:
        """Whether decode.c takes the final norm: the native kernels run this model, and no gradient
        flows through it (training runs PyTorch's norm, with the same roundings but its own order
        of the sum of squares)."""
        if self.native is None or hidden.shape[-1] > native.MAX_WIDTH:
            return False
        return not (torch.is_grad_enabled() and (hidden.requires_grad or self.final_norm_weight.requires_grad))

    def run_layers(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor:
        """In one call of decode.c where `run_native` can (the same results, without Python between
        layers), else layer by layer."""
        done = self.run_native(layers, hidden, ctx, cache)
        if done is not None:
            return done
        for i in layers:
            hidden = self.run_layer(i, hidden, ctx, cache)
        return hidden

    def run_layer(self, i: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor:
        layer = self.layers[i]
        q_len = hidden.shape[1]
        done = self.run_native(range(i, i + 1), hidden, ctx, cache)
        if done is not None:
            return done
        step = ctx.state_of(self)
        q, new_k, new_v = self._project(layer, hidden, step)
        short = self.short_path and q_len <= SHORT_QUERY
        if cache is not None:
            span = self.attended_length(cache.lengths[i] + q_len, q_len)
            values = self._store_kv(i, cache, new_k, new_v, hidden)
            keys_t, values = cache.keys_by_feature(i, 0, span)[0], values[0, :, :span]
        else:
            span = q_len
            keys_t, values = new_k.transpose(1, 2), new_v
        if short and ctx.tree_parents is not None and cache is not None:
            out = self._tree_attention(q, keys_t, values, ctx)
        else:
            mask = step.masks.get(span, self.d.window(i))
            if short:
                out = self._short_attention(q, keys_t, values, mask, q_len)
            else:
                out = self._sdpa(layer.attn_module, q, keys_t.transpose(1, 2)[None], values[None], mask)
        h = hidden + layer.o(out)
        x = self.rms_norm(h, layer.post_norm)
        gu = layer.gate_up(x)
        act = F.silu(gu[..., : self.intermediate]) * gu[..., self.intermediate :]
        return h + layer.down(act)

    def _project(self, layer: FastLayer, hidden: torch.Tensor, step: FastStep):
        """The first half of a layer in PyTorch: input norm, the fused product, rotary embedding.
        Returns the queries (1, q, H, d), keys and values (KV, q, d)."""
        H, KV, d = self.heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(self.rms_norm(hidden, layer.in_norm)).view(1, hidden.shape[1], H + 2 * KV, d)
        qk = qkv[:, :, : H + KV]
        qk = qk * step.cos_heads + qk.roll(d // 2, -1) * step.sin_signed_heads
        return qk[:, :, :H], qk[0, :, H:].transpose(0, 1), qkv[0, :, H + KV :].transpose(0, 1)

    def _store_kv(self, i: int, cache: KVCache, new_k: torch.Tensor, new_v: torch.Tensor, hidden: torch.Tensor):
        """Append a step's keys and values (KV, q, d) to layer i; its value buffer."""
        start = cache.lengths[i]
        end = start + new_k.shape[1]
        self._cache_room(i, cache, end, hidden.dtype)
        cache.put_keys(i, start, new_k.transpose(1, 2)[None])
        cache.values[i][0, :, start:end] = new_v
        cache.lengths[i] = end
        return cache.values[i]

    def project_kv(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache) -> None:
        """Keys and values of `layers` for the step's positions, all from `hidden` (the first half
        of each layer), appended to the cache as `run_layer` stores them: in one call of decode.c
        where `run_native` could run these layers, else in PyTorch."""
        step = ctx.state_of(self)
        room = self._native_room(layers, hidden, ctx, step, cache)
        if room is None:
            for i in layers:
                _, new_k, new_v = self._project(self.layers[i], hidden, step)
                self._store_kv(i, cache, new_k, new_v, hidden)
            return
        start, keys = room
        self.native.project_kv(layers, hidden, start, keys, [cache.values[i] for i in layers], step.cos, step.sin)
        for i in layers:
            cache.lengths[i] += hidden.shape[1]

    def run_native(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None):
        """`layers` in one call of decode.c where `_native_room` allows it (a prompt up to
        `native_prompt_max` positions, in calls of PROMPT_CHUNK); None otherwise (the caller takes
        the PyTorch path). Causal (or tree) attention over the cache, no mask tensor needed; the
        same bits whether the layers run in one call or one call each, and a prompt's positions
        the bits one-token steps would give them."""
        step = ctx.state_of(self)
        room = self._native_room(layers, hidden, ctx, step, cache)
        if room is None:
            return None
        start, keys = room
        values = [cache.values[i] for i in layers]
        out = self.native.forward(layers, hidden, start, ctx.tree_parents, keys, values, step.cos, step.sin)
        for i in layers:
            cache.lengths[i] += hidden.shape[1]
        return out

    def forward_chain(self, input_ids: torch.Tensor, cache: KVCache | None, start: int | None,
                      last_only: bool) -> torch.Tensor | None:
        """`LayeredModel.forward`'s logits for up to SHORT_QUERY tokens that follow the cache's
        contents in every layer, in one call of decode.c (embedding, layers, final norm, head): the
        bits of `run_native` and `logits`, without the step context, masks and the calls' Python
        between them, which took a small model's one-token step about as long as its LM head. None
        where this path does not apply (the caller takes the general one)."""
        if not self.chains or cache is None:
            return None
        ids = input_ids.reshape(-1).tolist()
        first = cache.lengths[0]
        if len(ids) > SHORT_QUERY or start not in (None, first):
            return None
        out = self.forward_chains([(ids, cache, first, 1 if last_only else len(ids))])
        return None if out is None else out[0][None]

    def forward_chains(self, steps: list[tuple[list[int], KVCache, int, int]]) -> list[torch.Tensor | None] | None:
        """`LayeredModel.forward_batch`'s logits in one call of decode.c (embedding, layers, final
        norm, head of the wanted rows): the bits of `run_batch` and `logits`, without the steps'
        contexts, masks and the calls' Python between them (`forward_chain`'s path too, one
        sequence). None where this path does not apply."""
        if not self.chains or not steps:
            return None
        for ids, cache, start, _ in steps:
            if not self.batchable(cache, start, len(ids)) or not self._embeddable(ids):
                return None
        ids, segments, wanted = [], [], []
        for tokens, cache, start, count in steps:
            segments.append((len(tokens), start, self._cache_pointers(cache, start + len(tokens))))
            wanted += range(len(ids) + len(tokens) - count, len(ids) + len(tokens))
            ids += tokens
        rows = self.native.forward_chains(ids, segments, self.embedding, self.rotary.cos, self.rotary.sin,
                                          self.final_norm_weight, self.lm_head.native, wanted)
        logits, at = [], 0
        for tokens, cache, start, count in steps:
            cache.lengths = [start + len(tokens)] * len(cache.lengths)
            logits.append(rows[at : at + count] if count else None)
            at += count
        return logits

    def _embeddable(self, ids: list[int]) -> bool:
        """Whether forward_chain(s) may embed these token ids (else F.embedding's error comes from
        the general path)."""
        return bool(ids) and min(ids) >= 0 and max(ids) < self.embedding.shape[0]

    def _cache_pointers(self, cache: KVCache, end: int) -> bindings.CachePointers:
        """decode.c's arrays of the cache's buffers, each grown to hold `end` positions, and the
        rotary tables extended as far."""
        pointers = bindings.CachePointers.of(cache)
        if pointers.room < end:
            for i in range(len(self.layers)):
                self._cache_room(i, cache, end, self.dtype)
            pointers = bindings.CachePointers.of(cache)
        self.rotary.extend(end)
        return pointers

    def run_exit(self, hidden: torch.Tensor, resume: list[int], ctx: StepContext, cache: KVCache,
                 exits: bindings.Exits, propagate: bool) -> tuple[int, torch.Tensor] | None:
        """`LayeredModel.run_exit` in one call of decode.c, where every layer is native, the rows
        follow in order, and each layer holds the cache up to the first row that joins it."""
        if self.native is None or cache is None or ctx.tree_parents is not None:
            return None
        if propagate and hidden.shape[1] > 1:  # propagation leaves no exited positions: its steps have one row
            return None
        step = ctx.state_of(self)
        rows, first, count = hidden.shape[1], step.positions[0], len(self.layers)
        if step.positions != list(range(first, first + rows)) or not self.native.all_native:
            return None
        if any(cache.lengths[j] != first + joined for j, joined in enumerate(rows_waiting(resume, count))):
            return None
        keys = [self._cache_room(j, cache, first + rows, hidden.dtype) for j in range(count)]
        exit_layer, out = self.native.forward_exit(hidden, first, resume, exits, self.final_norm_weight, propagate,
                                                   keys, cache.values, step.cos, step.sin)
        for j in range(count):
            if j < exit_layer:
                cache.lengths[j] = first + rows
            elif propagate:
                cache.lengths[j] += 1
        return exit_layer, out

    def native_prompt(self, q_len: int) -> bool:
        """Whether a chain of q_len positions may run through decode.c: a short query always, a
        longer one (a prompt's part) up to `native_prompt_max`."""
        limit = self.native_prompt_max
        return q_len <= SHORT_QUERY or limit is None or q_len <= limit

    def batchable(self, cache: KVCache | None, start: int, q_len: int) -> bool:
        """Whether `run_batch` takes a chain of q_len tokens at `start` that follows `cache`'s
        contents, in chunks of at most SHORT_QUERY tokens: every layer native, a longer chain only
        where `native_prompt` takes a chain that long, the cache as long in every layer."""
        if self.native is None or cache is None or not self.native.all_native:
            return False
        if not self.native_prompt(q_len):
            return False
        return all(length == start for length in cache.lengths)

    def run_batch(self, steps: list[tuple[torch.Tensor, StepContext, KVCache]]) -> list[torch.Tensor]:
        """Every layer for several sequences' chains (hidden (1, q, d), their context, their cache;
        each `batchable`, of at most SHORT_QUERY tokens) in one call of decode.c; each output is
        the bits its step alone gives."""
        segments, cos, sin = [], [], []
        for hidden, ctx, cache in steps:
            step, q_len = ctx.state_of(self), hidden.shape[1]
            start = step.positions[0]
            keys = [self._cache_room(i, cache, start + q_len, hidden.dtype) for i in range(len(self.layers))]
            segments.append((q_len, start, keys, cache.values))
            cos.append(step.cos)
            sin.append(step.sin)
        hidden = torch.cat([h for h, _, _ in steps], dim=1)
        out = self.native.forward_batch(hidden, segments, torch.cat(cos), torch.cat(sin))
        for hidden, _, cache in steps:
            cache.lengths = [length + hidden.shape[1] for length in cache.lengths]
        return list(out.split([h.shape[1] for h, _, _ in steps], dim=1))

    def _native_room(self, layers: range, hidden: torch.Tensor, ctx: StepContext, step: FastStep,
                     cache: KVCache) -> tuple[int, list[torch.Tensor]] | None:
        """Where decode.c can take `layers` (consecutive, to the last at most) for this step in
        one call: each native and holding the cache up to the step's first position, which the
        step's positions follow (for a token tree, the slot its first row takes). Then (start,
        each layer's key buffer grown to hold the step); else None."""
        q_len = hidden.shape[1]
        long_prompt = q_len > SHORT_QUERY and not (self.native_prompt(q_len) and ctx.tree_parents is None)
        if self.native is None or cache is None or long_prompt:
            return None
        start = cache.lengths[layers[0]]
        if ctx.tree_parents is not None:
            in_order = ctx.tree_start == start
        else:
            in_order = step.positions == list(range(start, start + q_len))
        if not in_order or any(cache.lengths[i] != start or not self.native.runs(i) for i in layers):
            return None
        return start, [self._cache_room(i, cache, start + q_len, hidden.dtype) for i in layers]

    def _cache_room(self, i: int, cache: KVCache, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Layer i's key buffer of `dtype`, grown (in whole SPANs) to hold `end` positions."""
        keys = cache.keys[i]
        if keys is None or cache.capacity(i) < end or keys.dtype != dtype:
            cache.grow(i, -(-end // SPAN) * SPAN, (1, self.kv_heads, self.head_dim), dtype, self.device, exact=True)
            keys = cache.keys[i]
        return keys

    def attended_length(self, kv_len: int, q_len: int) -> int:
        """How many cache positions a step's attention reads: for short queries, `kv_len` rounded
        up to a multiple of SPAN, the positions past `kv_len` masked out (see the module
        docstring); otherwise `kv_len`."""
        if self.short_path and q_len <= SHORT_QUERY:
            return -(-kv_len // SPAN) * SPAN
        return kv_len

    def _short_attention(self, q, keys_t, values, mask, q_len):
        """`attention.short_query_attention` on the engine's layout: q (1, q, H, d), keys_t
        (KV, d, n) and values (KV, n, d), slices of the cache; returns (1, q, H*d)."""
        H, KV, G, d = self.heads, self.kv_heads, self.groups, self.head_dim
        pad = gpu_padding(q_len, q.device)
        rows = q_len + pad
        if pad:
            q = F.pad(q, (0, 0, 0, 0, 0, pad))
            mask = None if mask is None else with_rows_repeated(mask[:, :, -q_len:, : keys_t.shape[2]], pad)
        # three-dimensional products straight on the cache's slices: a four-dimensional matmul
        # copies its strided operand first (same results, checked by the tests)
        grouped = q.transpose(1, 2).reshape(KV, G * rows, d)
        scores = torch.bmm(grouped, keys_t).float().mul_(self.scale)
        if mask is not None:
            scores = scores.view(1, KV, G, rows, -1) + mask[:, :, -rows:, : keys_t.shape[2]].unsqueeze(2)
        probs = torch.softmax(scores, dim=-1).to(values.dtype).view(KV, G * rows, -1)
        out = split_k_matmul(probs, values, torch.bmm).view(1, H, rows, d)
        return out.transpose(1, 2)[:, :q_len].reshape(1, q_len, H * d)

    def _tree_attention(self, q, keys_t, values, ctx):
        """Short-query attention for a token tree, row by row, each row over the cache before the
        tree and its ancestors' slots packed after it, as its own chain would hold them: a row's
        products then add the same numbers in the same places (a tree mask alone would leave
        gaps, and the bfloat16 products' sums group by place)."""
        start, span = ctx.tree_start, keys_t.shape[-1]
        outs = []
        for r, slots in enumerate(tree_slots(ctx.tree_parents, start)):
            n = start + len(slots)
            packed_k, packed_v = torch.zeros_like(keys_t), torch.zeros_like(values)
            packed_k[..., :start], packed_v[:, :start] = keys_t[..., :start], values[:, :start]
            packed_k[..., start:n], packed_v[:, start:n] = keys_t[..., slots], values[:, slots]
            mask = torch.zeros(1, 1, 1, span, dtype=keys_t.dtype, device=keys_t.device)
            mask[..., n:] = torch.finfo(keys_t.dtype).min
            outs.append(self._short_attention(q[:, r : r + 1], packed_k, packed_v, mask, 1))
        return torch.cat(outs, dim=1)

    def _sdpa(self, module, q, keys, values, mask):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        out, _ = sdpa_attention_forward(module, q.transpose(1, 2), keys, values, mask, dropout=0.0,
                                        scaling=self.scale)
        return out.reshape(1, out.shape[1], -1)

    def linears(self) -> dict[str, Linear]:
        """Every linear by the name `packed` knows it by."""
        named = {"lm_head": self.lm_head}
        for i, layer in enumerate(self.layers):
            named |= {f"layers.{i}.{part}": getattr(layer, part) for part in ("qkv", "o", "gate_up", "down")}
        return named

    # -- accounting ---------------------------------------------------------------------------

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode token reads: every layer's linears, the norms, the LM head
        and one embedding row."""
        total = self.lm_head.weight_bytes() + self.final_norm_weight.numel() * self.final_norm_weight.element_size()
        for layer in self.layers:
            total += layer.weight_bytes()
            total += 2 * layer.in_norm.numel() * layer.in_norm.element_size()
        return total + self.embedding.shape[1] * self.embedding.element_size()
