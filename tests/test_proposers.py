"""Proposers and draft-length control on their own: what they draft and what it costs."""

import pytest
import torch

from dyncomplete.engine import GenerationParams, Stats
from dyncomplete.methods.draft_control import (AcceptanceTracker, ConfidenceStop, EntropyStop, ExitLayerController,
                                                best_length, expected_tokens)
from dyncomplete.methods.proposers import LookupProposer, SelfDraftProposer
from dyncomplete.exits.heads import lens_heads


def lookup_on(context: list[int], **kwargs) -> tuple[LookupProposer, list[int]]:
    """A lookup proposer over plain integer token ids (it needs no model)."""
    lookup = LookupProposer(**kwargs).begin(None, context, GenerationParams(), None, Stats())
    return lookup, lookup.propose(None, None, context, len(context) - 1).tokens


def test_lookup_drafts_what_followed_the_latest_longest_match():
    #          a  b  c  X  Y  .  a  b  c  Z  W  .  a  b  c
    context = [1, 2, 3, 7, 8, 0, 1, 2, 3, 5, 6, 0, 1, 2, 3]
    lookup, draft = lookup_on(context, max_draft=10)
    assert lookup.matched == ("lookup", 3) and draft  # the latest occurrence of the 3-gram, as far as it pays
    assert draft == [5, 6, 0, 1, 2, 3][: len(draft)]


def test_lookup_falls_back_to_shorter_ngrams_and_never_drafts_the_suffix_itself():
    lookup, draft = lookup_on([4, 9, 1, 5, 9], max_draft=2)
    assert lookup.matched == ("lookup", 1) and draft and draft == [1, 5][: len(draft)]
    lookup, draft = lookup_on([4, 9, 1, 5, 6])
    assert lookup.matched is None and draft == []  # the last token alone is no match


def test_lookup_drafts_from_earlier_requests_where_the_context_has_no_match():
    history = (9, 9, 4, 5, 6, 7, 8)  # an earlier completion: ... 4 5 6 7 8
    lookup = LookupProposer(max_draft=10).begin(None, [1, 4, 5], GenerationParams(history=history), None, Stats())
    draft = lookup.propose(None, None, [1, 4, 5], 2)
    assert lookup.matched == ("history", 2) and draft.source == "history" and draft.tokens
    assert draft.tokens == [6, 7, 8][: len(draft.tokens)]
    context = [4, 5, 3, 1, 4, 5]  # the request's own text matches too: it comes first
    lookup = LookupProposer(max_draft=10).begin(None, context, GenerationParams(history=history), None, Stats())
    draft = lookup.propose(None, None, context, 5)
    assert lookup.matched == ("lookup", 2) and draft.tokens == [3, 1, 4, 5][: len(draft.tokens)]


def test_lookup_grows_its_index_with_the_context():
    lookup, _ = lookup_on([1, 2, 3])
    context = [1, 2, 3, 4, 1, 2]
    draft = lookup.propose(None, None, context, len(context) - 1).tokens
    assert draft and draft == [3, 4, 1, 2][: len(draft)]


@pytest.mark.model
def test_lookup_on_real_code(smollm):
    ids = smollm.tokenizer("total = add(a, b)\nprint(total)\nresult = add(a, c)\nprint(", add_special_tokens=False).input_ids
    lookup, draft = lookup_on(ids, max_draft=10)
    text = smollm.tokenizer.decode(draft)
    assert draft and "total)\nresult".startswith(text), text


def test_lookup_length_follows_acceptance():
    lookup = LookupProposer(max_draft=10).begin(None, [1, 2, 3], GenerationParams(), None, Stats())
    for _ in range(60):
        lookup.trackers["lookup", 2].update(10, 10)
        lookup.trackers["lookup", 1].update(10, 0)
    assert best_length(lookup.trackers["lookup", 2].rates(), 0.1, 10)[0] == 10
    assert best_length(lookup.trackers["lookup", 1].rates(), 0.1, 10)[0] == 0


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


@pytest.mark.model
def test_self_draft_keeps_shallow_kv_and_uses_a_shortlist(smollm):
    ids = smollm.tokenizer("def square(x):\n    return x *", add_special_tokens=False).input_ids
    cache = smollm.new_cache()
    smollm.forward(torch.tensor(ids[:-1]), cache)
    stats = Stats()
    proposer = SelfDraftProposer(lens_heads(smollm, [20]), 20, max_draft=3, shortlist=1000)
    proposer = proposer.begin(smollm, ids, GenerationParams(), None, stats)
    with torch.inference_mode():
        draft = proposer.propose(smollm, cache, ids, len(ids) - 1)
    assert len(draft.tokens) == 3 and draft.hidden.shape == (1, 4, smollm.hidden_size)
    assert all(t < 1000 or t in ids for t in draft.tokens)
    assert cache.lengths[:20] == [len(ids) + 3] * 20 and cache.lengths[20:] == [len(ids) - 1] * 10
    assert stats.layer_evals == 4 * 20 and stats.extra_macs >= 3 * 1000 * smollm.hidden_size


def test_begin_leaves_the_template_untouched_and_each_request_starts_from_the_priors():
    """A request's index and acceptance statistics live on its own copy: the method object a
    server keeps never changes, and nothing one request saw reaches the next."""
    template = LookupProposer(max_draft=10)
    before = dict(vars(template))
    first = template.begin(None, [1, 2, 3, 1, 2], GenerationParams(), None, Stats())
    for _ in range(20):
        first.trackers["lookup", 2].update(10, 0)
    second = template.begin(None, [1, 2, 3, 1, 2], GenerationParams(), None, Stats())
    assert vars(template) == before and first is not template and second is not first
    assert second.trackers["lookup", 2].rates() == AcceptanceTracker(10).rates()
    assert second.trackers["lookup", 2].rates() != first.trackers["lookup", 2].rates()


def test_exit_layer_controller_fresh_forgets_what_it_saw():
    controller = ExitLayerController({10: 0.4, 20: 0.7}, max_len=6, priors={10: 0.9})
    controller.update(10, 6, 0)
    fresh = controller.fresh()
    assert fresh.trackers[10].rates() == ExitLayerController({10: 0.4, 20: 0.7}, 6, priors={10: 0.9}).trackers[10].rates()
    assert fresh.trackers[10].rates() != controller.trackers[10].rates()
