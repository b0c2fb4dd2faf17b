"""The calls into decode.c: one int4 or int8 product, a run of whole layers (or their keys and values
alone) for short queries, and an early-exit step with its decisions inside the layer loop."""

from __future__ import annotations

import ctypes
import operator
from dataclasses import dataclass

import torch

from ..kv_cache import KEY_BLOCK
from . import ACTIVATIONS, FEATURES, MAX_DENSE, MAX_SEGMENTS, MAX_WIDTH, Dense, Dims, ExitNet, ExitPlan, Layer, Linear, library


def capacities(keys: list[torch.Tensor]):
    """Each key buffer's positions (kv_cache's blocked keys), as decode.c takes them."""
    return (ctypes.c_int * len(keys))(*[k.shape[2] * KEY_BLOCK for k in keys])


def linear(weights: Linear, rows: torch.Tensor) -> torch.Tensor:
    """rows (n, K) bf16 times the packed int4 or int8 `weights` (bias included): (n, N)."""
    rows = rows.contiguous()  # kept alive through the call
    n, lib = rows.shape[0], library()
    out = torch.empty(n, weights.out, dtype=rows.dtype)
    work = torch.empty(lib.linear_workspace_floats(weights.in_, weights.out, n))
    lib.linear_bf16(ctypes.byref(weights), rows.data_ptr(), n, out.data_ptr(), work.data_ptr())
    return out


def final_norm(dims: Dims, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The model's final norm (`weight` (hidden,) bf16) of hidden (..., hidden) bf16, row by row."""
    rows = hidden.reshape(-1, dims.hidden).contiguous()  # kept alive through the call
    out = torch.empty_like(rows)
    library().final_norm_bf16(ctypes.byref(dims), weight.data_ptr(), rows.data_ptr(), rows.shape[0], out.data_ptr())
    return out.view(hidden.shape)


def final_logits(dims: Dims, weight: torch.Tensor, head: Linear, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits (..., vocab) of hidden (..., hidden) bf16: `final_norm`, then the packed LM
    `head`, in one call; the values of `linear` on `final_norm`'s rows."""
    rows = hidden.reshape(-1, dims.hidden).contiguous()  # kept alive through the call
    n, lib = rows.shape[0], library()
    out = torch.empty(n, head.out)
    work = torch.empty(lib.logits_workspace_floats(dims.hidden, n))
    lib.final_logits(ctypes.byref(dims), weight.data_ptr(), ctypes.byref(head), rows.data_ptr(), n, out.data_ptr(),
                     work.data_ptr())
    return out.view(*hidden.shape[:-1], head.out)


def rotate_keys(src: list[torch.Tensor], source: int, dst: list[torch.Tensor], start: int, n: int,
                cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Each layer's keys (1, heads, blocks, d, KEY_BLOCK) bf16 of positions source .. source + n - 1
    in `src`, rotated by the angles of `cos` and `sin` (d / 2 float32), written at start .. of
    `dst`: `rotary.rotate_keys`'s bits, for every layer in one call."""
    if any(k.dtype != torch.bfloat16 or not k.is_contiguous() for k in src + dst):
        raise ValueError("native key rotation takes contiguous bfloat16 key buffers")
    layers, (_, heads, _, d, _) = len(src), src[0].shape
    cos, sin = cos.float().contiguous(), sin.float().contiguous()  # kept alive through the call
    library().rotate_keys_bf16(
        layers, heads, d, n, (ctypes.c_void_p * layers)(*[k.data_ptr() for k in src]), capacities(src), source,
        (ctypes.c_void_p * layers)(*[k.data_ptr() for k in dst]), capacities(dst), start, cos.data_ptr(),
        sin.data_ptr())


class CachePointers:
    """decode.c's arrays of one cache's key and value buffers and their capacities, kept on the
    cache (`KVCache.pointers`) and built again only when a buffer changed (built every step, they
    were a visible part of a one-token step's Python time). `room`: the positions every layer
    holds, 0 where one lacks a bfloat16 buffer (decode.c's)."""

    def __init__(self, keys: list[torch.Tensor | None], values: list[torch.Tensor | None]):
        self.keys, self.values = list(keys), list(values)  # kept: the pointers stay valid
        whole = all(k is not None and k.dtype == torch.bfloat16 for k in keys)
        self.room = min(k.shape[2] for k in keys) * KEY_BLOCK if whole else 0
        if whole:
            self.key_ptrs = (ctypes.c_void_p * len(keys))(*[k.data_ptr() for k in keys])
            self.value_ptrs = (ctypes.c_void_p * len(values))(*[v.data_ptr() for v in values])
            self.capacities = capacities(keys)

    @classmethod
    def of(cls, cache) -> "CachePointers":
        """`cache.pointers`, built again if a buffer changed since."""
        kept = cache.pointers
        if kept is None or not (all(map(operator.is_, kept.keys, cache.keys))
                                and all(map(operator.is_, kept.values, cache.values))):
            kept = cache.pointers = cls(cache.keys, cache.values)
        return kept


@dataclass
class ExitNetwork:
    """A hidden-state exit policy's network at one check layer, as decode.c runs it: `features`
    (a key of native.FEATURES) of the hidden state, then `linears` ((weight (out, in), bias)
    float32 pairs) with `activation` between them; the last gives one logit (P(exit) its sigmoid)
    or two, (continue, exit) (P(exit) their softmax's second)."""

    features: str
    activation: str
    linears: list[tuple[torch.Tensor, torch.Tensor]]


class Exits:
    """decode.c's exit decisions for one policy at one threshold: the check layers, each with its
    network (None: the check exits without deciding, as `static` does); exit when P > threshold.
    Holds the float32 copies the struct points into."""

    def __init__(self, checks: dict[int, ExitNetwork | None], threshold: float):
        self.layers = sorted(checks)
        self.kept: list[torch.Tensor] = []
        nets = (ExitNet * max(1, len(self.layers)))()
        for k, e in enumerate(self.layers):
            if checks[e] is not None:
                nets[k] = self._net(checks[e])
        self.layer_table = (ctypes.c_int * max(1, len(self.layers)))(*self.layers)
        self.nets = nets
        self.struct = ExitPlan(len(self.layers), ctypes.addressof(self.layer_table), ctypes.addressof(nets),
                               threshold, None)

    def probability(self, dims: Dims, e: int, hidden: torch.Tensor, final_norm: torch.Tensor, layers: int) -> float:
        """P(exit) decode.c's check at exit layer e (one of `self.layers`, with a network) gives
        hidden (d,) bf16."""
        hidden = hidden.contiguous()  # kept alive through the call
        net = ctypes.byref(self.nets[self.layers.index(e)])
        return library().exit_probability(ctypes.byref(dims), net, final_norm.data_ptr(), hidden.data_ptr(), e, layers)

    def _net(self, network: ExitNetwork) -> ExitNet:
        if not 1 <= len(network.linears) <= MAX_DENSE:
            raise ValueError(f"an exit network has 1 to {MAX_DENSE} dense layers, not {len(network.linears)}")
        if network.linears[-1][0].shape[0] not in (1, 2):
            raise ValueError("an exit network ends in one logit or two (continue, exit)")
        dense = []
        for weight, bias in network.linears:
            weight, bias = weight.detach().float().contiguous(), bias.detach().float().contiguous()
            if max(weight.shape) > MAX_WIDTH:
                raise ValueError(f"an exit network's widths are at most {MAX_WIDTH}, not {tuple(weight.shape)}")
            self.kept += [weight, bias]
            dense.append(Dense(weight.data_ptr(), bias.data_ptr(), weight.shape[0], weight.shape[1]))
        dense += [Dense()] * (MAX_DENSE - len(dense))
        return ExitNet(FEATURES[network.features], ACTIVATIONS[network.activation], len(network.linears),
                       (Dense * MAX_DENSE)(*dense))


class Layers:
    """decode.c's view of a model's layers (None where a layer stays in PyTorch), their dimensions
    and one scratch buffer for up to `max_rows` rows. The structs point into the caller's tensors,
    which must outlive this object."""

    def __init__(self, dims: Dims, layers: list[Layer | None], max_rows: int):
        self.dims, self.layers, self.max_rows = dims, layers, max_rows
        self.all_native = all(layer is not None for layer in layers)
        self.workspace = torch.empty(library().workspace_floats(ctypes.byref(dims), max_rows))
        self.table = (ctypes.c_void_p * len(layers))(*[ctypes.addressof(l) if l else None for l in layers])
        # forward_chains' embedded rows and output, the rows' rotary angles, the rows the head
        # takes and its scratch, grown on demand (`_chain_scratch`)
        self.chain = self.angles = self.picked = self.head_workspace = None

    def runs(self, i: int) -> bool:
        return self.layers[i] is not None

    def _args(self, layers: range, keys: list[torch.Tensor], values: list[torch.Tensor]) -> tuple:
        """The first layer's entry of the table, the count, and per layer the key buffers, value
        buffers and their capacities, as decode.c takes them."""
        n = len(keys)
        return (ctypes.addressof(self.table) + layers[0] * ctypes.sizeof(ctypes.c_void_p), n,
                (ctypes.c_void_p * n)(*[k.data_ptr() for k in keys]),
                (ctypes.c_void_p * n)(*[v.data_ptr() for v in values]), capacities(keys))

    def forward(self, layers: range, hidden: torch.Tensor, start: int, parents: list[int] | None,
                keys: list[torch.Tensor], values: list[torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """`layers` on hidden (1, q, d) whose rows take cache slots start, start + 1, ...
        (`parents`: a token tree's, else a chain); writes their keys and values into the buffers
        and returns the last layer's output. `cos`/`sin` (q, head_dim): the rows' rotary tables.
        A chain longer than the scratch holds runs in calls of `max_rows` rows, in order: a row's
        bits do not depend on the call it is in."""
        first, n, key_ptrs, value_ptrs, capacities = self._args(layers, keys, values)
        q_len = hidden.shape[1]
        if parents is not None and q_len > self.max_rows:
            raise ValueError(f"a token tree takes at most {self.max_rows} rows (the scratch's), not {q_len}")
        tree = (ctypes.c_int * q_len)(*parents) if parents is not None else None
        hidden = hidden.contiguous()  # kept alive through the calls
        out = torch.empty_like(hidden)
        for a in range(0, q_len, self.max_rows):
            library().layers_forward(
                ctypes.byref(self.dims), first, n, hidden[:, a:].data_ptr(), out[:, a:].data_ptr(),
                min(self.max_rows, q_len - a), start + a, tree, key_ptrs, value_ptrs, capacities, cos[a:].data_ptr(),
                sin[a:].data_ptr(), self.workspace.data_ptr())
        return out

    def _workspace_for(self, rows: int) -> None:
        """The scratch grown to `rows` rows: batches are larger than a verification pass."""
        if rows > self.max_rows:
            self.max_rows = rows
            self.workspace = torch.empty(library().workspace_floats(ctypes.byref(self.dims), rows))

    def _chain_scratch(self, rows: int, logit_rows: int) -> None:
        """forward_chains' buffers, grown to hold `rows` rows and `logit_rows` rows of logits."""
        hidden, head_dim = self.dims.hidden, self.dims.head_dim
        if self.chain is None or self.chain.shape[1] < rows:
            self.chain = torch.empty(2, rows, hidden, dtype=torch.bfloat16)
            self.angles = torch.empty(2, rows, head_dim, dtype=torch.bfloat16)
        self._workspace_for(rows)
        if self.picked is None or self.picked.shape[0] < logit_rows:
            self.picked = torch.empty(logit_rows, hidden, dtype=torch.bfloat16)
            self.head_workspace = torch.empty(library().logits_workspace_floats(hidden, logit_rows))

    def forward_chains(self, ids: list[int], segments: list[tuple[int, int, CachePointers]], embedding: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, norm_weight: torch.Tensor, head: Linear,
                       logit_rows: list[int]) -> torch.Tensor:
        """Float32 logits (len(logit_rows), vocab) of the listed rows of several sequences' chains
        run together (continuous batching): `ids` holds each segment's tokens in order, a segment
        being (rows, start, its cache's pointers). Embedding rows, every layer, final norm and head
        in one call, the bits of `forward_batch` and `final_logits` on the same rows."""
        rows, n = len(ids), len(segments)
        if not 1 <= n <= MAX_SEGMENTS:
            raise ValueError(f"a batched call takes 1 to {MAX_SEGMENTS} sequences, not {n}")
        self._chain_scratch(rows, len(logit_rows))
        logits = torch.empty(len(logit_rows), head.out)
        library().forward_chains(
            ctypes.byref(self.dims), ctypes.addressof(self.table), len(self.layers), embedding.data_ptr(),
            (ctypes.c_int * rows)(*ids), n, (ctypes.c_int * n)(*[r for r, _, _ in segments]),
            (ctypes.c_int * n)(*[start for _, start, _ in segments]),
            (ctypes.c_void_p * n)(*[ctypes.addressof(p.key_ptrs) for _, _, p in segments]),
            (ctypes.c_void_p * n)(*[ctypes.addressof(p.value_ptrs) for _, _, p in segments]),
            (ctypes.c_void_p * n)(*[ctypes.addressof(p.capacities) for _, _, p in segments]),
            cos.data_ptr(), sin.data_ptr(), self.workspace.data_ptr(), self.chain[0].data_ptr(),
            self.chain[1].data_ptr(), self.angles[0].data_ptr(), self.angles[1].data_ptr(), norm_weight.data_ptr(),
            ctypes.byref(head), len(logit_rows), (ctypes.c_int * len(logit_rows))(*logit_rows),
            self.picked.data_ptr(), logits.data_ptr(), self.head_workspace.data_ptr())
        return logits

    def forward_batch(self, hidden: torch.Tensor, segments: list[tuple[int, int, list[torch.Tensor], list[torch.Tensor]]],
                      cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Every layer for the rows of several sequences at once (continuous batching): hidden
        (1, q, d) holds each segment's rows in order, a segment being (rows, start, every layer's key
        buffers, every layer's value buffers) of one sequence's cache; `cos`/`sin` (q, head_dim).
        Writes each segment's keys and values in its own cache; returns the last layer's output."""
        count, n = len(self.layers), len(segments)
        if not 1 <= n <= MAX_SEGMENTS:
            raise ValueError(f"a batched call takes 1 to {MAX_SEGMENTS} sequences, not {n}")
        keys = [k for _, _, ks, _ in segments for k in ks]
        values = [v for _, _, _, vs in segments for v in vs]
        self._workspace_for(hidden.shape[1])
        hidden = hidden.contiguous()  # kept alive through the call
        out = torch.empty_like(hidden)
        library().layers_forward_batch(
            ctypes.byref(self.dims), ctypes.addressof(self.table), count, hidden.data_ptr(), out.data_ptr(), n,
            (ctypes.c_int * n)(*[rows for rows, _, _, _ in segments]),
            (ctypes.c_int * n)(*[start for _, start, _, _ in segments]),
            (ctypes.c_void_p * len(keys))(*[k.data_ptr() for k in keys]),
            (ctypes.c_void_p * len(values))(*[v.data_ptr() for v in values]),
            capacities(keys), cos.data_ptr(), sin.data_ptr(),
            self.workspace.data_ptr())
        return out

    def project_kv(self, layers: range, hidden: torch.Tensor, start: int, keys: list[torch.Tensor],
                   values: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor) -> None:
        """The keys and values of `layers`, all from hidden (1, q, d), written at slots start, ...
        (in calls of at most `max_rows` rows, as `forward`)."""
        first, n, key_ptrs, value_ptrs, capacities = self._args(layers, keys, values)
        q_len = hidden.shape[1]
        hidden = hidden.contiguous()  # kept alive through the calls
        for a in range(0, q_len, self.max_rows):
            library().layers_project_kv(
                ctypes.byref(self.dims), first, n, hidden[:, a:].data_ptr(), min(self.max_rows, q_len - a), start + a,
                key_ptrs, value_ptrs, capacities, cos[a:].data_ptr(), sin[a:].data_ptr(), self.workspace.data_ptr())

    def forward_exit(self, hidden: torch.Tensor, first: int, resume: list[int], exits: Exits, final_norm: torch.Tensor,
                     propagate: bool, keys: list[torch.Tensor], values: list[torch.Tensor], cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[int, torch.Tensor]:
        """One early-exit step over all layers (decode.c's `layers_forward_exit`): hidden (1, q, d),
        rows in cache slots first, first + 1, ..., row r joining at layer resume[r] (the last row, the
        new token, at 0); keys and values of every layer. Returns the exit layer (the layer count
        where the token went through) and each row's state after the last layer it ran."""
        first_layer, n, key_ptrs, value_ptrs, capacities = self._args(range(len(self.layers)), keys, values)
        rows = hidden.shape[1]
        out = hidden.contiguous().clone()  # decode.c works on it in place
        workspace = self.workspace
        if rows > self.max_rows:  # more exited positions to catch up than a verification pass has rows
            workspace = torch.empty(library().workspace_floats(ctypes.byref(self.dims), rows))
        exits.struct.final_norm = final_norm.data_ptr()
        exit_layer = library().layers_forward_exit(
            ctypes.byref(self.dims), first_layer, n, out.data_ptr(), rows, first, (ctypes.c_int * rows)(*resume),
            ctypes.byref(exits.struct), int(propagate), key_ptrs, value_ptrs, capacities, cos.data_ptr(), sin.data_ptr(),
            workspace.data_ptr())
        return exit_layer, out
