"""SmolLM2 translators trained on the Python train split plus the JDK java.base train split
(half the chunks each); saved to argv[1]. Not a shipped artefact: an experiment on line-java."""
import sys, time
from dyncomplete.data.jdk_source import jdk_java_root
from dyncomplete.models import load
from dyncomplete.training.collect import code_chunks, collect
from dyncomplete.training.translators import train_translators

model = load("smollm2-135m", dtype="auto", device="cpu", quant="auto", progress=lambda m: None)
layers = list(range(12, 30, 2))
py = code_chunks(model.tokenizer, "train", 75_000)
java = code_chunks(model.tokenizer, "train", 75_000, root=jdk_java_root(), lang="java")
t = time.time()
data = collect(model, layers, py + java)
heads = train_translators(model, data, steps=1500)
heads.metadata = {"train_tokens": len(data), "data": "python + java train splits", "train_seconds": round(time.time() - t)}
print(heads.save(sys.argv[1], data=f"stdlib + jdk java.base train splits, {len(data)} tokens"), len(py), len(java), round(time.time() - t))
