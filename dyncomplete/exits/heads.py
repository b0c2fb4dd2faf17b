"""Exit heads: turn the hidden state after e of L layers into next-token logits.

Exit layer e means "the hidden state after layers 0..e-1" (1 <= e < L). Every head ends in the
model's own final norm and LM head (one shared head: its 49k-row matrix is the costliest part
of a small model, so no head gets its own). `lens` applies them directly (the logit lens, the
untrained reference); `translator` first applies a per-layer affine map trained to match the
final layer's distribution (tuned-lens style, started from a least-squares fit).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch

from . import artefacts

HEADS_FILE = "exit_heads.safetensors"


class ExitHeads(torch.nn.Module):
    """Per-layer maps (identity for `lens`) followed by the final norm and the shared LM head."""

    def __init__(self, model, layers, kind: str = "lens", maps: dict[int, torch.nn.Linear] | None = None):
        super().__init__()
        layers = sorted(set(int(e) for e in layers))
        if not layers or layers[0] < 1 or layers[-1] >= model.num_layers:
            raise ValueError(f"exit layers must lie in 1..{model.num_layers - 1}, got {layers}")
        if kind not in ("lens", "translator"):
            raise ValueError(f"unknown head kind {kind!r}: use lens or translator")
        self.model = model
        self.layers = layers
        self.kind = kind
        self.maps = torch.nn.ModuleDict({str(e): maps[e] for e in layers} if maps else {})
        self.metadata: dict = {}

    def translate(self, e: int, hidden: torch.Tensor) -> torch.Tensor:
        """The map in its own dtype (float32 on a CPU, see `load_heads`), back in the hidden's."""
        if self.kind == "lens":
            return hidden
        linear = self.maps[str(e)]
        return linear(hidden.to(linear.weight.dtype)).to(hidden.dtype)

    def normed(self, e: int, hidden: torch.Tensor) -> torch.Tensor:
        """Translator + final norm: what the LM head reads."""
        return self.model.final_norm(self.translate(e, hidden))

    def logits(self, e: int, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.head(self.normed(e, hidden)).float()

    def map_macs(self) -> float:
        """Multiply-accumulates of one translator application for one token (0 for lens)."""
        return 0.0 if self.kind == "lens" else float(self.model.hidden_size) ** 2

    def save(self, path: Path, data: str = "") -> Path:
        """Weights (float32 safetensors) plus a JSON record of what they were trained for."""
        tensors = {}
        for e in self.layers:
            tensors[f"{e}.weight"] = self.maps[str(e)].weight
            tensors[f"{e}.bias"] = self.maps[str(e)].bias
        record = {**artefacts.model_record(self.model), "kind": self.kind, "layers": self.layers,
                  "hidden_size": self.model.hidden_size, "data": data, "date": datetime.date.today().isoformat(),
                  **self.metadata}
        return artefacts.save_artefact(path, tensors, record)


def lens_heads(model, layers=None) -> ExitHeads:
    """The untrained reference: final norm + LM head on intermediate layers (default every 2nd)."""
    return ExitHeads(model, layers if layers is not None else range(2, model.num_layers, 2), "lens")


def default_path(model) -> Path:
    return artefacts.default_path(model, HEADS_FILE)


def load_heads(model, path=None) -> ExitHeads:
    """Trained translators from `path` (default: the shipped ones of this model), else lens heads
    on every second layer. Refuses heads trained for other weights (hash or width mismatch)."""
    if path is None and not default_path(model).is_file():
        return lens_heads(model)
    path = Path(path) if path is not None else default_path(model)
    tensors, meta = artefacts.load_artefact(path, model, "exit heads")
    if meta["hidden_size"] != model.hidden_size:
        raise ValueError(f"exit heads {path} have width {meta['hidden_size']}, the model {model.hidden_size}")
    maps = {}
    # float32 on a CPU: PyTorch's bfloat16 matrix-vector product there took 0.12 ms per exit check
    # on SmolLM2, float32 0.02 ms (half a decoder layer against a tenth)
    dtype = torch.float32 if model.device.type == "cpu" else model.dtype
    for e in meta["layers"]:
        lin = torch.nn.Linear(model.hidden_size, model.hidden_size, device=model.device, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(tensors[f"{e}.weight"])
            lin.bias.copy_(tensors[f"{e}.bias"])
        maps[e] = lin.requires_grad_(False)
    heads = ExitHeads(model, meta["layers"], meta["kind"], maps)
    heads.metadata = meta
    return heads
