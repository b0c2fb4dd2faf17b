"""Quality metrics of one prediction against its target (docs/metrics.md).

EM and ES follow CodeXGLUE's line-completion evaluator: both strings pass its `post_process`
(literal placeholders such as `<NUM_LIT:0>` become their value), EM compares the whitespace
splits, ES is `fuzz.ratio` (0-100). One deviation: the target is stripped like the prediction,
because our targets are raw code whose rest-of-line may start with a space (CodeXGLUE's
tokenised targets never do, so its scores are unchanged). ROUGE-L is rouge-score's F-measure
with a code tokenizer (identifiers, numbers and single punctuation marks, case kept): its default
tokenizer drops every non-alphanumeric character, which would score `f(x)` equal to `f[x]`.
BLEU is sacrebleu's (0-100): sentence BLEU per example, corpus BLEU for a method.
"""

from __future__ import annotations

import re

import sacrebleu
from rapidfuzz import fuzz
from rouge_score import rouge_scorer

_LITERAL = re.compile(r"<(STR|NUM|CHAR)_LIT:(.*?)>", re.S)
_CODE_TOKEN = re.compile(r"\w+|[^\w\s]")


def post_process(code: str) -> str:
    """CodeXGLUE's placeholder expansion (a no-op on raw code)."""
    code = code.replace("<NUM_LIT>", "0").replace("<STR_LIT>", "").replace("<CHAR_LIT>", "")
    return _LITERAL.sub(lambda m: m.group(2), code)


def _clean(text: str) -> str:
    return post_process(text.strip())


def exact_match(prediction: str, target: str) -> bool:
    return _clean(prediction).split() == _clean(target).split()


def edit_similarity(prediction: str, target: str) -> float:
    return float(fuzz.ratio(_clean(prediction), _clean(target)))


class _CodeTokenizer:
    def tokenize(self, text: str) -> list[str]:
        return _CODE_TOKEN.findall(text)


_ROUGE = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_CodeTokenizer())


def rouge_l(prediction: str, target: str) -> float:
    return _ROUGE.score(_clean(target), _clean(prediction))["rougeL"].fmeasure


def sentence_bleu(prediction: str, target: str) -> float:
    return sacrebleu.sentence_bleu(_clean(prediction), [_clean(target)]).score


def corpus_bleu(predictions: list[str], targets: list[str]) -> float:
    if not predictions:
        return 0.0
    return sacrebleu.corpus_bleu([_clean(p) for p in predictions], [[_clean(t) for t in targets]]).score


def score(prediction: str, target: str) -> dict:
    """Per-example metrics: em (0 or 100), es (0-100), rouge_l (0-1), bleu (0-100)."""
    return {
        "em": 100.0 * exact_match(prediction, target),
        "es": edit_similarity(prediction, target),
        "rouge_l": rouge_l(prediction, target),
        "bleu": sentence_bleu(prediction, target),
    }
