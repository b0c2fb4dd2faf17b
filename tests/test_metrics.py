"""Quality metrics against hand-computed cases, including CodeXGLUE's own evaluator data."""

import pytest

from dyncomplete.bench.metrics import (corpus_bleu, edit_similarity, exact_match, post_process, rouge_l, score,
                                       sentence_bleu)


def test_exact_match_compares_whitespace_splits():
    assert exact_match("foo ( a , b )", "foo ( a ,  b )")
    assert exact_match("  return x\t", " return x")  # our raw-code targets may start with a space
    assert not exact_match("foo(a,b)", "foo(a, b)")
    assert not exact_match("return", "return x")


def test_codexglue_answers_with_literal_placeholders():
    """Targets from CodeXGLUE's evaluator/answers.json (Java): placeholders expand before scoring."""
    assert post_process("= <NUM_LIT:0> ;") == "= 0 ;"
    assert post_process('Pattern . compile ( "<STR_LIT>" ) ;') == 'Pattern . compile ( "" ) ;'
    assert post_process("x = <NUM_LIT> + <CHAR_LIT>") == "x = 0 + "
    assert exact_match("= 0 ;", "= <NUM_LIT:0> ;")
    assert exact_match("owner , final Point location )", "owner , final Point location )")
    assert not exact_match("owner , final Point loc )", "owner , final Point location )")
    assert edit_similarity("Ex1 > in1 ;", "Ex1 > in1 ;") == 100.0
    assert edit_similarity("> models ;", "> models ;\n") == 100.0


def test_edit_similarity_is_the_indel_ratio():
    # ratio = 100 * (1 - indel distance / total length): one substitution = 2 edits out of 8 chars
    assert edit_similarity("abcd", "abce") == pytest.approx(75.0)
    assert edit_similarity("", "abc") == 0.0
    assert edit_similarity("self.x", "self.y = 1") == pytest.approx(100 * (1 - 6 / 16))


def test_rouge_l_on_code_tokens():
    # LCS of [a b c d] and [a c d e] is 3: precision = recall = 3/4
    assert rouge_l("a b c d", "a c d e") == pytest.approx(0.75)
    # punctuation counts: f ( x ) vs f [ x ] share f and x only (the default tokenizer would say 1.0)
    assert rouge_l("f(x)", "f[x]") == pytest.approx(0.5)
    assert rouge_l("Foo", "foo") == 0.0  # case kept
    assert rouge_l("return self.x", " return self.x") == 1.0


def test_bleu_brevity_penalty_by_hand():
    # all n-gram precisions are 1; brevity penalty exp(1 - 5/4)
    assert sentence_bleu("a b c d", "a b c d e") == pytest.approx(100 * 2.718281828 ** (1 - 5 / 4), rel=1e-6)
    assert sentence_bleu("x = foo(1)", "x = foo(1)") == pytest.approx(100.0)
    assert corpus_bleu(["a b c d", "a b c d"], ["a b c d e", "a b c d e"]) == pytest.approx(77.88, abs=0.01)
    assert corpus_bleu([], []) == 0.0


def test_score_bundles_all_metrics():
    s = score(" os.path.join(a, b)", "os.path.join(a, b)")
    assert s == {"em": 100.0, "es": 100.0, "rouge_l": 1.0, "bleu": pytest.approx(100.0)}
    wrong = score("print(x)", "return x")
    # tokens [print ( x )] vs [return x]: LCS 1, precision 1/4, recall 1/2, F = 1/3
    assert wrong["em"] == 0.0 and 0 < wrong["es"] < 100 and wrong["rouge_l"] == pytest.approx(1 / 3)
