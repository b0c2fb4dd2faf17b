"""The tuned Qwen's stop rule trained on fill-in-the-middle middles (results.md, "The stop rule
trained on middles"): 1,500 FIM examples of the train split (`training.fim.fim_examples`, the
prompts the engine sends), teacher-forced; a middle token is wrong where the model's top-1 is not
the real one (the end-of-middle token included). Writes two rules into OUT: `stop_fim` (middles
only) and `stop_mix` (middles plus `train-stop`'s 12,000 plain-code tokens). To measure one, copy
it over dyncomplete/assets/qwen2.5-coder-0.5b-lite/stop_rule.* and run `bench`. Not a test, not
shipped. Usage: python fim_stop.py OUT"""
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from dyncomplete.exits.heads import load_heads
from dyncomplete.models import load
from dyncomplete.training.classifier import fit_mlp
from dyncomplete.training.collect import cached_collect
from dyncomplete.training.fim import fim_examples
from dyncomplete.training.stop_rule import save_stop_rule, wrong_labels

EXAMPLES = 1500
out = Path(sys.argv[1])
model = load("qwen2.5-coder-0.5b-lite", dtype="auto", device="cpu", quant="auto", progress=lambda *_: None)
rows, wrong = [], []
with torch.inference_mode():
    for ids, first in tqdm(fim_examples(model.tokenizer, "train", EXAMPLES, budget=512)):
        ctx = model.context(torch.arange(len(ids)))
        hidden = model.run_layers(0, model.embed(torch.tensor(ids).reshape(1, -1), ctx), ctx, model.new_cache())
        normed = model.final_norm(hidden[:, first - 1 : len(ids) - 1])[0]
        rows.append(normed.to(torch.bfloat16))
        wrong.append(model.head(normed[None]).float()[0].argmax(-1) != torch.tensor(ids[first:]))
fim_x, fim_y = torch.cat(rows).float(), torch.cat(wrong).float()
plain = cached_collect(model, load_heads(model).layers, "train", 12000)
idx, plain_y = wrong_labels(plain)
variants = {"stop_fim": (fim_x, fim_y, "FIM middles"),
            "stop_mix": (torch.cat([fim_x, plain.final_normed[idx].float()]), torch.cat([fim_y, plain_y.float()]),
                         "FIM middles + plain code")}
for name, (x, y, what) in variants.items():
    torch.manual_seed(0)
    mlp = fit_mlp(x, y, 400, 512)
    meta = {"data": f"{what} of the stdlib train split, {len(y)} tokens, {float(y.mean()):.3f} wrong", "steps": 400}
    print(save_stop_rule(model, mlp, out / f"{name}.safetensors", meta))
