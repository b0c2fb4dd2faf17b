"""A lean per-layer engine for llama and qwen2 decoders, with optional weight-only quantization.

`LayeredModel` keeps its five calls; for llama and qwen2 at inference they land here instead of
in the Hugging Face modules, which cost about two thirds of a SmolLM2 decode step in module
dispatch, hooks, keyword plumbing and small tensors made per call. This engine holds:

- per layer one fused query/key/value weight and one fused gate/up weight (the Hugging Face
  modules keep theirs as views into the fused tensors, so training code, peft and
  `LayeredModel.project_kv` still find `q_proj`, `k_proj`, ... with the same values and no
  second copy of the weights);
- the model's own RMSNorm as two tensor operations (the same arithmetic as Hugging Face's:
  float32 normalisation, rounded to the model dtype, then times the weight);
- rotary cos/sin tables computed once and sliced by position (the same values Hugging Face's
  rotary module gives, checked by the tests), applied to queries and keys at once;
- the KV cache of `kv_cache.py` (per-layer lengths, crop, copy, keys stored transposed),
  written in place, its buffers sized in whole multiples of SPAN positions;
- attention for short queries with grouped heads and the split reduction of `invariant.py`
  (the same operations as `attention.short_query_attention`), SDPA otherwise. Short queries
  read the cache in whole multiples of SPAN positions, the positions past the last key masked
  out (their probabilities are exactly 0 and the buffers start as zeros): the products then run
  on whole buffers, which the CPU's bfloat16 GEMM takes without a copy and with a shape it has
  seen (SmolLM2 int4: 17 ms against 14 ms per token, same tokens).

In the model's own dtype the engine computes bit for bit what the Hugging Face path computes
(fused products give each output the same sums as separate ones; checked by the tests), so
`generate` on the same weights stays a reference. Each position's result does not depend on how
many positions run together for queries of up to `SHORT_QUERY` tokens (verification passes),
as `invariant.py` requires for lossless speculative decoding in bfloat16.

Quantized weights (`quant="int8"` or `"int4"`) replace every linear layer, the LM head
included: int8 per output channel (symmetric) with PyTorch's CPU weight-only kernel; int4 in
groups of `INT4_GROUP` input features (asymmetric, scale and zero point per group) with the
native kernels of `native/decode.c`, which also run whole layers for short queries (`run_native`). Both give each row the same result at any row count (checked by the tests), so
verification passes stay identical to one-token decoding. The Hugging Face modules then hold the
dequantized weights, so the `hf` engine and `project_kv` see the same
model. Passes of more than `SHORT_QUERY` positions (prompts) multiply by those dequantized
weights instead: the weight-only kernels are compute-bound there (SmolLM2 prefill with PyTorch's
int4 kernel: 540 tokens/s against 950 in bfloat16), and every method prefills the same way, so
identity between methods holds.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import native
from .attention import SHORT_QUERY
from .invariant import BLOCK, split_k_matmul

FAST_KINDS = ("llama", "qwen2")
QUANTS = ("none", "int8", "int4")
INT4_GROUP = native.GROUP  # input features per int4 scale/zero pair (GGUF's Q4_0/Q4_1 block)
SPAN = 256  # short-query attention reads the cache in whole multiples of this many positions
TABLE_CHUNK = 256  # positions per chunk when building rotary tables (see `RotaryTables.extend`)
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope types whose frequencies never change


def default_quant(engine: str, device: torch.device, dtype: torch.dtype) -> str:
    """What `quant="auto"` means: int4 where this engine runs on a CPU in bfloat16 (measured on the
    benchmarks: the fastest format and within 0.3 ES of bfloat16 weights on line-py; README,
    "Speed against llama.cpp") and the native kernels build here, otherwise the model's own weights."""
    cpu_bf16 = engine == "fast" and device.type == "cpu" and dtype == torch.bfloat16
    return "int4" if cpu_bf16 and native.available() else "none"


def supports(model) -> bool:
    """Whether the fast engine can run this `LayeredModel` (llama or qwen2 with a static RoPE)."""
    if model.kind not in FAST_KINDS:
        return False
    rotary = getattr(model.core, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    return rotary is not None and rope_type in STATIC_ROPE and getattr(model.config, "hidden_act", "silu") == "silu"


# -- linear layers ------------------------------------------------------------------------------


def quantize_int8(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (int8 weight (N, K), scales (N,) in `dtype`)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(dtype)
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(weight: torch.Tensor, dtype: torch.dtype, group: int = INT4_GROUP):
    """Asymmetric int4 in groups of `group` input features, as `_weight_int4pack_mm_for_cpu` reads
    it: w ~ (q - 8) * scale + zero with q in 0..15. Returns (levels (N, K) int32, scales and zeros
    (K / group, N, 2) in `dtype`)."""
    n, k = weight.shape
    if k % group:
        raise ValueError(f"int4 needs input features divisible by {group}, got {k}")
    w = weight.detach().float().reshape(n, k // group, group)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp_min(1e-8).to(dtype).float()
    zeros = (lo + 8 * scales).to(dtype).float()
    q = torch.round((w - zeros[..., None]) / scales[..., None] + 8).clamp_(0, 15).to(torch.int32)
    packed_sz = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return q.reshape(n, k), packed_sz


class Linear:
    """y = x W^T (+ b) for x (..., K): plain weights (the model dtype), int8 or int4.

    Plain weights reduce over at most BLOCK inputs per product in low precision on the CPU (as
    `invariant.split_k_linear` does), so a row's result never depends on the rows beside it."""

    __slots__ = ("weight", "bias", "quant", "split", "wt", "qweight", "scales", "group", "in_features",
                 "out_features", "levels", "native")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, quant: str = "none",
                 invariant: bool = False, group: int = INT4_GROUP):
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias, self.quant, self.group = weight, bias, quant, group
        self.split = invariant and self.in_features > BLOCK
        self.wt = weight.t()
        self.qweight = self.scales = self.levels = self.native = None
        if quant == "int8":
            self.qweight, self.scales = quantize_int8(weight, weight.dtype)
        elif quant == "int4":
            if weight.dtype != torch.bfloat16 or group != native.GROUP:
                raise ValueError(f"int4 weights run in bfloat16 with groups of {native.GROUP}, not {weight.dtype}")
            native.library()  # builds the kernels now, or says why it cannot
            levels, self.scales = quantize_int4(weight, weight.dtype, group)
            self.qweight = native.pack_int4(levels, self.scales)
            self.native = native.linear_struct(self.qweight, bias, self.out_features)
            self.levels = levels  # kept until `dequantized` has run (see FastEngine)
        elif quant != "none":
            raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")

    def dequantized(self) -> torch.Tensor:
        """The weight the quantized kernel multiplies by, in the model dtype (plain: the weight)."""
        dtype = self.weight.dtype
        if self.quant == "int8":
            return (self.qweight.float() * self.scales.float()[:, None]).to(dtype)
        if self.quant == "int4":
            levels = self.levels.float().reshape(self.out_features, -1, self.group)
            sz = self.scales.float().transpose(0, 1)  # (N, K / group, 2)
            return ((levels - 8) * sz[..., :1] + sz[..., 1:]).reshape(self.out_features, -1).to(dtype)
        return self.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        quant = self.quant
        if quant == "none" or x.numel() > SHORT_QUERY * self.in_features:
            if not self.split:
                return F.linear(x, self.weight, self.bias)
            out = split_k_matmul(x, self.wt)
            return out if self.bias is None else out + self.bias
        rows = x.reshape(-1, self.in_features)
        if quant == "int4":
            rows = rows.contiguous()  # kept alive through the call
            n, lib = rows.shape[0], native.library()
            out = torch.empty(n, self.out_features, dtype=x.dtype)
            work = torch.empty(lib.linear_workspace_floats(self.in_features, self.out_features, n))
            lib.linear_bf16(ctypes.byref(self.native), rows.data_ptr(), n, out.data_ptr(), work.data_ptr())  # + bias
            return out.view(*x.shape[:-1], self.out_features)
        out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def weight_bytes(self) -> int:
        """Bytes read from memory by one product (weights, scales, bias)."""
        if self.quant == "none":
            n = self.weight.numel() * self.weight.element_size()
        elif self.quant == "int8":
            n = self.qweight.numel() + self.scales.numel() * self.scales.element_size()
        else:
            n = self.out_features * self.in_features // 2 + self.scales.numel() * self.scales.element_size()
        return n + (self.bias.numel() * self.bias.element_size() if self.bias is not None else 0)


# -- rotary tables ------------------------------------------------------------------------------


class RotaryTables:
    """cos and signed sin per position, in the model dtype, grown on demand.

    Values are computed as the Hugging Face rotary module computes them (float32 position x
    inverse frequency, cos/sin, times the attention scaling, rounded to the dtype), in chunks of
    TABLE_CHUNK positions so that every element takes the vectorised path that module takes for
    one decode position (a tail element would go through the scalar cos, which may differ in the
    last bit). `sin_signed` is sin with its first half negated: rotate_half(x) * sin ==
    roll(x, d/2) * sin_signed exactly."""

    def __init__(self, rotary_emb, dtype: torch.dtype, device: torch.device):
        self.inv_freq = rotary_emb.inv_freq.detach().to(device=device, dtype=torch.float32)
        self.scaling = float(getattr(rotary_emb, "attention_scaling", 1.0))
        self.dtype, self.device = dtype, device
        half = self.inv_freq.numel()
        self.sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(device=device, dtype=dtype)
        self.cos = torch.empty(0, 2 * half, dtype=dtype, device=device)
        self.sin = torch.empty_like(self.cos)
        self.sin_signed = torch.empty_like(self.cos)

    def extend(self, length: int) -> None:
        if length <= self.cos.shape[0]:
            return
        length = max(length, 2 * self.cos.shape[0], 4 * TABLE_CHUNK)
        length = -(-length // TABLE_CHUNK) * TABLE_CHUNK
        cos, sin = [self.cos], [self.sin]
        with torch.inference_mode(False), torch.no_grad():
            for start in range(self.cos.shape[0], length, TABLE_CHUNK):
                positions = torch.arange(start, start + TABLE_CHUNK, device=self.device).float()
                freqs = positions[:, None] * self.inv_freq
                emb = torch.cat((freqs, freqs), dim=-1)
                cos.append((emb.cos() * self.scaling).to(self.dtype))
                sin.append((emb.sin() * self.scaling).to(self.dtype))
            self.cos, self.sin = torch.cat(cos), torch.cat(sin)
            self.sin_signed = self.sin * self.sign

    def at(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cos, sin, sin_signed), each (q, head_dim), for the given positions."""
        first, n = positions[0], len(positions)
        self.extend(max(positions) + 1)
        if positions == list(range(first, first + n)):
            return self.cos[first : first + n], self.sin[first : first + n], self.sin_signed[first : first + n]
        index = torch.tensor(positions, device=self.device)
        return self.cos[index], self.sin[index], self.sin_signed[index]


def tree_slots(parents: list[int], start: int) -> list[list[int]]:
    """Per row of a token tree in slots start, start + 1, ...: the slots of its ancestors and
    itself, oldest first."""
    slots: list[list[int]] = []
    for r, parent in enumerate(parents):
        slots.append((slots[parent] if parent >= 0 else []) + [start + r])
    return slots


# -- the engine ---------------------------------------------------------------------------------


class FastLayer:
    __slots__ = ("in_norm", "post_norm", "qkv", "o", "gate_up", "down", "attn_module")

    def __init__(self, in_norm, post_norm, qkv, o, gate_up, down, attn_module):
        self.in_norm, self.post_norm = in_norm, post_norm
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.attn_module = attn_module


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


def _set_weight(linear: torch.nn.Linear, value: torch.Tensor) -> None:
    with torch.no_grad():
        linear.weight.copy_(value)


class FastEngine:
    """Per-layer computation for a llama/qwen2 `LayeredModel` (see the module docstring)."""

    def __init__(self, model, quant: str = "none"):
        if not supports(model):
            raise ValueError(f"the fast engine runs llama and qwen2 (static RoPE, SiLU), not {model.kind}")
        if quant not in QUANTS:
            raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
        self.model = model
        self.quant = quant
        config = model.config
        dtype, device = model.dtype, model.device
        if quant != "none" and device.type != "cpu":
            raise ValueError("quantized weights use PyTorch's CPU kernels: run them on the CPU")
        self.dtype, self.device = dtype, device
        invariant = device.type == "cpu" and dtype != torch.float32
        self.short_path = invariant  # the plain short-query attention (attention.py's rule)
        attn0 = model.layers[0].self_attn
        self.head_dim = attn0.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.scale = attn0.scaling
        self.intermediate = config.intermediate_size
        self.eps = model.core.norm.variance_epsilon
        self.rotary = RotaryTables(model.core.rotary_emb, dtype, device)
        self.layers: list[FastLayer] = []
        with torch.no_grad():
            for layer in model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv_w, qkv_b = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
                gu_w, gu_b = _fuse([mlp.gate_proj, mlp.up_proj])
                fast = FastLayer(
                    layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                    Linear(qkv_w, qkv_b, quant, invariant),
                    Linear(attn.o_proj.weight, attn.o_proj.bias, quant, invariant),
                    Linear(gu_w, gu_b, quant, invariant),
                    Linear(mlp.down_proj.weight, mlp.down_proj.bias, quant, invariant),
                    attn,
                )
                if quant != "none":  # the Hugging Face modules get the weights the kernels use
                    for lin in (fast.qkv, fast.o, fast.gate_up, fast.down):
                        lin.weight.copy_(lin.dequantized())
                        lin.levels = None
                self.layers.append(fast)
            self.final_norm_weight = model.core.norm.weight
            self.native_layers = self._native_layers() if quant == "int4" else None
            head = model.lm_head
            self.lm_head = Linear(head.weight, head.bias, quant, invariant)
            if quant != "none":  # tied embeddings get the dequantized rows too: one consistent model
                head.weight.copy_(self.lm_head.dequantized())
                self.lm_head.levels = None
        self.embedding = model.core.embed_tokens.weight

    def _native_layers(self) -> list:
        """decode.c's view of every layer (pointers into this engine's tensors), its dimensions and
        scratch; the layers run there for short queries on full-attention layers."""
        if self.head_dim % 32:
            raise ValueError(f"int4 decoding needs a head dimension divisible by 32, not {self.head_dim}")
        self.dims = native.Dims(self.model.hidden_size, self.heads, self.kv_heads, self.head_dim, self.intermediate,
                                self.eps, self.scale)
        self.workspace = torch.empty(native.library().workspace_floats(ctypes.byref(self.dims), SHORT_QUERY))
        structs = []
        for layer, kind in zip(self.layers, self.model.layer_types):
            if kind != "full_attention":
                structs.append(None)
                continue
            norms = [w.detach().contiguous() for w in (layer.in_norm, layer.post_norm)]
            layer.in_norm, layer.post_norm = norms  # the same values; decode.c reads them in place
            structs.append(native.Layer(norms[0].data_ptr(), norms[1].data_ptr(),
                                        *(lin.native for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))))
        # pointers to every layer's struct, for `run_native` (None where a layer is not native)
        self.native_array = (ctypes.c_void_p * len(structs))(*[ctypes.addressof(l) if l else None for l in structs])
        return structs

    # -- the calls LayeredModel forwards ------------------------------------------------------

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # normalised in float32 and rounded to the dtype inside rms_norm, then times the weight:
        # Hugging Face's order of roundings (checked bit for bit by the tests)
        return F.rms_norm(x, (x.shape[-1],), None, self.eps) * weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(hidden, self.final_norm_weight)

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        return self.lm_head(normed)

    def run_layer(self, i: int, hidden: torch.Tensor, ctx, cache, mask) -> torch.Tensor:
        layer = self.layers[i]
        q_len = hidden.shape[1]
        done = self.run_native(range(i, i + 1), hidden, ctx, cache)
        if done is not None:
            return done
        q, new_k, new_v = self._project(layer, hidden, ctx)
        short = self.short_path and q_len <= SHORT_QUERY
        if cache is not None:
            span = self.attended_length(cache.lengths[i] + q_len, q_len)
            keys, values = self._store_kv(i, cache, new_k, new_v, hidden)
            keys_t, values = keys[0, :, :, :span], values[0, :, :span]
        else:
            keys_t, values = new_k.transpose(1, 2), new_v
        if short and ctx.tree_parents is not None and cache is not None:
            out = self._tree_attention(q, keys_t, values, ctx)
        elif short:
            out = self._short_attention(q, keys_t, values, mask, q_len)
        else:
            out = self._sdpa(layer.attn_module, q, keys_t.transpose(1, 2)[None], values[None], mask)
        h = hidden + layer.o(out)
        x = self.rms_norm(h, layer.post_norm)
        gu = layer.gate_up(x)
        act = F.silu(gu[..., : self.intermediate]) * gu[..., self.intermediate :]
        return h + layer.down(act)

    def _project(self, layer: FastLayer, hidden: torch.Tensor, ctx):
        """The first half of a layer in PyTorch: input norm, the fused product, rotary embedding.
        Returns the queries (1, q, H, d), keys and values (KV, q, d)."""
        H, KV, d = self.heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(self.rms_norm(hidden, layer.in_norm)).view(1, hidden.shape[1], H + 2 * KV, d)
        qk = qkv[:, :, : H + KV]
        qk = qk * ctx.fast_cos + qk.roll(d // 2, -1) * ctx.fast_sin_signed
        return qk[:, :, :H], qk[0, :, H:].transpose(0, 1), qkv[0, :, H + KV :].transpose(0, 1)

    def _store_kv(self, i: int, cache, new_k: torch.Tensor, new_v: torch.Tensor, hidden: torch.Tensor):
        """Append a step's keys and values (KV, q, d) to layer i; its key and value buffers."""
        start = cache.lengths[i]
        end = start + new_k.shape[1]
        keys = self._cache_room(i, cache, end, hidden)
        keys[0, :, :, start:end] = new_k.transpose(1, 2)
        cache.values[i][0, :, start:end] = new_v
        cache.lengths[i] = end
        return keys, cache.values[i]

    def project_kv(self, layers: range, hidden: torch.Tensor, ctx, cache) -> None:
        """Keys and values of `layers` for the step's positions, all from `hidden` (the first half
        of each layer), appended to the cache as `run_layer` stores them: in one call of decode.c
        where `run_native` could run these layers, else in PyTorch."""
        native_args = self._native_args(layers, hidden, ctx, cache)
        if native_args is None:
            for i in layers:
                _, new_k, new_v = self._project(self.layers[i], hidden, ctx)
                self._store_kv(i, cache, new_k, new_v, hidden)
            return
        start, first, n, keys, values, capacities = native_args
        q_len = hidden.shape[1]
        hidden = hidden.contiguous()  # kept alive through the call
        native.library().layers_project_kv(
            ctypes.byref(self.dims), first, n, hidden.data_ptr(), q_len, start, keys, values, capacities,
            ctx.fast_cos.data_ptr(), ctx.fast_sin.data_ptr(), self.workspace.data_ptr())
        for i in layers:
            cache.lengths[i] += q_len

    def run_native(self, layers: range, hidden: torch.Tensor, ctx, cache) -> torch.Tensor | None:
        """`layers` in one call of decode.c where `_native_args` allows it; None otherwise (the
        caller takes the PyTorch path). Causal (or tree) attention over the cache, no mask tensor
        needed; the same bits whether the layers run in one call or one call each."""
        native_args = self._native_args(layers, hidden, ctx, cache)
        if native_args is None:
            return None
        start, first, n, keys, values, capacities = native_args
        q_len, tree = hidden.shape[1], ctx.tree_parents
        parents = (ctypes.c_int * q_len)(*tree) if tree is not None else None
        hidden = hidden.contiguous()  # kept alive through the call
        out = torch.empty_like(hidden)
        native.library().layers_forward(
            ctypes.byref(self.dims), first, n, hidden.data_ptr(), out.data_ptr(), q_len, start, parents, keys, values,
            capacities, ctx.fast_cos.data_ptr(), ctx.fast_sin.data_ptr(), self.workspace.data_ptr())
        for i in layers:
            cache.lengths[i] += q_len
        return out

    def _native_args(self, layers: range, hidden: torch.Tensor, ctx, cache) -> tuple | None:
        """Where decode.c can take `layers` (consecutive, to the last at most) for this step in
        one call: each native and holding the cache up to the step's first position, which the
        step's positions follow (for a token tree, the slot its first row takes). Then (start,
        the first layer's entry, n, and per layer the key buffers, grown to hold the step, the
        value buffers and their capacities) as decode.c takes them; else None."""
        q_len = hidden.shape[1]
        if self.native_layers is None or cache is None or q_len > SHORT_QUERY:
            return None
        start = cache.lengths[layers[0]]
        if ctx.tree_parents is not None:
            in_order = ctx.tree_start == start
        else:
            in_order = ctx.position_list == list(range(start, start + q_len))
        if not in_order or any(cache.lengths[i] != start or self.native_layers[i] is None for i in layers):
            return None
        keys = [self._cache_room(i, cache, start + q_len, hidden) for i in layers]
        n = len(keys)
        return (start, ctypes.addressof(self.native_array) + layers[0] * ctypes.sizeof(ctypes.c_void_p), n,
                (ctypes.c_void_p * n)(*[k.data_ptr() for k in keys]),
                (ctypes.c_void_p * n)(*[cache.values[i].data_ptr() for i in layers]),
                (ctypes.c_int * n)(*[k.shape[-1] for k in keys]))

    def _cache_room(self, i: int, cache, end: int, hidden: torch.Tensor) -> torch.Tensor:
        """Layer i's key buffer, grown (in whole SPANs) to hold `end` positions."""
        keys = cache.keys[i]
        if keys is None or keys.shape[-1] < end or keys.dtype != hidden.dtype:
            cache.grow(i, -(-end // SPAN) * SPAN, (1, self.kv_heads, self.head_dim), hidden.dtype, hidden.device,
                       exact=True)
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
        # three-dimensional products straight on the cache's slices: a four-dimensional matmul
        # copies its strided operand first (same results, checked by the tests)
        grouped = q.transpose(1, 2).reshape(KV, G * q_len, d)
        scores = torch.bmm(grouped, keys_t).float().mul_(self.scale)
        if mask is not None:
            scores = scores.view(1, KV, G, q_len, -1) + mask[:, :, -q_len:, : keys_t.shape[2]].unsqueeze(2)
        probs = torch.softmax(scores, dim=-1).to(values.dtype).view(KV, G * q_len, -1)
        out = split_k_matmul(probs, values, torch.bmm).view(1, H, q_len, d)
        return out.transpose(1, 2).reshape(1, q_len, H * d)

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

    # -- accounting ---------------------------------------------------------------------------

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode token reads: every layer's linears, the norms, the LM head
        and one embedding row."""
        total = self.lm_head.weight_bytes() + self.final_norm_weight.numel() * self.final_norm_weight.element_size()
        for layer in self.layers:
            total += sum(lin.weight_bytes() for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
            total += 2 * layer.in_norm.numel() * layer.in_norm.element_size()
        return total + self.embedding.shape[1] * self.embedding.element_size()
