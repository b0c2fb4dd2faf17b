"""STAND-style drafting on its own: counts per n-gram, the likeliest continuation (not the
latest), trees of the likely alternatives, and lengths that follow the evidence."""

from dyncomplete.engine import GenerationParams, Stats
from dyncomplete.methods.stand import NgramCounts, StandProposer

#          a  b  c  5  .  a  b  c  5  .  a  b  c  6  .  a  b  c
REPEATS = [1, 2, 3, 5, 0, 1, 2, 3, 5, 0, 1, 2, 3, 6, 0, 1, 2, 3]


def stand_on(context, **kwargs):
    stand = StandProposer(**kwargs).begin(None, context, GenerationParams(), None, Stats())
    return stand, stand.propose(None, None, context, len(context) - 1)


def test_counts_rank_by_frequency_then_by_the_latest_occurrence():
    counts = NgramCounts([3, 2, 1])
    counts.extend(REPEATS, 1)
    n, ranked = counts.next((1, 2, 3))
    assert n == 3 and ranked == [(5, 2 / 3, 2), (6, 1 / 3, 1)]
    counts.extend([7, 4, 7, 8], 1)  # 7 -> 4, then 7 -> 8: equal counts, the latest first
    assert counts.next((7,)) == (1, [(8, 0.5, 1), (4, 0.5, 1)])
    assert counts.next((9,)) is None


def test_the_chain_drafts_the_likeliest_continuation_where_lookup_drafts_the_latest():
    stand, draft = stand_on(REPEATS)
    assert draft.parents is None and draft.source == "stand"
    assert draft.tokens and draft.tokens[0] == 5  # lookup would draft 6, what followed last time


def test_the_tree_holds_the_alternatives_as_siblings():
    stand, draft = stand_on(REPEATS, tree=True)
    roots = [t for t, p in zip(draft.tokens, draft.parents) if p == -1]
    assert roots == [5, 6]
    assert all(p < i for i, p in enumerate(draft.parents))  # parents come first


def test_history_is_drafted_from_where_the_request_has_no_match():
    history = (9, 4, 5, 6, 7)
    stand = StandProposer().begin(None, [1, 4, 5], GenerationParams(history=history), None, Stats())
    draft = stand.propose(None, None, [1, 4, 5], 2)
    assert draft.source == "history" and draft.tokens == [6, 7][: len(draft.tokens)] and draft.tokens


def test_lengths_follow_acceptance():
    context = list(range(10, 30)) + [10, 11]  # a long run seen once, its start again
    stand, first = stand_on(context)
    assert first.tokens == [12]  # seen once: one token from the prior
    for _ in range(100):
        draft = stand.propose(None, None, context, len(context) - 1)
        stand.feedback(draft, len(draft.tokens))  # every drafted token accepted
    assert draft.tokens == list(range(12, 22))
    for _ in range(200):
        draft = stand.propose(None, None, context, len(context) - 1)
        stand.feedback(draft, 0)  # none accepted
    assert len(draft.tokens) <= 1  # at most a probe now and then
