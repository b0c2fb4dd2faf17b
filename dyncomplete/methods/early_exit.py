"""Dynamic early exit: each token runs layer by layer until an exit policy stops it.

Method names: `early-exit:POLICY@T[/OPTION...]`, options in any order, the threshold may also
follow them (`early-exit:confidence/lens@0.9`, which keeps `--sweep ...@0.5,0.7` simple; the
grammar is `methods.registry.parse_method`'s):
  `lens`            plain logit-lens heads on the shipped heads' layers (default: shipped heads)
  `heads=PATH`      translator heads from a file
  `min=N`           check only exit layers >= N (each check of a logit policy costs one LM head)
  `at=A.B...`       check only exit layers A, B, ... (dots between them; `calibrate --checks`
                    picks such a set)
  `short=N`         logit policies decide on a shortlist head: N frequent rows plus the request's
                    own tokens (`exits/shortlist.py`; default 4096, 0: the full head at every
                    check); an exit it allows is confirmed with the full head, which also gives
                    the emitted token
  `emit=short`      an exited token is chosen from the shortlist head (`short=N` rows, here
                    32768 by default, plus the request's own tokens) instead of the full head: an
                    exit then skips the full head's rows too (Qwen2.5-Coder: 151,936 rows, about
                    7 layers of bytes), and a token outside both lists can only come from a
                    full-depth step (default `emit=full`)
  `kv=catchup`      (default) skipped layers are run later for the exited positions, together
                    with the next token that goes deeper: exact caches, no extra approximation
  `kv=propagate`    skipped layers get keys/values projected from the exit hidden state (CALM,
                    GREEN-CODE); llama and qwen2 layouts only
  `line=N`          decide the depth once a line (Glavas et al. 2024: a depth per sequence beat
                    one per token): the policy decides each of a line's first N decoded tokens,
                    and the line's later tokens run to the deepest layer those reached, with no
                    checks (an exit there, or every layer); a token holding a newline starts
                    the next line
  `prompt=L`        prompt tokens run layers below L only; the layers from L on get keys and
                    values projected from their state at L, as `kv=propagate` writes them for an
                    exited token. The prompt's last position runs every layer, so the first token
                    is the full model's (reading those projections). With `static@L` no later
                    token reads above L either, so the prompt's layers above L are skipped work
                    (llama and qwen2 layouts)

Work is counted as docs/metrics.md defines it: every layer run (catch-up included) is a
layer evaluation, a propagated layer counts the fraction of a layer its key/value projections
cost, every head evaluated (to decide or to emit) is a head evaluation, translators, shortlist
heads and policy arithmetic go to `extra_macs`; `Stats.decision_macs` holds the part spent on
deciding (translators, shortlists, policies and the full heads of checks that did not exit).
"""

from __future__ import annotations

import copy

import torch

from ..energy.work import head_macs, layer_macs
from ..engine import DecodingMethod
from ..engine.sampling import choose_token
from ..exits.heads import ExitHeads, lens_heads, load_heads
from ..exits.policies import ExitPolicy, Static, make_policy
from ..exits.shortlist import DEFAULT_SIZE, EMIT_SIZE, RequestShortlist, Shortlist
from ..models.fast import rows_waiting
from ..models.native.bindings import Exits

PROPAGATE_KINDS = ("llama", "qwen2")


class EarlyExit(DecodingMethod):
    name = "early-exit"

    def __init__(self, heads: ExitHeads, policy: ExitPolicy, kv: str = "catchup", min_layer: int = 1,
                 shortlist: Shortlist | None = None, at: set[int] | None = None, emit: str = "full",
                 line: int = 0, prompt: int = 0):
        if kv not in ("catchup", "propagate"):
            raise ValueError(f"kv must be catchup or propagate, got {kv!r}")
        if emit not in ("full", "short"):
            raise ValueError(f"emit must be full or short, got {emit!r}")
        if emit == "short" and shortlist is None:
            raise ValueError("emit=short needs a shortlist head (short=N with N >= 2)")
        if kv == "propagate" and heads.model.kind not in PROPAGATE_KINDS:
            raise ValueError(f"kv=propagate supports {', '.join(PROPAGATE_KINDS)}, not {heads.model.kind}")
        if prompt and heads.model.kind not in PROPAGATE_KINDS:
            raise ValueError(f"prompt=L supports {', '.join(PROPAGATE_KINDS)}, not {heads.model.kind}")
        if not 0 <= prompt < heads.model.num_layers:
            raise ValueError(f"prompt takes a layer from 1 to {heads.model.num_layers - 1}, got {prompt}")
        self.prompt_depth = prompt or None
        self.heads, self.policy, self.kv, self.emit = heads, policy, kv, emit
        self.shortlist = shortlist if policy.needs_logits or emit == "short" else None
        if at is not None and not at <= set(heads.layers):
            raise ValueError(f"at= names layers without an exit head: {sorted(at - set(heads.layers))} "
                             f"(the heads' layers are {heads.layers})")
        self.exits = {e for e in heads.layers if e >= min_layer and (at is None or e in at)}
        if not self.exits:
            raise ValueError(f"no exit layer >= {min_layer} among {heads.layers}")
        checks = policy.networks(sorted(self.exits))
        self.native = Exits(checks, policy.threshold) if checks is not None else None
        self.line = line
        # line=N: a static method per depth a line can be fixed at (an exit layer, or every layer)
        self.fixed = {e: EarlyExit(heads, Static(e), kv, shortlist=shortlist, at={e} if e in self.exits else None,
                                   emit=emit) for e in sorted(self.exits) + [heads.model.num_layers]} if line else {}

    def decode(self, model, prompt_ids, logits, cache, emitter, generator):
        stats = emitter.stats
        stats.count_full_steps(1, model.num_layers)  # the prefill's last position gave the first token
        position, layers = len(prompt_ids), model.num_layers
        pending: list[tuple[int, torch.Tensor]] = []
        policy = copy.copy(self.policy)  # a policy may keep state along a token (saturation): one per request
        shortlist = self.shortlist.for_request() if self.shortlist is not None else None
        if shortlist is not None:
            shortlist.grow(prompt_ids)
        decided: list[int] = []  # line=N: the depths of the current line's deciding tokens
        while True:
            token = choose_token(logits, emitter.params, generator)
            if emitter.emit(token, layers, "full" if layers == model.num_layers else "exit"):
                break
            if shortlist is not None:
                shortlist.grow([token])
            if self.line and "\n" in emitter.text[emitter.previous:]:
                decided = []
            if self.line and len(decided) >= self.line:
                method, step_policy = self.fixed[max(decided)], None
            else:
                method, step_policy = self, policy
            logits, layers, pending = method.step(model, token, position, cache, pending, stats, step_policy, shortlist)
            if method is self and self.line:
                decided.append(layers)
            position += 1
        cache.crop(min(cache.lengths))  # leave every layer equally long for whoever reuses it

    def prompt_pass(self, model, ids, cache, last):
        """`prompt=L` (module docstring); without it, every layer."""
        depth = self.prompt_depth
        if depth is None:
            return super().prompt_pass(model, ids, cache, last)
        start = cache.lengths[0]
        ctx = model.context(torch.arange(start, start + len(ids)))
        h = model.run_layers(0, model.embed(torch.tensor(ids), ctx), ctx, cache, depth)
        projected = len(ids) - 1 if last else len(ids)
        if projected:
            part = ctx if projected == len(ids) else model.context(torch.arange(start, start + projected))
            model.project_kv(range(depth, model.num_layers), h[:, :projected], part, cache)
        if not last:
            return None
        h = model.run_layers(depth, h[:, -1:], model.context(torch.tensor([start + projected])), cache)
        return model.logits(h)[0, -1]

    def step(self, model, token, position, cache, pending, stats, policy: ExitPolicy | None = None,
             shortlist: RequestShortlist | None = None):
        """Run one token until it exits. `pending` holds (resume layer, hidden (1, 1, d)) for the
        exited positions right before `position` that still lack layers resume..L-1; resume
        layers never increase along positions, so the positions missing at a layer are a suffix.
        `policy`: the request's copy of the exit policy (default: the method's own); `shortlist`:
        the request's shortlist (default: the method's, without the request's tokens).
        Returns (logits, layers run, pending)."""
        policy = policy or self.policy
        if shortlist is None and self.shortlist is not None:
            shortlist = self.shortlist.for_request()
        if self.native is not None and type(policy) is type(self.policy):  # the method's policy or a request's copy
            done = self._native_step(model, token, position, cache, pending, stats, policy, shortlist)
            if done is not None:
                return done
        first = position - len(pending)
        start = position  # first position in the running batch
        ctx = model.context(torch.tensor([position]))
        h = model.embed(torch.tensor([token]), ctx)
        policy.reset()
        j = 0
        while j < model.num_layers:
            joined = []
            while start > first and pending[start - first - 1][0] == j:
                start -= 1
                joined.insert(0, pending[start - first][1])
            if joined:
                h = torch.cat(joined + [h], dim=1)
                ctx = model.context(torch.arange(start, position + 1))
            assert cache.lengths[j] == start, (j, cache.lengths[j], start)
            # up to the next exit check or the next layer where pending positions join, in one call
            stops = [e for e in self.exits if e > j] + [model.num_layers]
            if start > first:
                stops.append(pending[start - first - 1][0])
            end = min(stops)
            h = model.run_layers(j, h, ctx, cache, end)
            stats.layer_evals += h.shape[1] * (end - j)
            j = end
            if j in self.exits and j < model.num_layers:
                logits = self._decide(model, j, h, stats, policy, shortlist)
                if logits is not None:
                    if self.kv == "propagate":
                        self._propagate(model, range(j, model.num_layers), h, ctx, cache, stats)
                        return logits, j, []
                    kept = pending[: start - first]
                    return logits, j, kept + [(j, h[:, k : k + 1]) for k in range(h.shape[1])]
        return self._full_logits(model, h, stats), model.num_layers, []

    @staticmethod
    def _full_logits(model, h, stats) -> torch.Tensor:
        """The last row's logits after every layer."""
        stats.head_evals += 1
        return model.logits(h[:, -1:])[0, -1]

    def _native_step(self, model, token, position, cache, pending, stats, policy, shortlist):
        """`step` with the decisions inside decode.c's layer loop (`LayeredModel.run_exit`): one
        native call per token, the pending positions joining at their resume layers there; the
        same layers run as in the Python loop. None where the engine cannot (nothing ran)."""
        first = position - len(pending)
        here = model.context(torch.tensor([position]))
        h = model.embed(torch.tensor([token]), here)
        ctx = here if not pending else model.context(torch.arange(first, position + 1))
        if pending:
            h = torch.cat([row for _, row in pending] + [h], dim=1)
        resume = [layer for layer, _ in pending] + [0]
        done = model.run_exit(h, resume, ctx, cache, self.native, self.kv == "propagate")
        if done is None:
            return None
        e, out = done
        layers = model.num_layers
        stats.layer_evals += len(resume) * e - sum(rows_waiting(resume, e))
        checks = sum(1 for c in self.native.layers if c <= e and c < layers)
        stats.extra_macs += checks * policy.decision_macs()
        stats.decision_macs += checks * policy.decision_macs()
        if e == layers:
            return self._full_logits(model, out, stats), layers, []
        logits = self._exit_logits(model, e, out[0, -1], stats, shortlist)
        if self.kv == "propagate":
            stats.layer_evals += propagated_evals(model, layers - e)
            return logits, e, []
        return logits, e, [(max(r, e), out[:, k : k + 1]) for k, r in enumerate(resume)]

    def _decide(self, model, e, h, stats, policy, shortlist) -> torch.Tensor | None:
        """The exit head's logits where the token exits at layer `e`, else None. The check's
        work goes to `stats.decision_macs`, less the translator and head an exit needs anyway."""
        hidden = h[0, -1]
        head = head_macs(model)
        before = stats.extra_macs + stats.head_evals * head
        stats.extra_macs += policy.decision_macs()
        logits = None
        if not policy.needs_logits:
            exits = policy.decide(e, hidden, None)
        elif shortlist is None:
            logits = self._exit_logits(model, e, hidden, stats)
            exits = policy.decide(e, hidden, logits)
        else:
            normed = self.heads.normed(e, hidden)
            stats.extra_macs += self.heads.map_macs() + shortlist.macs()
            short = shortlist.logits(normed)
            exits = policy.decide(e, hidden, short)
            if exits and self.emit == "short":
                logits = shortlist.spread(short)
            elif exits:  # confirmed by the full head, which the emitted token needs anyway
                logits = self._head(model, normed, stats)
                exits = policy.decide(e, hidden, logits)
        if exits and logits is None:
            logits = self._exit_logits(model, e, hidden, stats, shortlist)
        spent = stats.extra_macs + stats.head_evals * head - before
        stats.decision_macs += spent - (self._emit_macs(model, shortlist) if exits else 0.0)
        return logits if exits else None

    def _exit_logits(self, model, e, hidden, stats, shortlist: RequestShortlist | None = None):
        """An exited token's logits: the full head's, or with `emit=short` the shortlist's (every
        other row -inf)."""
        stats.extra_macs += self.heads.map_macs()
        normed = self.heads.normed(e, hidden)
        if self.emit == "short":
            stats.extra_macs += shortlist.macs()
            return shortlist.spread(shortlist.logits(normed))
        return self._head(model, normed, stats)

    def _emit_macs(self, model, shortlist) -> float:
        """The work an exited token's own logits cost (translator and head), not counted as deciding."""
        head = shortlist.macs() if self.emit == "short" else head_macs(model)
        return self.heads.map_macs() + head

    @staticmethod
    def _head(model, normed, stats):
        stats.head_evals += 1
        return model.head(normed).float()

    def _propagate(self, model, layers, h, ctx, cache, stats):
        model.project_kv(layers, h, ctx, cache)
        stats.layer_evals += propagated_evals(model, len(layers))


def propagated_evals(model, layers: int) -> float:
    """Layer evaluations `layers` propagated layers count: the share of a layer their key and
    value projections cost, each."""
    return kv_projection_macs(model) / layer_macs(model) * layers


def kv_projection_macs(model) -> float:
    attn = model.layers[0].self_attn
    return float(attn.k_proj.weight.numel() + attn.v_proj.weight.numel())


def build(name, model) -> EarlyExit:
    policy = name.arg(0)
    if not policy:
        raise ValueError(f"bad early-exit method {name.text!r}: no policy (early-exit:POLICY@T)")
    if name.threshold is None:
        raise ValueError(f"exit policy {policy!r} needs a threshold: early-exit:{policy}@T")
    heads = load_heads(model, name.options.get("heads") or None)
    if "lens" in name.options:
        heads = lens_heads(model, heads.layers)
    min_layer = _int_option(name, "min", 1, "a layer number")
    emit = name.options.get("emit", "full")
    short = _int_option(name, "short", EMIT_SIZE if emit == "short" else DEFAULT_SIZE, "a number of rows")
    try:
        at = {int(e) for e in name.options["at"].split(".")} if "at" in name.options else None
    except ValueError:
        raise ValueError(f"at takes exit layers with dots between them (at=18.22), got {name.options['at']!r}") from None
    line = _int_option(name, "line", 0, "a number of tokens")
    if "line" in name.options and line < 1:
        raise ValueError(f"line takes the number of tokens that decide a line's depth (>= 1), got {line}")
    prompt = _int_option(name, "prompt", 0, "a layer number")
    if "prompt" in name.options and prompt < 1:
        raise ValueError(f"prompt takes a layer from 1 to {model.num_layers - 1}, got {prompt}")
    policy = make_policy(policy, name.threshold, model, heads)
    shortlist = Shortlist(model, short) if short and (policy.needs_logits or emit == "short") else None
    return EarlyExit(heads, policy, name.options.get("kv", "catchup"), min_layer, shortlist, at, emit, line, prompt)


def _int_option(name, key: str, default: int, takes: str) -> int:
    """The method name's option `key` as an integer (`default` where it is absent)."""
    try:
        return int(name.options.get(key, default))
    except ValueError:
        raise ValueError(f"{key} takes {takes}, got {name.options[key]!r}") from None
