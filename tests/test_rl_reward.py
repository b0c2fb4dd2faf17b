"""The exit environment pays GREEN-CODE's Eq. 2 rewards: hand-computed episodes."""

import numpy as np
import pytest

from dyncomplete.training.rl.data import ExitData
from dyncomplete.training.rl.env import ExitEnv
from dyncomplete.exits.agent import CONTINUE, EXIT
from dyncomplete.training.rl.reward import RewardConfig, optimal_exits

PYTHON = RewardConfig(alpha=1.0, beta=0.5, gamma=0.5)
JAVA = RewardConfig(alpha=1.0, beta=1.0, gamma=1.0)


def toy_data() -> ExitData:
    """Exit layers 2, 4, 6 of an 8-layer model; four tokens."""
    exit_preds = np.array([[5, 7, 7],     # agrees with the final layer from layer 4 on
                           [1, 2, 3],     # never agrees: optimal exit is the final layer (8)
                           [3, 3, 4],     # final says 4 (from layer 6); the true token 3 from layer 2
                           [1, 2, 3]], dtype=np.int32)
    final = np.array([7, 9, 4, 9], dtype=np.int32)
    truth = np.array([7, 9, 3, 11], dtype=np.int32)  # token 3: no layer is right
    hidden = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float16)
    return ExitData(hidden, exit_preds, final, truth, [2, 4, 6], 8)


def episode(env: ExitEnv, token: int, actions) -> list[float]:
    env.reset(options={"token": token})
    rewards = []
    for i, a in enumerate(actions):
        _, r, done, truncated, _ = env.step(a)
        rewards.append(r)
        assert done == (i == len(actions) - 1) and not truncated
    return rewards


def test_optimal_exit_is_first_agreeing_layer():
    d = toy_data()
    assert optimal_exits(d.exit_preds, d.final_preds, d.layers, 8).tolist() == [4, 8, 6, 8]
    assert d.optimal("final").tolist() == [4, 8, 6, 8]
    # ground truth: token 2 is right at layer 2; token 3 is right nowhere, so it follows the final layer
    assert d.optimal("ground-truth").tolist() == [4, 8, 2, 8]
    with pytest.raises(ValueError):
        d.optimal("oracle")


@pytest.mark.parametrize("cfg, early, late", [(PYTHON, -1.0, -1.0), (JAVA, -2.0, -2.0)])
def test_hand_computed_episodes(cfg, early, late):
    env = ExitEnv(toy_data(), "final", cfg)
    # token 0, optimal layer 4
    assert episode(env, 0, [EXIT]) == [early]                          # -beta * (4 - 2)
    assert episode(env, 0, [CONTINUE, EXIT]) == [1.0, 1.0]             # continue before l*, exit at l*
    assert episode(env, 0, [CONTINUE, CONTINUE, EXIT]) == [1.0, late, late]  # -gamma*(6-4) twice
    assert episode(env, 0, [CONTINUE] * 3) == [1.0, late, 2 * late]    # last continue: -gamma*(8-4)
    # token 1, optimal = final layer 8: continuing everywhere is right, exiting at 6 is early by 2
    assert episode(env, 1, [CONTINUE] * 3) == [1.0, 1.0, 1.0]
    assert episode(env, 1, [CONTINUE, CONTINUE, EXIT]) == [1.0, 1.0, early]


def test_alpha_and_ground_truth_target():
    env = ExitEnv(toy_data(), "ground-truth", RewardConfig(alpha=2.0, beta=0.25, gamma=0.75))
    assert episode(env, 2, [EXIT]) == [2.0]                      # true token already at layer 2
    assert episode(env, 2, [CONTINUE, EXIT]) == [-1.5, -1.5]     # -0.75 * (4 - 2), twice
    env = ExitEnv(toy_data(), "final", RewardConfig(alpha=2.0, beta=0.25, gamma=0.75))
    assert episode(env, 2, [EXIT]) == [-1.0]                     # -0.25 * (6 - 2)
    assert episode(env, 2, [CONTINUE, CONTINUE, EXIT]) == [2.0, 2.0, 2.0]


def test_observation_is_hidden_state_and_depth():
    d = toy_data()
    env = ExitEnv(d, "final", PYTHON)
    obs, _ = env.reset(options={"token": 1})
    assert obs.shape == env.observation_space.shape == (6,)
    np.testing.assert_array_equal(obs[:5], d.hidden[1, 0].astype(np.float32))
    assert obs[5] == pytest.approx(2 / 8)
    obs, *_ = env.step(CONTINUE)
    np.testing.assert_array_equal(obs[:5], d.hidden[1, 1].astype(np.float32))
    assert obs[5] == pytest.approx(4 / 8)
