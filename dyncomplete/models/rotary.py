"""Rotary cos/sin tables computed once per model and sliced by position."""

from __future__ import annotations

import torch

TABLE_CHUNK = 256  # positions per chunk when building the tables (see `RotaryTables.extend`)


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


def shift_angles(delta: int, inv_freq: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (head_dim / 2, float32) of the rotation that moves a key `delta` positions on."""
    angle = delta * inv_freq.to(device=device, dtype=torch.float32)
    return angle.cos(), angle.sin()


def rotate_keys(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary-embedded keys stored (..., head_dim, n), moved `delta` positions on: a rotation by
    delta x each frequency, computed in float32 and rounded to the keys' dtype (not bit for bit
    the keys a prefill at the new positions would write)."""
    cos, sin = shift_angles(delta, inv_freq, keys.device)
    cos, sin = cos[:, None], sin[:, None]
    x = keys.float()
    half = x.shape[-2] // 2
    x1, x2 = x[..., :half, :], x[..., half:, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-2).to(keys.dtype)


def shift_frequencies(model) -> torch.Tensor | None:
    """The inverse frequencies by which `rotate_keys` moves a chunk of `model`'s cache, or None
    where keys cannot be moved that way (other position schemes, scaled or per-layer ropes)."""
    rotary = getattr(model.core, "rotary_emb", None)
    if model.kind not in ("llama", "qwen2") or rotary is None:
        return None
    if getattr(rotary, "rope_type", "default") != "default" or float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        return None
    return rotary.inv_freq.detach().float()
