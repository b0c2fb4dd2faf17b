"""Token healing: a prompt cut at a line start (as an editor sends it) still gets its next line."""

import pytest

from dyncomplete.engine import GenerationParams, healing
from dyncomplete.methods import make_method
from dyncomplete.engine.prompts import build_prompt
from dyncomplete.serve.report import token_pieces

pytestmark = pytest.mark.model

# The prompt ends in "\n"; SmolLM2's vocabulary merges "\n" with the next line's indentation, so
# without healing the model almost never continues with an indented line.
PREFIX = "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"


def test_plan_backs_up_a_newline_and_allows_only_tokens_that_start_with_it(smollm):
    tok = smollm.tokenizer
    ids = tok(PREFIX).input_ids
    heal = healing.plan(tok, ids)
    assert heal is not None and heal.tail_id == ids[-1] and heal.tail_text == "\n"
    texts = tok.batch_decode([[i] for i in heal.allowed.tolist()])
    assert all(t.startswith("\n") for t in texts)
    assert "\n    " in texts and ids[-1] in heal.allowed.tolist()
    every = [i for i, text in enumerate(healing.token_texts(tok)) if text.startswith("\n")]
    assert heal.allowed.tolist() == every  # all of them, in id order (found in the sorted texts)


def test_a_plan_allows_every_token_that_starts_with_the_tail_whichever_tail(smollm):
    """Tails with a handful of extensions and with thousands (a space), asked twice (kept)."""
    tok = smollm.tokenizer
    texts = healing.token_texts(tok)
    for tail in ("\n", " ", "    ", ".", "in", "return"):
        tail_id = texts.index(tail)
        every = [i for i, text in enumerate(texts) if text.startswith(tail)]
        for _ in range(2):
            heal = healing.plan(tok, [tok("x").input_ids[0], tail_id])
            assert heal is not None and heal.tail_id == tail_id and heal.allowed.tolist() == every, tail


def test_nothing_to_heal_after_a_special_token_or_a_single_token(smollm):
    tok = smollm.tokenizer
    assert healing.plan(tok, [tok.eos_token_id]) is None
    assert healing.plan(tok, tok("x = 1").input_ids + [tok.eos_token_id]) is None


def test_healed_completion_continues_the_indented_block(smollm):
    prompt = build_prompt(smollm.tokenizer, PREFIX, None, 512)
    for name in ("baseline", "lookup"):
        plain = make_method(name, smollm).generate(
            smollm, prompt.ids, GenerationParams(max_new_tokens=16, stop=("\n",)))
        healed = make_method(name, smollm).generate(
            smollm, prompt.ids, GenerationParams(max_new_tokens=16, stop=("\n",), token_healing=True))
        assert plain.text == "", f"{name}: the unhealed prompt is expected to derail: {plain.text!r}"
        assert healed.text.startswith("    ") and healed.text.strip(), f"{name}: {healed.text!r}"
        assert healed.stats.prompt_tokens == len(prompt.ids) - 1 and healed.healed == "\n"
        # the web page's per-token pieces leave the healed newline out as well
        assert "".join(token_pieces(smollm.tokenizer, healed.token_ids, healed.text, healed.healed)) == healed.text
    hf = make_method("hf-generate", smollm).generate(
        smollm, prompt.ids, GenerationParams(max_new_tokens=16, stop=("\n",), token_healing=True))
    assert hf.text == healed.text
