"""Dynamic early exit: each token runs layer by layer until an exit policy stops it.

Method names: `early-exit:POLICY@T[/OPTION...]`, options in any order, the threshold may also
follow them (`early-exit:confidence/lens@0.9`, which keeps `--sweep ...@0.5,0.7` simple; the
grammar is `methods.registry.parse_method`'s):
  `lens`            plain logit-lens heads on the shipped heads' layers (default: shipped heads)
  `heads=PATH`      translator heads from a file
  `min=N`           check only exit layers >= N (each check of a logit policy costs one LM head)
  `kv=catchup`      (default) skipped layers are run later for the exited positions, together
                    with the next token that goes deeper: exact caches, no extra approximation
  `kv=propagate`    skipped layers get keys/values projected from the exit hidden state (CALM,
                    GREEN-CODE); llama and qwen2 layouts only

Work is counted as design.md section 3 defines it: every layer run (catch-up included) is a
layer evaluation, a propagated layer counts the fraction of a layer its key/value projections
cost, every head evaluated (to decide or to emit) is a head evaluation, translators and policy
arithmetic go to `extra_macs`.
"""

from __future__ import annotations

import copy

import torch

from ..energy.work import layer_macs
from ..engine import DecodingMethod
from ..engine.sampling import choose_token
from ..exits.heads import ExitHeads, lens_heads, load_heads
from ..exits.policies import ExitPolicy, make_policy

PROPAGATE_KINDS = ("llama", "qwen2")


class EarlyExit(DecodingMethod):
    name = "early-exit"

    def __init__(self, heads: ExitHeads, policy: ExitPolicy, kv: str = "catchup", min_layer: int = 1):
        if kv not in ("catchup", "propagate"):
            raise ValueError(f"kv must be catchup or propagate, got {kv!r}")
        if kv == "propagate" and heads.model.kind not in PROPAGATE_KINDS:
            raise ValueError(f"kv=propagate supports {', '.join(PROPAGATE_KINDS)}, not {heads.model.kind}")
        self.heads, self.policy, self.kv = heads, policy, kv
        self.exits = {e for e in heads.layers if e >= min_layer}
        if not self.exits:
            raise ValueError(f"no exit layer >= {min_layer} among {heads.layers}")

    def decode(self, model, prompt_ids, logits, cache, emitter, generator):
        stats = emitter.stats
        stats.count_full_steps(1, model.num_layers)  # the prefill's last position gave the first token
        position, layers = len(prompt_ids), model.num_layers
        pending: list[tuple[int, torch.Tensor]] = []
        policy = copy.copy(self.policy)  # a policy may keep state along a token (saturation): one per request
        while True:
            token = choose_token(logits, emitter.params, generator)
            if emitter.emit(token, layers, "full" if layers == model.num_layers else "exit"):
                break
            logits, layers, pending = self.step(model, token, position, cache, pending, stats, policy)
            position += 1
        cache.crop(min(cache.lengths))  # leave every layer equally long for whoever reuses it

    def step(self, model, token, position, cache, pending, stats, policy: ExitPolicy | None = None):
        """Run one token until it exits. `pending` holds (resume layer, hidden (1, 1, d)) for the
        exited positions right before `position` that still lack layers resume..L-1; resume
        layers never increase along positions, so the positions missing at a layer are a suffix.
        `policy`: the request's copy of the exit policy (default: the method's own).
        Returns (logits, layers run, pending)."""
        policy = policy or self.policy
        first = position - len(pending)
        start = position  # first position in the running batch
        ctx = model.context(torch.tensor([position]))
        h = model.embed(torch.tensor([token]), ctx)
        policy.reset()
        for j in range(model.num_layers):
            joined = []
            while start > first and pending[start - first - 1][0] == j:
                start -= 1
                joined.insert(0, pending[start - first][1])
            if joined:
                h = torch.cat(joined + [h], dim=1)
                ctx = model.context(torch.arange(start, position + 1))
            assert cache.lengths[j] == start, (j, cache.lengths[j], start)
            h = model.run_layer(j, h, ctx, cache)
            stats.layer_evals += h.shape[1]
            e = j + 1
            if e in self.exits and e < model.num_layers:
                logits = self._exit_logits(model, e, h, stats) if policy.needs_logits else None
                stats.extra_macs += policy.decision_macs()
                if policy.decide(e, h[0, -1], logits):
                    if logits is None:
                        logits = self._exit_logits(model, e, h, stats)
                    if self.kv == "propagate":
                        self._propagate(model, range(e, model.num_layers), h, ctx, cache, stats)
                        return logits, e, []
                    kept = pending[: start - first]
                    return logits, e, kept + [(e, h[:, k : k + 1]) for k in range(h.shape[1])]
        stats.head_evals += 1
        return model.head(model.final_norm(h[:, -1:])).float()[0, -1], model.num_layers, []

    def _exit_logits(self, model, e, h, stats):
        stats.head_evals += 1
        stats.extra_macs += self.heads.map_macs()
        return self.heads.logits(e, h[0, -1])

    def _propagate(self, model, layers, h, ctx, cache, stats):
        share = kv_projection_macs(model) / layer_macs(model)
        propagate_kv(model, layers, h, ctx, cache)
        stats.layer_evals += share * len(layers)


def kv_projection_macs(model) -> float:
    attn = model.layers[0].self_attn
    return float(attn.k_proj.weight.numel() + attn.v_proj.weight.numel())


def propagate_kv(model, layers, hidden, ctx, cache) -> None:
    """Fill `layers` of the cache at the step's positions from `hidden`, with each layer's input
    norm, key/value projections and rotary embedding only (llama/qwen2 layout)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    for j in layers:
        layer = model.layers[j]
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (*x.shape[:-1], -1, attn.head_dim)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = ctx.rotary[model.layer_types[j]]
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        cache.update(k, v, j)


def build(name, model) -> EarlyExit:
    policy = name.arg(0)
    if not policy:
        raise ValueError(f"bad early-exit method {name.text!r}: no policy (early-exit:POLICY@T)")
    if name.threshold is None:
        raise ValueError(f"exit policy {policy!r} needs a threshold: early-exit:{policy}@T")
    heads = load_heads(model, name.options.get("heads") or None)
    if "lens" in name.options:
        heads = lens_heads(model, heads.layers)
    try:
        min_layer = int(name.options.get("min", 1))
    except ValueError:
        raise ValueError(f"min takes a layer number, got {name.options['min']!r}") from None
    return EarlyExit(heads, make_policy(policy, name.threshold, model, heads), name.options.get("kv", "catchup"),
                     min_layer)
