"""llama.cpp, through llama-cpp-python, as a reference decoding method: the model's own GGUF file,
quantised as published, run by the usual CPU engine for local models.

Names: `llama-cpp` (greedy decoding), `llama-cpp:prompt-lookup` (llama-cpp-python's
`LlamaPromptLookupDecoding` draft model with `num_pred_tokens=10` and `max_ngram_size=2`, the
values of HF's prompt lookup) and `llama-cpp:cache-prompt` (greedy decoding that keeps the KV
cache of the previous request and prefills only what follows the longest common prefix, as
llama-server does with `cache_prompt`, its default: the like-for-like reference for an editor
session against our server's prefix cache). It keeps it where the caller passes a KV cache (the
server, for a request with its prefix cache on); without one (`bench`, `"prefix_cache": false`)
it prefills the whole prompt, as `llama-cpp` does. Like llama-server's, its completions can
differ from a full prefill's: llama.cpp's logits depend on how the prompt was split in batches.
Needs the `reference` extra: `bash install-reference.sh` (see it for why not AMX).

What is the same as every other method:
- the prompt: the method gets our tokenizer's ids and hands them to llama.cpp as they are (no
  re-tokenising, no BOS added). The GGUF's vocabulary is checked against our tokenizer's when
  the model loads (every id, same token text), so the ids mean the same thing;
- the stop rules: every token llama.cpp yields goes through our `Emitter`, and the token
  generator is closed as soon as the emitter is done (no extra step);
- the threads: `n_threads` and `n_threads_batch` are `torch.get_num_threads()`.

What is not: llama.cpp computes with the quantised weights (Q4_1 for SmolLM2) and its own
kernels, where our engine runs the dequantised weights in float32 or bfloat16. So its greedy
completions are close to, not identical with, `baseline`'s (70% of line-py completions on
SmolLM2). Against itself, `llama-cpp:prompt-lookup` verifies every drafted position with the same
greedy sampler on the target's own logits, but it is lossless only as far as llama.cpp's logits
do not depend on how many tokens a batch holds:
- both methods run with flash attention. llama.cpp's other CPU attention path is not
  batch-invariant: on SmolLM2 a token evaluated inside a batch of 2-11 got logits up to 0.9 away
  from the same token evaluated alone, so a verified draft could flip a near-tie. Decoding with
  flash attention was no slower;
- flash attention is still not batch-invariant with more than one thread once the KV cache holds
  512 positions or more (llama.cpp pads it in steps of 256). A one-token step then splits the
  keys across threads and merges partial sums (split-KV decoding), while a batch of draft tokens
  takes the whole key range on one thread. With one thread, or shorter contexts, the logits
  agree exactly and so do the tokens. With 2 threads on line-py prompts of about 600 tokens,
  2 of 20 completions differed from `llama-cpp`'s.

Greedy: at temperature 0 llama-cpp-python's sampler chain is a no-op penalties stage (repeat
penalty 1, no frequency/presence penalty) and llama.cpp's greedy sampler, an argmax over the
logits (first index on a tie, as `torch.argmax`). At temperature > 0 the chain is temperature
then a seeded draw (`params.seed`, else 0); llama.cpp applies top-p before the temperature, ours
after, so top_p < 1 is refused rather than sampled from another distribution.

Timing: `Llama.generate` evaluates the whole prompt (`Llama.reset()` first: no prefix reuse
between calls, as in our other methods; `cache-prompt` skips the reset and llama-cpp-python
evaluates only the prompt past the longest prefix its cache shares with it), samples, and only
then yields the first token; prefill is the time until that first token is yielded, decode the
rest, and the prompt tokens not fed before it count as `cached_prompt_tokens`. Work:
`Llama.eval` is wrapped on the instance, so every batch fed to the model is counted: layer_evals
= num_layers x tokens fed after the prompt (+1 for the prompt's last position, as in
`hf-generate`), head_evals likewise.
In prompt-lookup every eval after the prompt is one verification step: drafted = the batch less
its first token, accepted = tokens yielded from that batch less one (the last step may be cut
short by the emitter, so its accepted count is what the emitter took).

llama-cpp-python needs `logits_all=True` with a draft model (it checks drafts on the logits of
every position), so in prompt-lookup the prefill also computes and copies the LM head for every
prompt position: its prefill is slower than `llama-cpp`'s by that much; decode is unaffected.
The `Llama` object is loaded once per method instance (mmap'd, `verbose=False`) and reloaded
only when a prompt plus `max_new_tokens` no longer fits its context (n_ctx: 4096, or more in
steps of 1024). Token healing is not supported.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import torch

from ..engine import Completion, DecodingMethod, Emitter, Stats, eos_ids_of
from ..models import REGISTRY, registered_gguf

PROMPT_LOOKUP_TOKENS = 10  # as hf-generate:prompt-lookup
PROMPT_LOOKUP_NGRAM = 2  # HF's max_matching_ngram_size default
MIN_CONTEXT = 4096
MISSING_EXTRA = ("llama-cpp needs llama-cpp-python: bash install-reference.sh in a checkout "
                 "(or pip install 'dyncomplete[reference]' on a CPU without AMX)")


def import_llama_cpp():
    """The `llama_cpp` module, or a one-line ValueError naming the extra to install."""
    try:
        import llama_cpp
    except ImportError:
        raise ValueError(MISSING_EXTRA) from None
    return llama_cpp


def gguf_path_of(model) -> Path:
    """The GGUF file llama.cpp runs for `model`: the registry's assembled, hash-checked file for an
    alias, or the `.gguf` file the model was loaded from."""
    name = str(model.name)
    if name in REGISTRY:
        return registered_gguf(name, progress=lambda m: None)
    path = Path(name).expanduser()
    if name.endswith(".gguf") and path.is_file():
        return path
    raise ValueError(f"llama-cpp needs a registered alias or a .gguf model, not {name!r} "
                     "(it runs the GGUF file itself)")


def vocab_mismatches(llm, tokenizer, limit: int = 5) -> tuple[int, list[tuple[int, str, str | None]]]:
    """Compare llama.cpp's vocabulary with our tokenizer's: (llama.cpp's vocabulary size, up to
    `limit` ids whose token text differs as (id, llama.cpp's text, ours)). Ids our tokenizer does
    not know (None, e.g. padding entries of the GGUF) are skipped."""
    lib = import_llama_cpp()
    vocab = lib.llama_model_get_vocab(llm.model)
    n = lib.llama_vocab_n_tokens(vocab)
    ours = tokenizer.convert_ids_to_tokens(list(range(n)))
    bad = []
    for i, mine in enumerate(ours):
        if mine is None:
            continue
        theirs = lib.llama_vocab_get_text(vocab, i).decode("utf-8", errors="replace")
        if theirs != mine:
            bad.append((i, theirs, mine))
            if len(bad) >= limit:
                break
    return n, bad


class LlamaCpp(DecodingMethod):
    name = "llama-cpp"

    def __init__(self, model, mode: str = ""):
        self.lib = import_llama_cpp()
        self.mode = mode  # "", "prompt-lookup" or "cache-prompt"
        self.gguf = gguf_path_of(model)
        self.model_name = model.name
        self.llm = None
        self.n_ctx = 0
        self.threads = 0
        self.fed: list[int] = []  # tokens of each Llama.eval call in the current generate
        self.yielded: list[int] = []  # tokens yielded after each of those calls
        self.lock = threading.Lock()  # one Llama object, one KV state: concurrent requests take turns

    def _llama(self, model, needed: int):
        """The cached Llama object, (re)loaded when the model, thread count or context changed."""
        threads = torch.get_num_threads()
        if model.name != self.model_name:
            self.gguf, self.model_name, self.llm = gguf_path_of(model), model.name, None
        if self.llm is not None and needed <= self.n_ctx and threads == self.threads:
            return self.llm
        n_ctx = max(MIN_CONTEXT, math.ceil(needed / 1024) * 1024)
        self.llm = None  # free the old one before loading the new one
        draft = None
        if self.mode == "prompt-lookup":
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(max_ngram_size=PROMPT_LOOKUP_NGRAM, num_pred_tokens=PROMPT_LOOKUP_TOKENS)
        llm = self.lib.Llama(
            model_path=str(self.gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, seed=0,
            draft_model=draft, logits_all=draft is not None,  # a draft model needs every position's logits
            flash_attn=True,  # batch-invariant attention: a verified draft gets the one-token logits
            verbose=False,
        )
        n_vocab, bad = vocab_mismatches(llm, model.tokenizer)
        if bad:
            shown = ", ".join(f"{i}: {a!r} vs ours {b!r}" for i, a, b in bad)
            raise ValueError(f"llama-cpp: the vocabulary of {self.gguf} differs from the model's tokenizer ({shown})")
        inner = llm.eval

        def counting_eval(tokens):  # Llama.generate calls self.eval: count what each call feeds
            self.fed.append(len(tokens))
            self.yielded.append(0)
            inner(tokens)

        llm.eval = counting_eval
        self.llm, self.n_ctx, self.threads = llm, n_ctx, threads
        return llm

    def weight_bytes(self) -> int:
        """Bytes of weights one llama.cpp decode step reads, in the GGUF's own formats: every
        tensor of the file, but one row of the token embeddings where the file has a separate
        output matrix (the bench's bandwidth column)."""
        from gguf import GGUFReader

        tensors = {t.name: (int(t.n_bytes), int(t.shape[-1])) for t in GGUFReader(self.gguf).tensors}
        if "output.weight" in tensors and "token_embd.weight" in tensors:
            size, rows = tensors.pop("token_embd.weight")
            return sum(n for n, _ in tensors.values()) + size // rows
        return sum(n for n, _ in tensors.values())

    @staticmethod
    def _sampling(params) -> dict:
        neutral = dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
        if params.temperature == 0:
            return dict(temp=0.0, top_k=1, **neutral)  # temp 0: llama.cpp's greedy sampler (argmax)
        if params.top_p < 1.0:
            raise ValueError("llama-cpp applies top-p before the temperature (dyncomplete after it): "
                             "sample with top_p=1 or use temperature 0")
        return dict(temp=params.temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, **neutral)

    def generate(self, model, prompt_ids, params, cache=None, on_text=None, cancelled=None) -> Completion:
        with self.lock:
            return self._generate(model, prompt_ids, params, on_text, cancelled,
                                  keep=self.mode == "cache-prompt" and cache is not None)

    def _generate(self, model, prompt_ids, params, on_text, cancelled, keep: bool) -> Completion:
        if not prompt_ids:
            raise ValueError("empty prompt: nothing to complete")
        if params.token_healing:
            raise ValueError("llama-cpp does not support token healing")
        sampling = self._sampling(params)
        llm = self._llama(model, len(prompt_ids) + params.max_new_tokens + PROMPT_LOOKUP_TOKENS + 1)
        if not keep:
            llm.reset()  # no KV reuse from the previous call: the whole prompt is prefilled, as elsewhere
        llm.set_seed(params.seed if params.seed is not None else 0)
        stats = Stats(model=model.name, method=self.name, prompt_tokens=len(prompt_ids))
        emitter = Emitter(model.tokenizer, params, eos_ids_of(model), stats, on_text, cancelled)
        self.fed, self.yielded = [], []
        first, prefilled = None, 0
        start = time.perf_counter()
        tokens = llm.generate(list(prompt_ids), reset=True, **sampling)
        try:
            for token in tokens:
                if first is None:
                    first, prefilled = time.perf_counter(), sum(self.fed)
                if self.fed:  # (cache-prompt, the whole prompt cached: its first token comes with no eval)
                    self.yielded[-1] += 1
                if emitter.emit(int(token), model.num_layers, "full"):
                    break
        finally:
            tokens.close()
        end = time.perf_counter()
        if not emitter.done:
            emitter.finish("max_tokens")
        if first is None:  # nothing was yielded: all that was fed was the prompt
            first, prefilled = end, sum(self.fed)
        stats.prefill_s, stats.decode_s = first - start, end - first
        stats.cached_prompt_tokens = max(len(prompt_ids) - prefilled, 0)
        decode_tokens = sum(self.fed) - prefilled + 1  # +1: the prompt's last position (as in baseline)
        stats.count_full_steps(decode_tokens, model.num_layers)
        if self.mode == "prompt-lookup":
            for fed, yielded in zip(self.fed[1:], self.yielded[1:]):
                stats.record_draft(fed - 1, max(yielded - 1, 0))
        return Completion(emitter.text, emitter.ids, stats)


def build(name, model) -> LlamaCpp:
    variant = name.arg(0)
    if variant not in ("", "prompt-lookup", "cache-prompt"):
        raise ValueError(f"unknown llama-cpp variant {variant!r}: use llama-cpp, llama-cpp:prompt-lookup or "
                         "llama-cpp:cache-prompt")
    return LlamaCpp(model, variant)
