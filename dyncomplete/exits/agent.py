"""`rl@T`: the trained exit agent as an exit policy. At each exit layer the actor network reads
the normalised hidden state and the depth; the token exits when P(exit) > T (strict, so T = 1.0
never exits). Its forward pass is counted as the policy's own cost (`decision_macs`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.native.bindings import ExitNetwork
from . import artefacts
from .policies import ExitPolicy

AGENT_FILE = "agent.safetensors"
CONTINUE, EXIT = 0, 1  # the agent's actions


def normalise(hidden: torch.Tensor) -> torch.Tensor:
    """Unit root-mean-square along the last axis (no learned weight)."""
    h = hidden.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


def features(hidden: torch.Tensor, layer: int, num_layers: int) -> torch.Tensor:
    """The agent's observation(s) for hidden state(s) (..., d) at one exit layer: the normalised
    hidden state and the depth reached (layer / L)."""
    h = normalise(hidden)
    return torch.cat([h, h.new_full((*h.shape[:-1], 1), layer / num_layers)], -1)


class AgentNet(torch.nn.Module):
    """The PPO actor alone: tanh MLP -> logits of (continue, exit). The critic is not shipped."""

    def __init__(self, linears: list[torch.nn.Linear]):
        super().__init__()
        self.linears = torch.nn.ModuleList(linears)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs
        for lin in self.linears[:-1]:
            x = torch.tanh(lin(x))
        return self.linears[-1](x)

    def p_exit(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.forward(obs), -1)[..., EXIT]

    def macs(self) -> float:
        """Multiply-accumulates of one decision: the matrix products plus the input's
        normalisation (about two per element)."""
        return float(sum(lin.weight.numel() for lin in self.linears)) + 2.0 * self.linears[0].in_features

    @classmethod
    def from_sb3(cls, policy) -> "AgentNet":
        """Copy the actor of an SB3 `MlpPolicy` (tanh policy_net + action_net) to float32."""
        linears = [m for m in policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
        linears.append(policy.action_net)
        copies = []
        for lin in linears:
            new = torch.nn.Linear(lin.in_features, lin.out_features)
            new.load_state_dict({k: v.detach().cpu().float() for k, v in lin.state_dict().items()})
            copies.append(new)
        return cls(copies).requires_grad_(False).eval()

    def save(self, path: Path, meta: dict) -> None:
        tensors = {f"{i}.{k}": v for i, lin in enumerate(self.linears) for k, v in lin.state_dict().items()}
        artefacts.save_artefact(path, tensors, meta)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "AgentNet":
        linears = []
        for i in range(len(tensors) // 2):
            w, b = tensors[f"{i}.weight"], tensors[f"{i}.bias"]
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            lin.load_state_dict({"weight": w, "bias": b})
            linears.append(lin)
        return cls(linears).requires_grad_(False).eval()


def default_path(model) -> Path:
    return artefacts.default_path(model, AGENT_FILE)


def load_agent(model, path=None) -> tuple[AgentNet, dict]:
    """The agent at `path` (default: the one shipped for this model) and its metadata record;
    refuses an agent trained on other weights or another hidden size."""
    path = Path(path) if path is not None else default_path(model)
    tensors, meta = artefacts.load_artefact(path, model, "exit agent",
                                            f"train one with `dyncomplete train-agent --model {model.name}`")
    net = AgentNet.from_tensors(tensors)
    if net.linears[0].in_features != model.hidden_size + 1:
        raise ValueError(f"exit agent {path} reads width {net.linears[0].in_features - 1}, the model has {model.hidden_size}")
    return net.to(model.device), meta


class RLPolicy(ExitPolicy):
    def __init__(self, threshold: float, net: AgentNet, num_layers: int):
        super().__init__(threshold)
        self.net = net
        self.num_layers = num_layers

    @classmethod
    def build(cls, threshold, model, heads):
        return cls(threshold, load_agent(model)[0], model.num_layers)

    @torch.inference_mode()
    def scores(self, e: int, hidden: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """P(exit) for tokens' hidden states (..., d) at exit layer e."""
        return self.net.p_exit(features(hidden, e, self.num_layers))

    def decision_macs(self) -> float:
        return self.net.macs()

    def networks(self, layers):
        network = ExitNetwork("unit_rms_depth", "tanh", [(lin.weight, lin.bias) for lin in self.net.linears])
        return {e: network for e in layers}
