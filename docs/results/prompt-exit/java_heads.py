"""SmolLM2 translators trained on the Python train split plus the JDK java.base train split
(half the chunks each); saved to argv[1]. Not a shipped artefact: an experiment on line-java."""
import random, sys, time
from dyncomplete.data.jdk_source import jdk_java_root
from dyncomplete.data.splits import source_files
from dyncomplete.models import load
from dyncomplete.training.collect import CHUNK, SKIP, code_chunks, collect
from dyncomplete.training.translators import agreement, train_translators

model = load("smollm2-135m", dtype="auto", device="cpu", quant="auto", progress=lambda m: None)
layers = list(range(12, 30, 2))
py = code_chunks(model.tokenizer, "train", 75_000)
files = source_files(jdk_java_root(), lang="java", split="train")
random.Random(0).shuffle(files)
java, total = [], 0
for path in files:
    ids = model.tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
    if len(ids) < CHUNK:
        continue
    start = random.Random(f"0:{path.name}").randrange(len(ids) - CHUNK + 1)
    java.append(ids[start:start + CHUNK])
    total += CHUNK - SKIP
    if total >= 75_000:
        break
t = time.time()
data = collect(model, layers, py + java)
heads = train_translators(model, data, steps=1500)
heads.metadata = {"train_tokens": len(data), "data": "python + java train splits", "train_seconds": round(time.time() - t)}
print(heads.save(sys.argv[1], data=f"stdlib + jdk java.base train splits, {len(data)} tokens"), len(py), len(java), round(time.time() - t))
