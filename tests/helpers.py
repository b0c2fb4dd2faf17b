"""What several test files share: prompts cut from the standard library, tiny random-weight models
(no download), a tiny model the server can serve, the presets of the real servers the `server`
fixture (conftest.py) starts, jobs run through the serve worker, the alone-against-a-pass
bit check, and int4 products timed on this thread and on a later one."""

import json
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers import Gemma3TextConfig, GPT2Config, LlamaConfig, OPTConfig, Qwen2Config

from dyncomplete.models import native
from dyncomplete.models.weights import BITS, Linear
from dyncomplete.paths import cpu_has_bf16


def run_jobs(worker, jobs, cancel_after: dict[int, int] | None = None):
    """Submit every job to the serve worker at once, wait for each one's final event and return
    them in order. `cancel_after`: job index -> cancel it once it streamed that many text events."""
    finals, texts, done = {}, {i: [] for i in range(len(jobs))}, threading.Event()

    def sink(i):
        def emit(event):
            if event[0] == "text":
                texts[i].append(event[1])
                if cancel_after and len(texts[i]) == cancel_after.get(i):
                    jobs[i].cancel("disconnected")
            if event[0] in ("done", "error"):
                finals[i] = event
                if len(finals) == len(jobs):
                    done.set()
        return emit

    for i, job in enumerate(jobs):
        job.emit = sink(i)
        worker.submit(job)
    assert done.wait(600)
    return [finals[i] for i in range(len(jobs))]


def same_bits_alone_and_in_a_pass(model, ids, k=8) -> list[bool]:
    """For each of the last k positions of `ids`: whether its logits from one-token steps equal,
    bit for bit, those of one k-position pass (a verification pass) after the same cached start."""
    start = len(ids) - k
    alone_cache, together_cache = model.new_cache(), model.new_cache()
    model.forward(torch.tensor(ids[:start]), alone_cache)
    model.forward(torch.tensor(ids[:start]), together_cache)
    alone = [model.forward(torch.tensor([ids[start + i]]), alone_cache, start=start + i)[0, -1] for i in range(k)]
    together = model.forward(torch.tensor(ids[start:]), together_cache, start=start, last_only=False)[0]
    return [torch.equal(together[i], alone[i]) for i in range(k)]


def products_here_and_on_a_later_thread(between) -> tuple[float, float]:
    """Seconds of an int4 product (Qwen 0.5B's gate-up width) on this thread, before and after the
    rest, and, after `between()` ran here, on threads started after it: the server loads and sets
    up in one thread and decodes in another, and an OpenMP pool left alive here slows every call
    of every other one. The fastest of many short rounds on each side, since a busy machine only
    adds time; three later threads, each followed by rounds here, since one thread's rounds fit
    in a fraction of a second that a neighbour's burst can cover (a pool left alive slows all
    three)."""
    lin = Linear(torch.randn(4864, 896, dtype=torch.bfloat16), None, "int4")
    x = torch.randn(1, 896, dtype=torch.bfloat16)

    def per_call(out: list) -> None:
        for _ in range(15):
            start = time.perf_counter()
            for _ in range(100):
                lin(x)
            out.append((time.perf_counter() - start) / 100)

    here, there = [], []
    per_call(here)
    between()
    for _ in range(3):
        later = threading.Thread(target=per_call, args=(there,))
        later.start()
        later.join()
        per_call(here)
    native.release_thread_pool()  # the last rounds brought this thread's pool back; the tests' `between` had freed it
    return min(here), min(there)


def ids_of(model, text):
    return model.tokenizer(text, add_special_tokens=False).input_ids


def stdlib_prompts(n=20, chars=400):
    """Deterministic prompts cut from real CPython standard-library files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)[: n * 3 : 3]
    prompts = []
    for path in files[:n]:
        text = path.read_text(encoding="utf-8", errors="replace")
        cut = text.find("\n", len(text) // 2)
        prompts.append(text[max(0, cut - chars) : cut + 1])
    return prompts


TINY = {
    "llama": LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128),
    "qwen2": Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128),
    "gemma3": Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                               max_position_embeddings=128, final_logit_softcapping=30.0,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                            "sliding_attention"]),
    "gpt2": GPT2Config(vocab_size=128, n_embd=32, n_layer=3, n_head=4, n_positions=128),
    "opt": OPTConfig(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=3, num_attention_heads=4,
                     max_position_embeddings=128, word_embed_proj_dim=16),
}


def tiny_model(kind):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(TINY[kind]).eval()


TINY_SERVED = "tiny-llama"
FIM_SPECIALS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]  # Qwen2.5-Coder's names


def byte_tokenizer(fim: bool):
    """A byte-level tokenizer built here: one token per byte, an end-of-text token and, with `fim`,
    Qwen2.5-Coder's fill-in-the-middle tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                                   additional_special_tokens=FIM_SPECIALS if fim else [])


def tiny_served_model(fim: bool = True):
    """A 3-layer llama with random weights and `byte_tokenizer`, as `LayeredModel` named
    TINY_SERVED: what the server needs of a model, with no weights to download."""
    from dyncomplete.models import LayeredModel

    tokenizer = byte_tokenizer(fim)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    return LayeredModel(AutoModelForCausalLM.from_config(config).eval(), tokenizer, name=TINY_SERVED)


BODIES = Path(__file__).parent / "editor_bodies"  # what the editor plugins send, copied from their source


def body(file: str, **changes) -> dict:
    """An editor body of `editor_bodies/`, with some fields changed."""
    return {**json.loads((BODIES / file).read_text()), **changes}


def ollama_name(model: str) -> str:
    """How Continue names a model to Ollama (`qwen2.5-coder-0.5b` -> `qwen2.5-coder:0.5b`)."""
    head, _, tag = model.rpartition("-")
    return f"{head}:{tag}"


def ndjson(response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def sse(response) -> list[dict]:
    """The JSON events of a server-sent-events response (not `[DONE]`)."""
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


SERVE_KEY = "test-key"
PAGE_KEY = "page-key-3f9c1e"
EARLY_EXIT = "early-exit:confidence/lens@0.5"
SMOL, QWEN = "smollm2-135m", "qwen2.5-coder-0.5b"


@dataclass(frozen=True)
class Preset:
    """A `dyncomplete serve` process: `--model MODEL OPTIONS`; `key_file`: an API key the server
    reads from a file (`--api-key-file`, written with surrounding whitespace, which is stripped)."""
    model: str
    options: tuple[str, ...]
    key_file: str | None = None


# the memory of sent files and the kept answers are off for the editor presets: each test's answer
# is generated from its own body only (tests/test_suggestions.py serves with kept answers)
EDITOR_OPTIONS = ("--api-key", SERVE_KEY, "--max-tokens-limit", "48", "--context-budget", "512", "--cache-mb", "64",
                  "--client-memory", "off", "--suggestions", "off")
PRESETS = {
    # float32 SmolLM2, key SERVE_KEY: the server tests, the files-memory and n-gram editor tests, bench-session;
    # baseline, whose per-token stats they check (serve's own default, lookup, is the editor presets')
    "smollm": Preset(SMOL, ("--dtype", "float32", "--method", "baseline", "--api-key", SERVE_KEY, "--queue-size", "64",
                            "--timeout", "120", "--max-tokens-limit", "256", "--context-budget", "256", "--cache-mb",
                            "64", "--suggestions", "off")),
    "editor-smollm": Preset(SMOL, ("--dtype", "float32", *EDITOR_OPTIONS)),
    "editor-qwen": Preset(QWEN, EDITOR_OPTIONS),
    # the playground page: an early-exit method besides the default, the key from a file
    "page": Preset(SMOL, ("--dtype", "float32", "--method", "baseline", "--methods", f"baseline,{EARLY_EXIT}",
                          "--context-budget", "256", "--cache-mb", "64"), key_file=PAGE_KEY),
}


def rows_may_depend_on_count(request, model) -> None:
    """An expected failure for identity tests of a bfloat16 model on PyTorch's products where the
    CPU has no bfloat16 instructions: there the GEMM's rows depend on the row count
    (models/invariant.py, and `load` warns). The test still runs and is reported."""
    if model.dtype == torch.bfloat16 and model.quant not in BITS and not cpu_has_bf16():
        request.applymarker(pytest.mark.xfail(strict=False, reason="no bfloat16 instructions on this CPU: "
                                              "PyTorch's bfloat16 products depend on the row count"))
