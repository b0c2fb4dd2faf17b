"""Exit heads: turn the hidden state after e of L layers into next-token logits.

Exit layer e means "the hidden state after layers 0..e-1" (1 <= e < L). Every head ends in the
model's own final norm and LM head (one shared head: its 49k-row matrix is the costliest part
of a small model, so no head gets its own). `lens` applies them directly (the logit lens, the
untrained reference); `translator` first applies a per-layer affine map trained to match the
final layer's distribution (tuned-lens style, started from a least-squares fit).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ASSETS = Path(__file__).resolve().parent.parent / "assets"
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
        if self.kind == "lens":
            return hidden
        return self.maps[str(e)](hidden)

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
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for e in self.layers:
            lin = self.maps[str(e)]
            tensors[f"{e}.weight"] = lin.weight.detach().float().contiguous()
            tensors[f"{e}.bias"] = lin.bias.detach().float().contiguous()
        save_file(tensors, str(path))
        meta = {
            "model": self.model.name,
            "model_sha256": self.model.source_sha256,
            "kind": self.kind,
            "layers": self.layers,
            "hidden_size": self.model.hidden_size,
            "data": data,
            "date": datetime.date.today().isoformat(),
            **self.metadata,
        }
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        return path


def lens_heads(model, layers=None) -> ExitHeads:
    """The untrained reference: final norm + LM head on intermediate layers (default every 2nd)."""
    return ExitHeads(model, layers if layers is not None else range(2, model.num_layers, 2), "lens")


def default_path(model) -> Path:
    return ASSETS / model.name / HEADS_FILE


def read_record(path: Path, model, what: str) -> dict:
    """The JSON record saved beside a trained artefact; refuses one trained for other weights."""
    meta = json.loads(path.with_suffix(".json").read_text())
    want = meta.get("model_sha256")
    if want and model.source_sha256 and want != model.source_sha256:
        raise ValueError(f"{what} {path} was trained for other weights (sha256 {want[:12]}...)")
    return meta


def load_heads(model, path=None) -> ExitHeads:
    """Trained translators from `path` (default: the shipped ones of this model), else lens heads
    on every second layer. Refuses heads trained for other weights (hash or width mismatch)."""
    explicit = path is not None
    path = Path(path) if explicit else default_path(model)
    if not path.is_file():
        if explicit:
            raise FileNotFoundError(f"no exit heads at {path}")
        return lens_heads(model)
    meta = read_record(path, model, "exit heads")
    if meta["hidden_size"] != model.hidden_size:
        raise ValueError(f"exit heads {path} have width {meta['hidden_size']}, the model {model.hidden_size}")
    tensors = load_file(str(path))
    maps = {}
    for e in meta["layers"]:
        lin = torch.nn.Linear(model.hidden_size, model.hidden_size, device=model.device, dtype=model.dtype)
        with torch.no_grad():
            lin.weight.copy_(tensors[f"{e}.weight"])
            lin.bias.copy_(tensors[f"{e}.bias"])
        maps[e] = lin.requires_grad_(False)
    heads = ExitHeads(model, meta["layers"], meta["kind"], maps)
    heads.metadata = meta
    return heads
