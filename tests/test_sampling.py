"""The one token draw (greedy or temperature + top-p) and its random stream, on the device of
the logits. No model needed."""

import pytest
import torch

from dyncomplete.engine import GenerationParams
from dyncomplete.engine.sampling import draw, greedy_index, greedy_indices, make_generator, sample_index, sampling_probs
from dyncomplete.methods.verify import Draft, accept


def test_greedy_draws_the_argmax_without_a_distribution():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    assert draw(logits, GenerationParams(), None) == (1, None)
    assert make_generator(GenerationParams()) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_picks_what_torch_argmax_picks_ties_and_nan_included(dtype):
    """The first index of the largest value, whatever computes it (NumPy's argmax for CPU floats)."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 151936, generator=g).round(decimals=1).to(dtype)  # rounded: many ties
    rows[1, 7] = rows[1, 9] = rows[1].max() + 1  # a tie for the top: the first index wins
    rows[2, 11] = float("nan")  # NaN counts as the largest, as in torch.argmax
    expected = torch.argmax(rows, dim=-1).tolist()
    assert expected[1] == 7 and expected[2] == 11
    assert greedy_indices(rows) == expected
    assert [greedy_index(row) for row in rows] == expected
    assert greedy_index(rows[3].reshape(1, 1, -1)) == expected[3]  # a forward pass's (1, 1, vocab)
    assert greedy_indices(rows[:, ::3]) == torch.argmax(rows[:, ::3], dim=-1).tolist()  # a strided view


def test_top_p_keeps_the_smallest_set_over_p():
    probs = sampling_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), GenerationParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_a_draw_follows_the_weights_and_never_picks_a_zero():
    weights = torch.tensor([0.0, 2.0, 0.0, 1.2, 0.8, 0.0])  # unnormalised: 0.5, 0.3, 0.2
    gen = torch.Generator().manual_seed(3)
    counts = torch.bincount(torch.tensor([sample_index(weights, gen) for _ in range(20000)]), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(counts[[1, 3, 4]] / 20000, torch.tensor([0.5, 0.3, 0.2]), atol=0.015, rtol=0)
    assert sample_index(torch.tensor([0.0, 0.0, 1e-30]), gen) == 2  # a single nonzero weight, however small


@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
def test_seeded_draws_repeat_on_the_logits_device(device):
    params = GenerationParams(temperature=0.8, top_p=0.9, seed=7)
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0)).to(device)
    runs = []
    for _ in range(2):
        gen = make_generator(params, device)
        assert gen.device.type == device
        runs.append([draw(logits, params, gen)[0] for _ in range(20)])
    assert runs[0] == runs[1] and len(set(runs[0])) > 1
    token, probs = draw(logits, params, make_generator(params, device))
    assert probs.device.type == device and float(probs[token]) > 0


@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
def test_speculative_acceptance_runs_on_the_logits_device(device):
    params = GenerationParams(temperature=1.0, seed=1)
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1)).to(device)
    accepted, token = accept(logits, Draft([3, 4]), params, make_generator(params, device))
    assert 0 <= accepted <= 2 and 0 <= token < 20
    assert accept(logits, Draft([int(logits[0].argmax())]), GenerationParams(), None)[0] == 1
