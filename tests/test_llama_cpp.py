"""llama.cpp as a reference method (`llama-cpp`, `llama-cpp:prompt-lookup`) on the real SmolLM2 GGUF:
our prompt ids go in unchanged (same vocabulary), our stop rules end it, prompt lookup is lossless
against llama.cpp's own greedy decoding, and a missing extra is a one-line error. The tests that
run llama.cpp are skipped where llama-cpp-python is not installed."""

import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import stdlib_prompts

from dyncomplete.engine import GenerationParams
from dyncomplete.methods import make_method

pytestmark = pytest.mark.model

NEW_TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """llama.cpp's threads meet at spinning barriers after every operation: on a machine busy with
    other work, two threads on two cores decoded 10-100x slower than one here. One thread keeps
    this module within seconds, and keeps llama.cpp's attention batch-invariant at any context
    length (see llama_cpp.py; these prompts stay under the 512 positions where more threads
    would split it). The method takes torch's thread count, whatever it is (checked)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def greedy(llama_cpp, smollm):
    return make_method("llama-cpp", smollm)


@pytest.fixture(scope="module")
def prompts(smollm):
    """Four standard-library cuts, each cut inside its last line (so a line completion has text),
    and one repetitive prompt where prompt lookup must draft and land tokens."""
    texts = []
    for text in stdlib_prompts(4):
        last = text.rstrip("\n").rfind("\n") + 1
        line = text.rstrip("\n")[last:]
        texts.append(text[: last + max(1, len(line) // 2)])
    texts.append("".join(f"    def get_{f}(self):\n        return self._{f}\n\n" for f in ("name", "age", "city"))
                 + "    def get_")
    return [smollm.tokenizer(t, add_special_tokens=False).input_ids for t in texts]


def test_vocabulary_and_prompt_ids_agree_with_ours(llama_cpp, smollm, greedy, prompts):
    from dyncomplete.methods.llama_cpp import vocab_mismatches

    greedy.generate(smollm, prompts[0], GenerationParams(max_new_tokens=1))  # loads the Llama object
    n_vocab, bad = vocab_mismatches(greedy.llm, smollm.tokenizer, limit=10)
    assert bad == [] and n_vocab == len(smollm.tokenizer)
    params = greedy.llm.context_params
    assert params.n_threads == params.n_threads_batch == torch.get_num_threads()
    for ids in prompts:  # the same ids spell the same text in both tokenizers
        assert greedy.llm.detokenize(ids).decode("utf-8") == smollm.tokenizer.decode(ids)


def test_completions_stop_by_our_rules(smollm, greedy, prompts):
    for ids in prompts:
        out = greedy.generate(smollm, ids, GenerationParams(max_new_tokens=32, line_mode=True))
        s = out.stats
        assert out.text.strip() and "\n" not in out.text, smollm.tokenizer.decode(ids[-20:])
        assert s.stopped_by in ("newline", "max_tokens", "eos") and s.new_tokens == len(out.token_ids)
        assert s.prompt_tokens == len(ids) and s.prefill_s > 0 and s.decode_s >= 0
        assert s.layer_evals == smollm.num_layers * s.new_tokens and s.head_evals == s.new_tokens
        if s.stopped_by == "newline":  # the newline token ended it at once: its text is cut off
            assert "\n" in smollm.tokenizer.decode(out.token_ids)
    out = greedy.generate(smollm, prompts[-1], GenerationParams(max_new_tokens=5))
    assert len(out.token_ids) == 5 and out.stats.stopped_by == "max_tokens"
    out = greedy.generate(smollm, prompts[-1], GenerationParams(max_new_tokens=32, stop=("(",)))
    assert out.stats.stopped_by == "stop" and "(" not in out.text and out.text.strip()
    with pytest.raises(ValueError, match="token healing"):
        greedy.generate(smollm, prompts[0], GenerationParams(token_healing=True))
    with pytest.raises(ValueError, match="top-p"):
        greedy.generate(smollm, prompts[0], GenerationParams(temperature=0.7, top_p=0.9))


def test_prompt_lookup_yields_the_greedy_tokens(smollm, greedy, prompts):
    lookup = make_method("llama-cpp:prompt-lookup", smollm)
    params = GenerationParams(max_new_tokens=NEW_TOKENS)
    drafted = accepted = 0
    for ids in prompts:
        want = greedy.generate(smollm, ids, params)
        got = lookup.generate(smollm, ids, params)
        assert got.token_ids == want.token_ids and got.text == want.text, smollm.tokenizer.decode(ids[-20:])
        s = got.stats
        assert s.verify_steps > 0 and s.accepted <= s.drafted
        # the prompt's last position decides the first token; then each step feeds its draft + 1 token
        assert s.layer_evals == smollm.num_layers * (1 + s.drafted + s.verify_steps)
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    assert drafted > 0 and accepted > 0


def test_missing_extra_and_models_without_gguf_are_one_line_errors(smollm, monkeypatch):
    from dyncomplete.methods.llama_cpp import gguf_path_of

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'dyncomplete\[reference\]'") as err:
        make_method("llama-cpp", smollm)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unknown llama-cpp variant"):
        make_method("llama-cpp:beam", smollm)
    with pytest.raises(ValueError, match="registered alias or a .gguf model"):
        gguf_path_of(SimpleNamespace(name="/tmp/some-hf-dir"))


def test_bandwidth_counts_the_gguf_tensors_llama_cpp_reads(greedy):
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(greedy.gguf).tensors}
    assert "output.weight" not in tensors  # SmolLM2's head is its token embedding: all of it is read
    assert greedy.weight_bytes() == sum(tensors.values())
    assert 90e6 < greedy.weight_bytes() < greedy.gguf.stat().st_size  # Q4_1/Q8_0 weights, no metadata


def test_cache_prompt_prefills_only_what_follows_the_shared_prefix(llama_cpp, smollm, prompts):
    """`llama-cpp:cache-prompt` keeps its KV cache between requests where the caller keeps a prefix
    cache (the server passes one), as llama-server does: a request that extends the previous prompt
    feeds only the new tokens; without a cache it prefills all. (Its tokens may differ from a full
    prefill's: llama.cpp's numbers depend on the batch split, as its server README says.)"""
    cached = make_method("llama-cpp:cache-prompt", smollm)
    params = GenerationParams(max_new_tokens=8)
    ids = prompts[0]
    first = cached.generate(smollm, ids[:-10], params, cache=smollm.new_cache())
    assert first.stats.cached_prompt_tokens == 0
    second = cached.generate(smollm, ids, params, cache=smollm.new_cache())
    assert len(ids) - 10 <= second.stats.cached_prompt_tokens < len(ids)  # (+ what it wrote that the text has)
    assert second.stats.new_tokens == 8 and second.text
    assert second.stats.layer_evals == smollm.num_layers * second.stats.new_tokens  # prompt work not counted
    assert cached.generate(smollm, ids, params).stats.cached_prompt_tokens == 0  # no cache passed: all prefilled
    other = cached.generate(smollm, prompts[1], params, cache=smollm.new_cache())  # nothing shared
    assert other.stats.cached_prompt_tokens < 5
