"""The exit agent: PPO learns a separable toy task, the exported actor equals SB3's, and at
threshold 1.0 the policy never exits."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dyncomplete.training.rl.data import ExitData
from dyncomplete.training.rl.env import ExitEnv
from dyncomplete.exits.agent import AgentNet, RLPolicy
from dyncomplete.training.rl.train import exit_probabilities, train


def separable_data(tokens: int = 64) -> ExitData:
    """Even tokens are settled at the first exit layer (hidden +1), odd ones never (hidden -1)."""
    easy = np.arange(tokens) % 2 == 0
    hidden = np.where(easy[:, None, None], 1.0, -1.0) * np.ones((tokens, 3, 4))
    final = np.full(tokens, 7, dtype=np.int32)
    exit_preds = np.where(easy[:, None], 7, 1).astype(np.int32) * np.ones((1, 3), dtype=np.int32)
    return ExitData(hidden.astype(np.float16), exit_preds, final, final.copy(), [2, 4, 6], 8)


@pytest.fixture(scope="module")
def trained():
    data = separable_data()
    net, curve, _ = train(data, timesteps=12288, hidden=(16, 16), n_envs=4, seed=1)
    return data, net, curve


def test_ppo_learns_when_to_exit(trained):
    data, net, curve = trained
    p = exit_probabilities(net, data)
    assert p[0::2, 0].mean() > 0.8 > 0.2 > p[1::2].mean()
    assert curve[-1][1] > curve[0][1]


def test_threshold_one_never_exits(trained):
    data, net, _ = trained
    strict, loose = RLPolicy(1.0, net, data.num_layers), RLPolicy(0.5, net, data.num_layers)
    easy = torch.from_numpy(data.hidden[0, 0].astype(np.float32))
    assert float(strict.scores(2, easy)) > 0.8
    assert loose.decide(2, easy, None)
    for token in range(len(data)):
        for i, layer in enumerate(data.layers):
            assert not strict.decide(layer, torch.from_numpy(data.hidden[token, i].astype(np.float32)), None)


def test_exported_actor_matches_sb3_and_round_trips(tmp_path):
    from stable_baselines3 import PPO

    env = ExitEnv(separable_data(), "final")
    agent = PPO("MlpPolicy", env, policy_kwargs={"net_arch": [8, 8]}, seed=0, device="cpu")
    net = AgentNet.from_sb3(agent.policy)
    obs = torch.randn(10, 5)
    with torch.no_grad():
        want = agent.policy.get_distribution(obs).distribution.probs[:, 1]
    torch.testing.assert_close(net.p_exit(obs), want)
    net.save(tmp_path / "agent.safetensors", {"note": "test"})
    loaded = AgentNet.from_tensors(load_file(str(tmp_path / "agent.safetensors")))
    torch.testing.assert_close(loaded.p_exit(obs), want)
    assert net.macs() == 5 * 8 + 8 * 8 + 8 * 2 + 2 * 5


def test_batched_scores_equal_single_decisions(trained):
    data, net, _ = trained
    policy = RLPolicy(0.5, net, data.num_layers)
    hidden = torch.from_numpy(data.hidden[:, 1].astype(np.float32)) * 3.0  # scale is normalised away
    single = torch.tensor([float(policy.scores(4, h)) for h in hidden])
    torch.testing.assert_close(policy.scores(4, hidden), single)
    torch.testing.assert_close(single, torch.from_numpy(exit_probabilities(net, data)[:, 1]), atol=1e-3, rtol=0)
