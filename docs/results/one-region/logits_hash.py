"""A hash of the logits a model gives over a prompt, 24 greedy steps, a 6-row verification pass
and a batched call of two sequences: run it under two builds to check they give the same bits.
python docs/results/one-region/logits_hash.py MODEL"""
import argparse
import hashlib
import sys

import torch

from dyncomplete.models import load

model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
ids = model.tokenizer(open(argparse.__file__).read())["input_ids"][:300]
digest = hashlib.sha256()
with torch.inference_mode():
    cache = model.new_cache()
    logits = model.forward(torch.tensor(ids), cache)[0, -1]
    digest.update(logits.numpy().tobytes())
    tokens = []
    for k in range(24):
        tokens.append(int(logits.argmax()))
        logits = model.forward(torch.tensor(tokens[-1:]), cache, start=300 + k)[0, -1]
        digest.update(logits.numpy().tobytes())
    cache.crop(300)
    digest.update(model.score_chain(tokens[:6], cache, 300).numpy().tobytes())
    other = model.new_cache()
    model.forward(torch.tensor(ids[:200]), other)
    for out in model.forward_batch([(tokens[:3], cache, 306, 3), (ids[200:205], other, 200, 5)]):
        digest.update(out.numpy().tobytes())
print(sys.argv[1], digest.hexdigest()[:16])
