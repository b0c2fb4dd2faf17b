"""The registration tables: drafters (`speculative.PROPOSERS`), exit policies (`policies.POLICIES`)
and what is generated from them. No model needed: stand-ins give the shapes the code reads."""

import argparse
import math
from types import SimpleNamespace

import pytest
import torch

from dyncomplete.data.datasets import NAMED
from dyncomplete.exits.agent import AgentNet, RLPolicy
from dyncomplete.exits.classifier import Classifier, new_mlp
from dyncomplete.exits.policies import (POLICIES, Confidence, Entropy, ExitPolicy, Margin, Saturation, Static,
                                        make_policy, policy_class)
from dyncomplete.methods import FAMILIES, MethodName, make_method, parse_method
from dyncomplete.methods import speculative
from dyncomplete.methods.proposers import Proposer
from dyncomplete.training.calibrate import calibrate, layer_signals, never_fires, simulate

D, V = 8, 50


def test_an_unknown_drafter_family_is_refused_in_one_line():
    with pytest.raises(ValueError) as refused:
        speculative.build(MethodName("nonsense:4", "nonsense", ("4",)), None)
    message = str(refused.value)
    assert "'nonsense' is not a drafter family" in message and "\n" not in message
    assert all(family in message for family in speculative.PROPOSERS)


def test_every_drafter_is_reachable_by_name(monkeypatch):
    routed = {f for f, family in FAMILIES.items() if family.module == speculative.__name__}
    assert routed == set(speculative.PROPOSERS)
    built = []

    def stand_in(family):
        def builder(name, model):
            built.append((family, name.family, model))
            return Proposer()
        return builder

    for family in speculative.PROPOSERS:
        monkeypatch.setitem(speculative.PROPOSERS, family, stand_in(family))
    for family in sorted(routed):
        method = make_method(family, "the model")
        assert isinstance(method, speculative.SpeculativeDecoding) and method.name == family
    assert built == [(f, f, "the model") for f in sorted(routed)]


def test_every_policy_is_reachable_by_name():
    for name in POLICIES:
        assert issubclass(policy_class(name), ExitPolicy), name
        assert parse_method(f"early-exit:{name}@0.5").args == (name,)
    model = SimpleNamespace(hidden_size=D)
    for name, cls in [("static", Static), ("confidence", Confidence), ("entropy", Entropy), ("margin", Margin),
                      ("saturation", Saturation)]:
        policy = make_policy(name, "0.25", model, None)
        assert type(policy) is cls and policy.threshold == 0.25
    with pytest.raises(ValueError, match="unknown exit policy 'bogus': known are static, confidence"):
        make_policy("bogus", 0.5, model, None)


def stand_ins(threshold: float) -> dict[str, ExitPolicy]:
    """One of each policy in the table, built without weights."""
    torch.manual_seed(0)
    model = SimpleNamespace(hidden_size=D, final_norm=torch.nn.Identity())
    agent = AgentNet([torch.nn.Linear(D + 1, 4), torch.nn.Linear(4, 2)]).requires_grad_(False)
    return {"static": Static(threshold), "confidence": Confidence(threshold), "entropy": Entropy(threshold),
            "margin": Margin(threshold), "saturation": Saturation(threshold, D),
            "classifier": Classifier(threshold, model, {2: new_mlp(D).requires_grad_(False)}),
            "rl": RLPolicy(threshold, agent, 4)}


def test_the_stand_ins_cover_the_table():
    assert set(stand_ins(0.5)) == set(POLICIES)


def layers_of_tokens(seed: int = 0):
    """Three exit layers' hidden states and logits for 5 tokens."""
    gen = torch.Generator().manual_seed(seed)
    return [(e, torch.randn(5, D, generator=gen), 4 * torch.randn(5, V, generator=gen)) for e in (1, 2, 3)]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_decide_is_fires_of_scores(name):
    """What decoding decides for one token is the policy's `fires` on its `scores` at the threshold,
    at the score itself and on either side of it, for every layer (state included: saturation)."""
    for token in range(5):
        probe = stand_ins(0.0)[name]
        probe.reset()
        for e, hidden, logits in layers_of_tokens():
            s = float(probe.scores(e, hidden[token], logits[token]))
            for t in (s, math.nextafter(s, math.inf), math.nextafter(s, -math.inf), 0.5):
                if not math.isfinite(t):
                    continue
                policy = stand_ins(t)[name]
                policy.reset()
                for e2, h2, l2 in layers_of_tokens():  # the same layers up to e
                    decided = policy.decide(e2, h2[token], l2[token])
                    if e2 == e:
                        assert decided == bool(policy.fires(s, t)), (name, e, t)
                        break


def test_each_policy_keeps_its_meaning():
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log()
    h = torch.randn(D)
    assert Confidence(0.69).decide(5, h, logits) and not Confidence(0.71).decide(5, h, logits)
    assert Margin(0.49).decide(5, h, logits) and not Margin(0.51).decide(5, h, logits)
    entropy = float(-(probs * probs.log()).sum())
    assert Entropy(entropy + 1e-3).decide(5, h, logits) and not Entropy(entropy - 1e-3).decide(5, h, logits)
    assert Static(20).decide(20, h, None) and not Static(20.3).decide(20, h, None) and Static(20.3).decide(21, h, None)
    saturation = Saturation(-2.0, D)  # below any cosine: still nothing to compare with at the first check
    assert not saturation.decide(1, h, None) and saturation.decide(2, -h, None)
    assert Saturation(0.99, D).decide(2, h, None) is False
    classifier = stand_ins(-1.0)["classifier"]
    assert classifier.decide(2, h, None) and not classifier.decide(1, h, None)  # no classifier for layer 1


def test_batched_scores_are_the_one_token_scores():
    """Calibration scores every token of a layer at once; decoding one token at a time."""
    for name, policy in stand_ins(0.5).items():
        single = stand_ins(0.5)[name]
        policy.reset()
        for e, hidden, logits in layers_of_tokens():
            batch = policy.scores(e, hidden, logits)
            assert batch.shape == (5,), name
            rows_now = []
            for token in range(5):
                single.reset()
                for e2, h2, l2 in layers_of_tokens():
                    s = single.scores(e2, h2[token], l2[token])
                    if e2 == e:
                        break
                rows_now.append(float(s))
            torch.testing.assert_close(batch, torch.tensor(rows_now), msg=name)


def test_simulate_fires_as_the_policy_decides():
    layers, agree = [20, 24], torch.ones(2, 3, dtype=torch.bool)
    static = torch.tensor([[20.0] * 3, [24.0] * 3])
    assert simulate(layers, agree, static, 20, 30, Static.fires)["layers_per_token"] == 20
    assert simulate(layers, agree, static, 20.3, 30, Static.fires)["layers_per_token"] == 24  # as Static(20.3)
    entropy = torch.tensor([[2.0, 0.5, 3.0], [0.1, 0.1, 3.0]])
    assert simulate(layers, agree, entropy, 1.0, 30, Entropy.fires)["layers_per_token"] == pytest.approx((24 + 20 + 30) / 3)
    for fires, score in ((ExitPolicy.fires, entropy), (Entropy.fires, entropy), (Static.fires, static)):
        assert simulate(layers, agree, score, never_fires(fires, score), 30, fires)["exit_share"] == 0.0


def test_calibrated_entropy_threshold_is_in_nats():
    agree = torch.tensor([[True, True, False], [True, True, True]])
    entropy = torch.tensor([[0.2, 0.4, 0.3], [0.1, 0.1, 3.0]])
    heads = SimpleNamespace(layers=[20, 24], model=SimpleNamespace(num_layers=30))
    best = calibrate(heads, SimpleNamespace(agree=agree, scores={"entropy": entropy}), "entropy", 1.0)
    assert best["agreement"] == 1.0 and best["layers_per_token"] == pytest.approx((20 + 24 + 30) / 3)
    assert 0.2 < best["threshold"] <= 0.3 and best["method"] == f"early-exit:entropy@{best['threshold']:.6g}"


class Data:
    def __init__(self, layers):
        self.hidden = {e: hidden.to(torch.bfloat16) for e, hidden, _ in layers}
        self.top_ids = torch.zeros(5, 1, dtype=torch.long)

    def __len__(self):
        return 5


@pytest.mark.parametrize("short", [False, True])
def test_layer_signals_score_as_decoding_decides(short):
    """The calibration signals of each policy, fired at a threshold, are the decisions decoding makes
    on the same hidden states and logits (with a shortlist: its logits decide, the full head's confirm)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(D, V).requires_grad_(False)
    model = SimpleNamespace(dtype=torch.float32, hidden_size=D, head=head)
    heads = SimpleNamespace(layers=[1, 2, 3], model=model, normed=lambda e, h: h)
    shortlist = SimpleNamespace(logits=lambda normed: head(normed)[..., :7]) if short else None
    data = Data(layers_of_tokens())
    names = ["static", "confidence", "entropy", "margin", "saturation"]
    signals = layer_signals(heads, data, names, batch=2, shortlist=shortlist)
    for name in names:
        score = signals.scores[name]
        values = sorted(set(score[score.isfinite()].tolist()))
        midpoints = [(a + b) / 2 for a, b in zip(values, values[1:])]  # clear of batched products' rounding
        for t in midpoints + [0.5, 1.0, 2.0, 3.0]:
            policy = make_policy(name, t, model, heads)
            for token in range(5):
                policy.reset()
                for row, e in enumerate(heads.layers):
                    hidden = data.hidden[e][token].float()
                    full = head(hidden)
                    decided = policy.decide(e, hidden, full)
                    if short and policy.needs_logits:
                        decided = policy.decide(e, hidden, shortlist.logits(hidden)) and decided
                    assert bool(policy.fires(float(score[row, token]), t)) == decided, (name, t, token, e)


def test_help_lists_come_from_the_tables():
    from dyncomplete.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    helps = {c: {a.dest: a.help for a in commands[c]._actions} for c in ("bench", "complete", "serve", "calibrate")}
    assert all(name in helps["bench"]["dataset"] for name in NAMED)
    assert all(name in helps["calibrate"]["policy"] for name in POLICIES)
    for command, dest in (("bench", "methods"), ("complete", "method"), ("serve", "method")):
        assert all(family in helps[command][dest] for family in FAMILIES), command
