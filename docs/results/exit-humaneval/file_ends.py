"""Does the final layer predict the model's end token where a source file ends, and does an exit
head at LAYER? The last 128 tokens of each calib-split file that long, the verdict at the last:
python docs/results/exit-humaneval/file_ends.py MODEL LAYER QUANT [HEADS (default: the shipped)]"""
import sys

from dyncomplete.data.splits import source_files
from dyncomplete.exits.heads import load_heads
from dyncomplete.models import load
from dyncomplete.models.end_tokens import eos_ids_of
from dyncomplete.training.collect import SKIP, collect

name, layer, quant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = load(name, dtype="auto", device="cpu", quant=quant, progress=lambda m: None)
tails = []
for path in source_files(split="calib"):
    ids = model.tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
    if len(ids) >= 128:
        tails.append(ids[-128:])
data = collect(model, [layer], tails, progress=False)
last = [(k + 1) * (128 - SKIP) - 1 for k in range(len(tails))]
heads = load_heads(model, sys.argv[4] if len(sys.argv) > 4 else None)
exit_top = heads.logits(layer, data.hidden[layer][last].to(model.dtype)).argmax(-1).tolist()
final_top = data.top_ids[last, 0].tolist()
ends = eos_ids_of(model)
print(f"{name} ({quant}), {len(tails)} files: the final layer's top token is an end token at "
      f"{sum(t in ends for t in final_top)}; the exit at {layer}'s at {sum(t in ends for t in exit_top)}, "
      f"{sum(a == b and a in ends for a, b in zip(exit_top, final_top))} of them where the final layer's is")
