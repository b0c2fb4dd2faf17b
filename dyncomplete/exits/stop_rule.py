"""Stop a completion that is going wrong (ICSE 2024: users almost never accept a completion
continued past a wrong token).

A small classifier reads the normed hidden state the LM head turned into the next token and
predicts whether that token is wrong (differs from the real code); trained teacher-forced on the
train split. `METHOD+stop:T` wraps any method: before each token is emitted the classifier runs
on the row of the latest LM-head call that produced it (rows are consumed in order, so a
verification pass over several positions works too), and when P(wrong) > T the completion ends
before that token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..decoding.baseline import DecodingMethod
from ..methods import register_wrapper
from .classifier import WIDTH, fit_mlp, new_mlp
from .collect import CHUNK, SKIP, Collected
from .heads import default_path, read_record

STOP_FILE = "stop_rule.safetensors"


def wrong_labels(data: Collected, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices, is-wrong) for every position whose next real token is in the data."""
    per_chunk = chunk - SKIP
    idx = torch.arange(len(data))
    idx = idx[(idx + 1) % per_chunk != 0]
    return idx, data.top_ids[idx, 0] != data.input_ids[idx + 1]


def train_stop_rule(data: Collected, steps: int = 400, batch: int = 512, seed: int = 0,
                    chunk: int = CHUNK) -> torch.nn.Module:
    torch.manual_seed(seed)
    idx, wrong = wrong_labels(data, chunk)
    return fit_mlp(data.final_normed[idx].float(), wrong.float(), steps, batch)


def save_stop_rule(model, mlp, path: Path, meta: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in mlp.state_dict().items()}, str(path))
    record = {"model": model.name, "model_sha256": model.source_sha256, "width": WIDTH, **meta}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return path


def load_stop_rule(model, path: Path | None = None) -> torch.nn.Module:
    path = Path(path) if path else default_path(model).with_name(STOP_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"no stop rule at {path}: run `dyncomplete train-stop`")
    meta = read_record(path, model, "stop rule")
    mlp = new_mlp(model.hidden_size)
    mlp.load_state_dict(load_file(str(path)))
    return mlp.requires_grad_(False)


class _HeadTap:
    """Records the rows every LM-head call reads, for the duration of one generation."""

    def __init__(self, model):
        self.model, self.rows, self.next = model, None, 0

    def __enter__(self):
        head = self.model.head

        def tapped(normed):
            self.rows, self.next = normed.reshape(-1, normed.shape[-1]), 0
            return head(normed)

        self.model.head = tapped
        return self

    def __exit__(self, *exc):
        del self.model.head  # the instance attribute; the class method shows through again

    def take(self) -> torch.Tensor | None:
        if self.rows is None or self.next >= len(self.rows):
            return None
        self.next += 1
        return self.rows[self.next - 1]


class StopRule(DecodingMethod):
    def __init__(self, inner: DecodingMethod, threshold: float, mlp: torch.nn.Module):
        self.inner, self.threshold, self.mlp = inner, float(threshold), mlp
        self.tap: _HeadTap | None = None

    def generate(self, model, *args, **kwargs):
        with _HeadTap(model) as self.tap:
            return super().generate(model, *args, **kwargs)

    def decode(self, model, prompt_ids, logits, cache, emitter, generator):
        emit, macs = emitter.emit, float(model.hidden_size * (WIDTH + 1) + WIDTH)

        def guarded(token, layers, source="full"):
            row = self.tap.take()
            if row is not None and not emitter.done:
                emitter.stats.extra_macs += macs
                if float(torch.sigmoid(self.mlp(row.float()))) > self.threshold:
                    emitter.finish("stop_rule")
                    return True
            return emit(token, layers, source)

        emitter.emit = guarded
        self.inner.decode(model, prompt_ids, logits, cache, emitter, generator)


def wrap(arg: str, model, inner: DecodingMethod) -> StopRule:
    try:
        threshold = float(arg)
    except ValueError:
        raise ValueError(f"stop takes a threshold, e.g. +stop:0.8, got {arg!r}") from None
    return StopRule(inner, threshold, load_stop_rule(model))


register_wrapper("stop", wrap)
