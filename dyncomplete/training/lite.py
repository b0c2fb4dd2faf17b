"""LITE (GREEN-CODE's alternative to translators): fine-tune the model itself, with LoRA, so that
every exit layer decodes through the one final norm and LM head.

Loss = sum over exit layers e of w_e * next-token cross-entropy of head(final_norm(h_e)), with
weights 0.7 spread over the exit layers in the first half of the model, 0.2 over those in the
second half and 0.1 for the last layer, each spread decaying geometrically (r = 0.9).
"""

from __future__ import annotations

import random
import time

import torch
from tqdm import tqdm

from ..data.splits import source_files

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lite_weights(layers, num_layers: int, r: float = 0.9) -> dict[int, float]:
    """Exit layer (or num_layers for the last) -> loss weight; the weights sum to 1."""
    first = [e for e in layers if e <= num_layers // 2]
    second = [e for e in layers if num_layers // 2 < e < num_layers]
    weights = {}
    for group, total in ((first, 0.7), (second, 0.2)):
        raw = [r**k for k in range(len(group))]
        weights.update({e: total * w / sum(raw) for e, w in zip(group, raw)})
    weights[num_layers] = 0.1 if weights else 1.0
    scale = sum(weights.values())  # renormalise when a half has no exit layer
    return {e: w / scale for e, w in weights.items()}


def lite_loss(model, ids: torch.Tensor, weights: dict[int, float], start: int = 1) -> torch.Tensor:
    """Weighted next-token loss of every weighted layer on one (1, n) chunk, over the tokens from
    `start` on (a FIM example's middle; the whole chunk after its first token by default)."""
    ctx = model.context(torch.arange(ids.shape[1], device=ids.device))
    h = model.embed(ids, ctx)
    target = ids[0, start:]
    loss = h.new_zeros((), dtype=torch.float32)
    for i in range(model.num_layers):
        h = model.run_layer(i, h, ctx, None)
        if i + 1 in weights:
            logits = model.logits(h[0, start - 1 : -1])
            loss = loss + weights[i + 1] * torch.nn.functional.cross_entropy(logits, target)
    return loss


def split_chunks(tokenizer, split: str, chunk: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """Every whole `chunk`-token piece of every file of the split, shuffled, each trained on from
    its second token: fine-tuning reads far more text than the one chunk a file that the exit heads
    are fitted on."""
    chunks = []
    for path in source_files(split=split):
        ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
        chunks.extend((ids[i : i + chunk], 1) for i in range(0, len(ids) - chunk + 1, chunk))
    random.Random(seed).shuffle(chunks)
    return chunks


def train_lite(model, layers, examples, steps: int, lr: float = 2e-4, rank: int = 8, progress: bool = True,
               max_seconds: float | None = None, init=None):
    """Wrap the model's decoder in LoRA adapters (in place; `init`: the adapter folder to go on
    training) and train them on `examples` ((ids, first target index) pairs, one a step; AdamW,
    cosine decay of the learning rate over `steps`); stops early once `max_seconds` have passed.
    Returns the peft model and the loss of every step."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if init is None:
        peft_model = get_peft_model(model.hf, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS))
    else:
        peft_model = PeftModel.from_pretrained(model.hf, str(init), is_trainable=True)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    weights = lite_weights(layers, model.num_layers)
    losses = []
    began = time.monotonic()
    peft_model.train()
    bar = tqdm(range(steps), desc="lite", disable=not progress)
    for step in bar:
        ids, first = examples[step % len(examples)]
        loss = lite_loss(model, torch.tensor([ids], device=model.device), weights, first)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if max_seconds is not None and time.monotonic() - began > max_seconds:
            break
    peft_model.eval()
    return peft_model, losses
