"""PPO training of the exit agent on precomputed episodes, and its evaluation on held-out tokens.

As in GREEN-CODE: stable-baselines3 PPO with an `MlpPolicy` of two small hidden layers. The
small network runs on one thread (more only add synchronisation cost at this size).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from ...energy.work import full_pass_macs, head_macs, layer_macs
from ...exits.agent import AgentNet
from .data import ExitData
from .env import ExitEnv
from .reward import RewardConfig


def train(data: ExitData, target: str = "final", cfg: RewardConfig = RewardConfig(), timesteps: int = 300_000,
          hidden: tuple[int, ...] = (64, 64), n_envs: int = 8, seed: int = 0, log=None):
    """Train with PPO; returns (actor, curve of (timesteps, mean episode reward), seconds)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(lambda: ExitEnv(data, target, cfg), n_envs=n_envs, seed=seed)
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()

    class Curve(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            episodes = self.model.ep_info_buffer
            if episodes:
                curve.append((self.num_timesteps, float(np.mean([ep["r"] for ep in episodes]))))
                if log and len(curve) % 10 == 1:
                    log(f"{self.num_timesteps}/{timesteps} steps  mean reward {curve[-1][1]:.3f}  "
                        f"{time.perf_counter() - start:.0f} s")

    agent = PPO("MlpPolicy", env, n_steps=256, batch_size=256, n_epochs=4, learning_rate=3e-4, ent_coef=0.01,
                policy_kwargs={"net_arch": list(hidden)}, stats_window_size=500, seed=seed, device="cpu",
                verbose=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the policy is tiny: one thread is fastest; the caller's setting comes back
    try:
        agent.learn(total_timesteps=timesteps, callback=Curve())
    finally:
        torch.set_num_threads(threads)
    return AgentNet.from_sb3(agent.policy), curve, time.perf_counter() - start


def exit_probabilities(net: AgentNet, data: ExitData, batch: int = 4096) -> np.ndarray:
    """P(exit) of every token at every exit layer: (tokens, exits)."""
    depth = torch.tensor(data.layers, dtype=torch.float32) / data.num_layers
    out = []
    with torch.inference_mode():
        for lo in range(0, len(data), batch):
            h = torch.from_numpy(data.hidden[lo:lo + batch]).float()
            obs = torch.cat([h, depth[None, :, None].expand(h.shape[0], -1, 1)], -1)
            out.append(net.p_exit(obs).numpy())
    return np.concatenate(out)


def evaluate(net: AgentNet, data: ExitData, thresholds, model, heads) -> list[dict]:
    """Per threshold T: share of tokens exited early, mean layers run, top-1 agreement with the
    final layer and with the true next token, and compute per token (docs/metrics.md: layers, one
    head where the token leaves, translator, agent checks; relative to one full pass)."""
    p = exit_probabilities(net, data)
    n = len(data.layers)
    layers = np.asarray(data.layers + [data.num_layers])
    preds = np.concatenate([data.exit_preds, data.final_preds[:, None]], 1)
    full = full_pass_macs(model)
    rows = []
    for t in thresholds:
        hit = p > t
        at = np.where(hit.any(1), hit.argmax(1), n)
        chosen = preds[np.arange(len(data)), at]
        run = layers[at]
        checks = np.minimum(at + 1, n)
        work = (run * layer_macs(model) + head_macs(model) + checks * net.macs()
                + (at < n) * heads.map_macs())
        rows.append({"threshold": t, "exited": float((at < n).mean()), "mean_layers": float(run.mean()),
                     "agreement": float((chosen == data.final_preds).mean()),
                     "accuracy": float((chosen == data.truth).mean()), "compute_per_token": float(work.mean() / full)})
    return rows


def plot_curve(curve, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([c[0] for c in curve], [c[1] for c in curve])
    ax.set_xlabel("PPO timesteps")
    ax.set_ylabel("mean episode reward (last 500)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
