"""Prompt building: FIM templates where the vocabulary has them, the context budget."""

import pytest

from dyncomplete.engine.prompts import build_prompt, fim_tokens


@pytest.mark.model
def test_smollm_has_no_fim_and_says_so(smollm):
    assert fim_tokens(smollm.tokenizer) is None
    p = build_prompt(smollm.tokenizer, "def f(x):\n    return ", "\n\nprint(f(2))\n")
    assert not p.fim and "suffix is ignored" in p.notice
    assert smollm.tokenizer.decode(p.ids) == "def f(x):\n    return "


@pytest.mark.model
def test_budget_keeps_the_end_of_the_prefix(smollm):
    prefix = "".join(f"x{i} = {i}\n" for i in range(400))
    p = build_prompt(smollm.tokenizer, prefix, budget=64)
    text = smollm.tokenizer.decode(p.ids)
    assert 48 <= len(p.ids) <= 64 and p.truncated  # cut at a stable line start (window.stable_prefix)
    assert p.cursor == len(p.ids)  # without a suffix the cursor is the prompt's end
    assert text.endswith("x399 = 399\n") and text.startswith("x")


def test_a_long_prefix_is_cut_at_a_line_start_that_moves_in_steps():
    tok = FimTokenizer()
    prefix = "".join(f"line {i:03d}\n" for i in range(60))
    cuts = [build_prompt(tok, prefix + "x" * typed, budget=64) for typed in range(6)]
    assert all(p.truncated and 48 - 9 <= len(p.ids) <= 64 for p in cuts)  # 3/4 of it, less a line at most
    assert all(chr(p.ids[0]) == "l" for p in cuts)  # a line start
    assert len({tuple(p.ids[:10]) for p in cuts}) <= 2  # typing keeps the prompt's start


class FimTokenizer:
    """The smallest tokenizer with FIM tokens: one id per character, plus three specials."""

    specials = {"<|fim_prefix|>": 1000, "<|fim_suffix|>": 1001, "<|fim_middle|>": 1002}

    def get_vocab(self):
        return dict(self.specials)

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        return type("Enc", (), {"input_ids": [ord(c) for c in text],
                                "offset_mapping": [(i, i + 1) for i in range(len(text))]})


def test_fim_layout_and_budget_split():
    tok = FimTokenizer()
    p = build_prompt(tok, "abc", "xyz", cursor_line="prefix")
    assert p.fim and p.ids == [1000, 97, 98, 99, 1001, 120, 121, 122, 1002]
    assert p.cursor == 4  # the suffix marker: the text before the cursor ends there, the text after starts
    p = build_prompt(tok, "a" * 100, "b" * 100, budget=44)
    assert len(p.ids) == 44 and p.truncated
    # the prefix is cut to at most three quarters of the budget (one line: its last 32 of 33), the
    # suffix keeps its start in a quarter of the room (10 of 41), and the prefix its end in the rest
    assert p.ids[1:32] == [97] * 31 and p.ids[32] == 1001 and p.cursor == 32
    assert p.ids[33:43] == [98] * 10


@pytest.mark.model
def test_empty_prompt_and_tiny_budget_are_refused(smollm):
    with pytest.raises(ValueError, match="empty prompt"):
        build_prompt(smollm.tokenizer, "")
    with pytest.raises(ValueError, match="at least 8"):
        build_prompt(smollm.tokenizer, "x", budget=2)


def test_a_suffix_budget_keeps_the_start_of_the_suffix():
    tok = FimTokenizer()
    p = build_prompt(tok, "ab\n", "x" * 50, suffix_budget=8)
    assert p.ids == [1000, 97, 98, 10, 1001, *[120] * 8, 1002] and p.truncated
    assert build_prompt(tok, "abc", "xyz", suffix_budget=8).ids == build_prompt(tok, "abc", "xyz").ids


def test_the_cursor_line_after_the_middle_token_leaves_the_rest_of_the_prompt_as_typing_goes_on():
    tok = FimTokenizer()
    a = build_prompt(tok, "ab\ncd", "\nxyz")  # the default
    assert a.ids == [1000, 97, 98, 10, 1001, 10, 120, 121, 122, 1002, 99, 100]
    b = build_prompt(tok, "ab\ncde", "\nxyz")
    assert b.ids[: len(a.ids)] == a.ids and b.ids[len(a.ids):] == [101]
    # at a line start the two layouts are the same prompt; without a suffix there is no middle
    assert build_prompt(tok, "ab\n", "\nxyz").ids == build_prompt(tok, "ab\n", "\nxyz", cursor_line="prefix").ids
    assert build_prompt(tok, "ab\ncd", None).ids == [97, 98, 10, 99, 100]
    # a line longer than an eighth of the budget stays in the prefix, where the budget can cut it
    long = build_prompt(tok, "ab\n" + "c" * 20, "\nxyz", budget=64)
    assert long.ids[-1] == 1002
    with pytest.raises(ValueError, match="cursor line"):
        build_prompt(tok, "ab", "xyz", cursor_line="suffix")
