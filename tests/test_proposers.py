"""Proposers and draft-length control on their own: what they draft and what it costs."""

import torch

from dyncomplete.decoding import GenerationParams, Stats
from dyncomplete.decoding.draft_control import (AcceptanceTracker, ConfidenceStop, EntropyStop, ExitLayerController,
                                                best_length, expected_tokens)
from dyncomplete.decoding.proposers import LookupProposer, SelfDraftProposer
from dyncomplete.exits.heads import lens_heads


def test_lookup_drafts_what_followed_the_latest_longest_match(smollm):
    ids = smollm.tokenizer("total = add(a, b)\nprint(total)\nresult = add(a, c)\nprint(", add_special_tokens=False).input_ids
    lookup = LookupProposer(max_draft=10)
    lookup.begin(smollm, ids, GenerationParams(), None, Stats())
    draft = lookup.propose(smollm, None, ids, len(ids) - 1)
    text = smollm.tokenizer.decode(draft.tokens)
    assert draft.tokens and "total)\nresult".startswith(text), text
    assert lookup.matched == 3  # the longest n-gram size tried


def test_lookup_without_a_match_drafts_nothing(smollm):
    ids = smollm.tokenizer("alpha beta gamma", add_special_tokens=False).input_ids
    lookup = LookupProposer()
    lookup.begin(smollm, ids, GenerationParams(), None, Stats())
    assert lookup.propose(smollm, None, ids, len(ids) - 1).tokens == []


def test_lookup_length_follows_acceptance():
    lookup = LookupProposer(max_draft=10)
    for _ in range(60):
        lookup.trackers[2].update(10, 10)
        lookup.trackers[1].update(10, 0)
    assert best_length(lookup.trackers[2].rates(), 0.1, 10)[0] == 10
    assert best_length(lookup.trackers[1].rates(), 0.1, 10)[0] == 0


def test_acceptance_tracker_conditions_on_earlier_positions():
    tracker = AcceptanceTracker(4, decay=1.0)
    tracker.update(4, 1)  # position 0 accepted, 1 rejected, 2 and 3 never reached
    assert tracker.hits == [2, 1, 1, 1] and tracker.tries == [3, 3, 2, 2]


def test_expected_tokens_matches_the_closed_form():
    alpha, k = 0.7, 5
    assert abs(expected_tokens([alpha] * k, k) - (1 - alpha ** (k + 1)) / (1 - alpha)) < 1e-12


def test_stop_rules():
    sure = torch.tensor([0.97, 0.01, 0.01, 0.01])
    unsure = torch.tensor([0.3, 0.3, 0.2, 0.2])
    assert not ConfidenceStop(0.5).stop(sure) and ConfidenceStop(0.5).stop(unsure)
    assert not EntropyStop(1.0).stop(sure) and EntropyStop(1.0).stop(unsure)


def test_exit_layer_controller_prefers_the_layer_that_pays():
    controller = ExitLayerController({10: 0.4, 20: 0.7}, max_len=6, explore=0.0)
    for _ in range(80):
        controller.update(10, 6, 6)  # cheap and always right
        controller.update(20, 6, 1)
    assert controller.choose() == (10, 6)


def test_self_draft_keeps_shallow_kv_and_uses_a_shortlist(smollm):
    ids = smollm.tokenizer("def square(x):\n    return x *", add_special_tokens=False).input_ids
    cache = smollm.new_cache()
    smollm.forward(torch.tensor(ids[:-1]), cache)
    stats = Stats()
    proposer = SelfDraftProposer(lens_heads(smollm, [20]), 20, max_draft=3, shortlist=1000)
    proposer.begin(smollm, ids, GenerationParams(), None, stats)
    with torch.inference_mode():
        draft = proposer.propose(smollm, cache, ids, len(ids) - 1)
    assert len(draft.tokens) == 3 and draft.hidden.shape == (1, 4, smollm.hidden_size)
    assert all(t < 1000 or t in ids for t in draft.tokens)
    assert cache.lengths[:20] == [len(ids) + 3] * 20 and cache.lengths[20:] == [len(ids) - 1] * 10
    assert stats.layer_evals == 4 * 20 and stats.extra_macs >= 3 * 1000 * smollm.hidden_size
