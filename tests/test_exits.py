"""Exit heads, policies, translator training, calibration and the exit classifier."""

import json

import pytest
import torch

from dyncomplete.training.calibrate import calibrate, calibrate_checks, layer_signals, simulate
from dyncomplete.exits.classifier import Classifier, load_classifier
from dyncomplete.training.collect import code_chunks, collect
from dyncomplete.exits.heads import default_path, lens_heads, load_heads
from dyncomplete.exits.policies import make_policy
from dyncomplete.training.classifier import save_classifier, train_classifier
from dyncomplete.training.translators import agreement, least_squares_translator, train_translators


@pytest.fixture(scope="module")
def tiny_data(smollm):
    """Two 96-token chunks of train-split code through the real model."""
    chunks = code_chunks(smollm.tokenizer, "train", 150, chunk=96)
    return collect(smollm, [20, 26], chunks, progress=False)


@pytest.mark.model
def test_shipped_heads_match_the_model(smollm):
    heads = load_heads(smollm)
    assert heads.kind == "translator" and default_path(smollm).is_file()
    assert heads.metadata["model_sha256"] == smollm.source_sha256
    assert heads.layers and all(1 <= e < smollm.num_layers for e in heads.layers)
    d = smollm.hidden_size
    for e in heads.layers:
        assert heads.maps[str(e)].weight.shape == (d, d) and heads.maps[str(e)].bias.shape == (d,)
    h = torch.randn(3, d)
    assert heads.normed(heads.layers[0], h).shape == (3, d)
    logits = heads.logits(heads.layers[-1], h)
    assert logits.shape == (3, smollm.vocab_size) and logits.dtype == torch.float32


@pytest.mark.model
def test_lens_is_final_norm_and_head(smollm):
    heads = lens_heads(smollm, [4, 8])
    h = torch.randn(2, smollm.hidden_size)
    torch.testing.assert_close(heads.logits(8, h), smollm.head(smollm.final_norm(h)).float())
    with pytest.raises(ValueError):
        lens_heads(smollm, [0, smollm.num_layers])


def test_least_squares_start_recovers_an_exact_affine_map():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(400, 16, generator=gen)
    weight, bias = torch.randn(16, 16, generator=gen), torch.randn(16, generator=gen)
    gain = torch.rand(16, generator=gen) + 0.5
    lin = least_squares_translator(hidden, (hidden @ weight.T + bias) * gain, gain)
    torch.testing.assert_close(lin.weight.detach(), weight, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lin.bias.detach(), bias, atol=1e-4, rtol=1e-4)


@pytest.mark.model
def test_training_improves_agreement_and_round_trips(smollm, tiny_data, tmp_path):
    heads = train_translators(smollm, tiny_data, steps=30, batch=64, progress=False)
    trained, lens = agreement(heads, tiny_data), agreement(lens_heads(smollm, [20, 26]), tiny_data)
    assert trained[20] > lens[20]  # on its own training tokens: it must have learned something
    path = heads.save(tmp_path / "h.safetensors", data="test")
    loaded = load_heads(smollm, path)
    assert loaded.kind == "translator" and loaded.layers == [20, 26]
    h = tiny_data.hidden[26][:4].float()
    torch.testing.assert_close(loaded.logits(26, h), heads.logits(26, h))
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["model_sha256"] = "0" * 64
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="other weights"):
        load_heads(smollm, path)


@pytest.mark.model
def test_strict_thresholds_never_fire(smollm):
    one_hot = torch.full((smollm.vocab_size,), -1e4)
    one_hot[7] = 1e4
    h = torch.randn(smollm.hidden_size)
    assert not make_policy("confidence", 1.0, smollm, None).decide(20, h, one_hot)
    assert make_policy("confidence", 0.99, smollm, None).decide(20, h, one_hot)
    assert not make_policy("margin", 1.0, smollm, None).decide(20, h, one_hot)
    assert not make_policy("entropy", 0, smollm, None).decide(20, h, one_hot)
    sat = make_policy("saturation", 0.5, smollm, None)
    assert not sat.decide(20, h, None) and sat.decide(22, h * 2, None)  # first check: nothing to compare
    sat.reset()
    assert not sat.decide(22, h, None)
    assert make_policy("static", 20, smollm, None).decide(20, h, None)
    assert not make_policy("static", 20, smollm, None).decide(18, h, None)


@pytest.mark.model
def test_simulate_and_calibrate_on_known_signals(smollm):
    layers = [10, 20]
    agree = torch.tensor([[True, False, True, False], [True, True, True, False]])
    score = torch.tensor([[0.9, 0.8, 0.1, 0.1], [0.95, 0.9, 0.2, 0.1]])
    r = simulate(layers, agree, score, 0.5, 30)
    assert r["agreement"] == 0.75 and r["layers_per_token"] == (10 + 10 + 30 + 30) / 4 and r["exit_share"] == 0.5
    r = simulate(layers, agree, score, 0.85, 30)
    assert r["agreement"] == 1.0 and r["layers_per_token"] == (10 + 20 + 30 + 30) / 4

    class Signals:
        pass

    signals = Signals()
    signals.agree, signals.scores = agree, {"confidence": score}
    best = calibrate(lens_heads(smollm, layers), signals, "confidence", 1.0)
    assert best["agreement"] == 1.0 and best["layers_per_token"] == 22.5
    assert r["checks_per_token"] == (1 + 2 + 2 + 2) / 4 and r["cost_per_token"] == r["layers_per_token"]


@pytest.mark.model
def test_calibration_picks_the_check_layers_that_cost_least(smollm):
    """Layer 10 is right for the first two tokens and says so; 15 is never sure; 20 is right for
    the third. The best pair checks 10 and 20; a costly check tips the choice to layer 10 alone
    among the sets of one."""
    layers = [10, 15, 20]
    agree = torch.tensor([[True, True, False, False], [False, False, False, False], [True, True, True, False]])
    score = torch.tensor([[0.9, 0.9, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1], [0.9, 0.9, 0.9, 0.1]])

    class Signals:
        pass

    signals = Signals()
    signals.agree, signals.scores = agree, {"confidence": score}
    heads = lens_heads(smollm, layers)
    pair = calibrate_checks(heads, signals, "confidence", 1.0, sizes=[2])
    assert pair["layers"] == [10, 20] and pair["layers_per_token"] == (10 + 10 + 20 + 30) / 4
    assert pair["method"].startswith("early-exit:confidence/at=10.20@")
    costly = calibrate_checks(heads, signals, "confidence", 1.0, sizes=[1, 2], check_cost=10.0)
    assert costly["layers"] == [10] and costly["cost_per_token"] == (10 + 10 + 30 + 30) / 4 + 10.0


@pytest.mark.model
def test_layer_signals_agree_with_the_heads(smollm, tiny_data):
    heads = lens_heads(smollm, [20, 26])
    signals = layer_signals(heads, tiny_data, ["confidence", "margin"])
    assert signals.agree.shape == (2, len(tiny_data))
    assert torch.allclose(signals.agree.float().mean(1), torch.tensor(list(agreement(heads, tiny_data).values())))
    conf = signals.scores["confidence"]
    assert (conf > 0).all() and (conf <= 1).all() and (signals.scores["margin"] <= conf).all()


@pytest.mark.model
def test_classifier_trains_saves_and_decides(smollm, tiny_data, tmp_path):
    heads = lens_heads(smollm, [20, 26])
    mlps = train_classifier(heads, tiny_data, steps=20, batch=64, progress=False)
    path = save_classifier(smollm, mlps, tmp_path / "c.safetensors", {})
    loaded = load_classifier(smollm, path)
    policy = Classifier(0.5, smollm, loaded)
    h = tiny_data.hidden[26][:5].float()
    s = policy.scores(26, h)
    assert s.shape == (5,) and ((s >= 0) & (s <= 1)).all()
    torch.testing.assert_close(s, Classifier(0.5, smollm, mlps).scores(26, h))
    assert policy.decide(26, h[0], None) == (float(s[0]) > 0.5)
    assert not Classifier(1.0, smollm, loaded).decide(26, h[0], None)
    assert policy.decision_macs() < 0.05 * sum(p.numel() for p in smollm.layers[0].parameters())


def test_check_counts_parse_and_refuse_in_one_line():
    import argparse

    from dyncomplete.commands.calibrate import check_counts

    assert check_counts("2-4") == range(2, 5) and check_counts("3") == range(3, 4)
    for bad in ("4-2", "0-2", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            check_counts(bad)


@pytest.mark.model
def test_a_shortlist_always_holds_the_end_tokens(smollm):
    """Source files never hold `<|endoftext|>`: without its row an exit that emits from the
    shortlist alone (`emit=short`) could not end a completion."""
    from dyncomplete.engine import eos_ids_of
    from dyncomplete.exits.shortlist import Shortlist, shortlist_ids

    ends = eos_ids_of(smollm)
    assert ends and not ends <= set(shortlist_ids(smollm, 64))
    short = Shortlist(smollm, 64)
    assert ends <= short.members and short.size == len(short.ids) == 64 + len(ends - set(shortlist_ids(smollm, 64)))
    normed = smollm.final_norm(torch.randn(1, 1, smollm.hidden_size))
    full = smollm.head(normed).float().reshape(-1)
    row = short.for_request().spread(short.logits(normed).reshape(-1))
    for t in ends:
        assert torch.isfinite(row[t]) and torch.allclose(row[t], full[t], atol=1e-4)


def test_tokens_rank_by_how_often_the_files_use_them_and_fill_a_shortlist(tmp_path, monkeypatch):
    """`rank-tokens`: most frequent first, ties by the lower id; a shortlist takes the ranked ids,
    then the lowest ids it lacks; a model without the artefact gets the lowest ids."""
    from types import SimpleNamespace

    from dyncomplete.exits import artefacts, shortlist

    (tmp_path / "a.py").write_text("b a b\n")
    (tmp_path / "b.py").write_text("c b a d")
    ranked, counted = shortlist.rank_tokens(lambda text: [ord(c) for c in text if c.isalpha()],
                                            [tmp_path / "a.py", tmp_path / "b.py"])
    assert ranked == [ord("b"), ord("a"), ord("c"), ord("d")] and counted == 7
    model = SimpleNamespace(name="no-such-model", source_sha256="0" * 64, vocab_size=200)
    assert shortlist.shortlist_ids(model, 5) == [0, 1, 2, 3, 4]
    path = shortlist.save_ranks(model, [150, 3, 120], {"data": "test"}, tmp_path / shortlist.RANKS_FILE)
    monkeypatch.setattr(artefacts, "default_path", lambda m, name: tmp_path / name)
    assert path.is_file() and shortlist.shortlist_ids(model, 2) == [150, 3]
    assert shortlist.shortlist_ids(model, 5) == [150, 3, 120, 0, 1]


def test_rank_tokens_refuses_an_unknown_language_in_one_line(capsys):
    from dyncomplete.cli import main

    assert main(["rank-tokens", "--langs", "python,cobol"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dyncomplete: error: --langs takes python, java") and "\n" not in err
