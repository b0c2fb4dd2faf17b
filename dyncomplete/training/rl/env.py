"""The exit environment (gymnasium): one episode is one token of precomputed code.

The agent starts at the first exit layer and sees that layer's normalised hidden state plus the
depth (layer / L); "continue" moves to the next exit layer, "exit" ends the episode, and so does
continuing past the last exit layer (the token then runs to full depth). Rewards: `reward.py`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from .data import ExitData
from .reward import EXIT, RewardConfig, reward


class ExitEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, data: ExitData, target: str = "final", cfg: RewardConfig = RewardConfig()):
        self.data = data
        self.cfg = cfg
        self.optimal = data.optimal(target)
        self.layers = list(data.layers)
        self.depth = np.asarray(self.layers, dtype=np.float32) / data.num_layers
        dim = data.hidden.shape[-1] + 1
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.token = 0
        self.step_index = 0

    def _obs(self) -> np.ndarray:
        h = self.data.hidden[self.token, self.step_index].astype(np.float32)
        return np.append(h, self.depth[self.step_index])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.token = int(self.np_random.integers(len(self.data)))
        if options and "token" in options:
            self.token = int(options["token"])
        self.step_index = 0
        return self._obs(), {}

    def step(self, action):
        layer = self.layers[self.step_index]
        last = self.step_index == len(self.layers) - 1
        next_layer = self.data.num_layers if last else self.layers[self.step_index + 1]
        r = reward(int(action), layer, next_layer, int(self.optimal[self.token]), self.cfg)
        done = int(action) == EXIT or last
        info = {"layer": layer, "optimal": int(self.optimal[self.token])}
        if not done:
            self.step_index += 1
        return self._obs(), r, done, False, info
