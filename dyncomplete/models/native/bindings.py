"""The calls into decode.c: one int4 product, and a run of whole layers (or their keys and
values alone) for short queries."""

from __future__ import annotations

import ctypes

import torch

from . import Dims, Layer, Linear, library


def linear(weights: Linear, rows: torch.Tensor) -> torch.Tensor:
    """rows (n, K) bf16 times the packed int4 `weights` (bias included): (n, N)."""
    rows = rows.contiguous()  # kept alive through the call
    n, lib = rows.shape[0], library()
    out = torch.empty(n, weights.out, dtype=rows.dtype)
    work = torch.empty(lib.linear_workspace_floats(weights.in_, weights.out, n))
    lib.linear_bf16(ctypes.byref(weights), rows.data_ptr(), n, out.data_ptr(), work.data_ptr())
    return out


class Layers:
    """decode.c's view of a model's layers (None where a layer stays in PyTorch), their dimensions
    and one scratch buffer for up to `max_rows` rows. The structs point into the caller's tensors,
    which must outlive this object."""

    def __init__(self, dims: Dims, layers: list[Layer | None], max_rows: int):
        self.dims, self.layers = dims, layers
        self.workspace = torch.empty(library().workspace_floats(ctypes.byref(dims), max_rows))
        self.table = (ctypes.c_void_p * len(layers))(*[ctypes.addressof(l) if l else None for l in layers])

    def runs(self, i: int) -> bool:
        return self.layers[i] is not None

    def _args(self, layers: range, keys: list[torch.Tensor], values: list[torch.Tensor]) -> tuple:
        """The first layer's entry of the table, the count, and per layer the key buffers, value
        buffers and their capacities, as decode.c takes them."""
        n = len(keys)
        return (ctypes.addressof(self.table) + layers[0] * ctypes.sizeof(ctypes.c_void_p), n,
                (ctypes.c_void_p * n)(*[k.data_ptr() for k in keys]),
                (ctypes.c_void_p * n)(*[v.data_ptr() for v in values]),
                (ctypes.c_int * n)(*[k.shape[-1] for k in keys]))

    def forward(self, layers: range, hidden: torch.Tensor, start: int, parents: list[int] | None,
                keys: list[torch.Tensor], values: list[torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """`layers` on hidden (1, q, d) whose rows take cache slots start, start + 1, ...
        (`parents`: a token tree's, else a chain); writes their keys and values into the buffers
        and returns the last layer's output. `cos`/`sin` (q, head_dim): the rows' rotary tables."""
        first, n, key_ptrs, value_ptrs, capacities = self._args(layers, keys, values)
        q_len = hidden.shape[1]
        tree = (ctypes.c_int * q_len)(*parents) if parents is not None else None
        hidden = hidden.contiguous()  # kept alive through the call
        out = torch.empty_like(hidden)
        library().layers_forward(
            ctypes.byref(self.dims), first, n, hidden.data_ptr(), out.data_ptr(), q_len, start, tree, key_ptrs,
            value_ptrs, capacities, cos.data_ptr(), sin.data_ptr(), self.workspace.data_ptr())
        return out

    def project_kv(self, layers: range, hidden: torch.Tensor, start: int, keys: list[torch.Tensor],
                   values: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor) -> None:
        """The keys and values of `layers`, all from hidden (1, q, d), written at slots start, ..."""
        first, n, key_ptrs, value_ptrs, capacities = self._args(layers, keys, values)
        q_len = hidden.shape[1]
        hidden = hidden.contiguous()  # kept alive through the call
        library().layers_project_kv(
            ctypes.byref(self.dims), first, n, hidden.data_ptr(), q_len, start, key_ptrs, value_ptrs, capacities,
            cos.data_ptr(), sin.data_ptr(), self.workspace.data_ptr())
