"""Lossless speculative decoding: a proposer drafts, the full model verifies in one pass.

Per step: the proposer drafts k >= 0 tokens after the last emitted one; `verify.score` runs the
model over that token and the draft at once (from the layer the draft reached); `verify.accept`
keeps the agreeing prefix plus the model's own next token; the cache is cropped back past the
rejected positions, in every layer. Greedy output is token-identical to `baseline` (in float32);
sampled output has exactly its distribution.

Each drafter family has one builder in `PROPOSERS` (its method names are described there; the
grammar is its `Family` line in `registry.FAMILIES`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..engine import DecodingMethod
from ..engine.sampling import choose_token
from ..exits.heads import load_heads
from ..models import LayeredModel, load
from ..models.verify_cost import verify_cost
from .draft_control import ConfidenceStop, EntropyStop, ExitLayerController, expected_tokens
from .datastore import Datastore
from .proposers import (DraftModelProposer, LookupProposer, LookupThenSelf, Proposer, RetrievalProposer,
                        SelfDraftProposer, self_draft_costs)
from .registry import MethodName
from .stand import StandProposer
from .verify import accept, accept_tree, commit_path, score

DEFAULT_SELF_DRAFT = 3
DEFAULT_DYNAMIC_MAX = 8
DEFAULT_CONFIDENCE = 0.7  # layer 26 of SmolLM2: tokens above it agree 96% (design.md)
DEFAULT_ENTROPY = 1.5
DEFAULT_SHORTLIST = 4096


class SpeculativeDecoding(DecodingMethod):
    """`proposer` is a template that requests never change: each request drafts with its own
    copy (`Proposer.begin`), started in `prepare` and used in `decode`, which `generate` runs on
    the calling thread. So one object serves concurrent requests, and every request starts from
    the same priors: the same request gives the same drafts, statistics and (seeded) sample."""

    def __init__(self, proposer: Proposer):
        self.proposer = proposer
        self.batchable = proposer.token_chains  # its passes are then `forward` and `score_chain` only
        self._request = threading.local()  # the running request's proposer, per thread

    def prepare(self, model, prompt_ids, params, generator, stats):
        self._request.proposer = self.proposer.begin(model, prompt_ids, params, generator, stats)

    def decode(self, model, prompt_ids, logits, cache, emitter, generator):
        proposer, self._request.proposer = getattr(self._request, "proposer", None), None
        if proposer is None:
            raise RuntimeError("SpeculativeDecoding.decode without prepare: call generate()")
        stats, params, depth = emitter.stats, emitter.params, model.num_layers
        token = choose_token(logits, params, generator)
        stats.count_full_steps(1, depth)  # the prompt pass's last position
        if emitter.emit(token, depth, "full"):
            return
        try:
            self._steps(proposer, model, prompt_ids, token, cache, emitter, generator)
        finally:  # keep only real tokens: a caller may reuse the cache as a prefix cache
            cache.crop(len(prompt_ids) + len(emitter.ids))

    def _steps(self, proposer, model, prompt_ids, token, cache, emitter, generator):
        stats, params, depth = emitter.stats, emitter.params, model.num_layers
        context, position = list(prompt_ids) + [token], len(prompt_ids)
        while True:
            draft = proposer.propose(model, cache, context, position)
            logits = score(model, cache, context[-1], draft, position)
            if len(logits) <= len(draft.tokens):  # a shared verify budget scored the chain's start only
                draft.trim(len(logits) - 1)
            k = len(draft.tokens)
            stats.layer_evals += (k + 1) * (depth - draft.start_layer)
            stats.head_evals += k + 1
            if draft.parents is None:
                accepted, next_token = accept(logits, draft, params, generator)
                cache.crop(position + accepted + 1)
                path = list(range(accepted))
            else:
                path, next_token = accept_tree(logits, draft, params, generator)
                accepted = len(path)
                commit_path(cache, position, path)
            draft.accepted = path
            stats.record_draft(k, accepted, draft.source, draft.depths())
            proposer.feedback(draft, accepted)
            emitted = [draft.tokens[i] for i in path] + [next_token]
            for i, t in enumerate(emitted):
                if emitter.emit(t, depth, "draft" if i < accepted else "bonus"):
                    return
            context += emitted
            position += accepted + 1


def _ints(args: tuple[str, ...], what: str) -> list[int]:
    try:
        return [int(x) for x in args]
    except ValueError:
        raise ValueError(f"expected {what}, got {'/'.join(args)!r}") from None


def _self_draft(model, args: tuple[str, ...], threshold: float | None) -> SelfDraftProposer:
    heads = load_heads(model)
    body = args[0] if args else ""
    if body in ("dynamic", "entropy"):
        stop = EntropyStop(threshold or DEFAULT_ENTROPY) if body == "entropy" else ConfidenceStop(
            DEFAULT_CONFIDENCE if threshold is None else threshold)
        candidates = [e for e in heads.layers if e >= model.num_layers // 3]
        costs = self_draft_costs(model, heads, DEFAULT_SHORTLIST, verify_cost(model))
        costs = {e: c for e, c in costs.items() if e in candidates}
        controller = ExitLayerController(costs, DEFAULT_DYNAMIC_MAX, priors=measured_agreement(heads))
        return SelfDraftProposer(heads, stop=stop, controller=controller, shortlist=DEFAULT_SHORTLIST)
    if threshold is not None:
        raise ValueError("a fixed self-draft takes no @threshold (use self-spec:dynamic@C)")
    values = _ints(args, "EXIT_LAYER[/DRAFT_LENGTH]")
    layer = values[0] if values else default_exit_layer(model, heads)
    length = values[1] if len(values) > 1 else DEFAULT_SELF_DRAFT
    return SelfDraftProposer(heads, layer, length, shortlist=DEFAULT_SHORTLIST)


def measured_agreement(heads) -> dict[int, float]:
    """Per exit layer, the share of calibration tokens whose top-1 matched the final layer, as
    recorded with trained heads ({} for lens heads or heads without that record)."""
    record = heads.metadata.get("calib_agreement", {}).get(heads.kind, {})
    return {int(e): float(a) for e, a in record.items()}


def default_exit_layer(model, heads) -> int:
    """The exit layer with the best expected tokens per unit of work for a draft of
    DEFAULT_SELF_DRAFT tokens, by the heads' measured agreement; else the one nearest 3/4 depth."""
    agreement = measured_agreement(heads)
    costs = self_draft_costs(model, heads, DEFAULT_SHORTLIST, verify_cost(model))
    scored = [e for e in heads.layers if e in agreement]
    if not scored:
        return min(heads.layers, key=lambda e: abs(e - 0.75 * model.num_layers))
    return max(scored, key=lambda e: expected_tokens([agreement[e]] * DEFAULT_SELF_DRAFT, DEFAULT_SELF_DRAFT)
               / (1 + DEFAULT_SELF_DRAFT * costs[e]))


def lookup(name, model) -> LookupProposer:
    """lookup[:K]: n-gram lookup, at most K tokens per draft (default 10)."""
    return LookupProposer(*_ints(name.args, "MAX_DRAFT"), verify_cost=verify_cost(model))


def self_spec(name, model) -> SelfDraftProposer:
    """self-spec[:E[/K]]: self-draft from exit layer E, K tokens (defaults: see DEFAULT_*);
    self-spec:dynamic[@C]: DEL-style choice of exit layer and length, confidence stop at C;
    self-spec:entropy[@H]: the same with an entropy stop at H nats (SVIP)."""
    return _self_draft(model, name.args, name.threshold)


def lookup_then_self(name, model) -> LookupThenSelf:
    """lookup+self[:E[/K]]: lookup where the context matches, self-draft otherwise."""
    return LookupThenSelf(LookupProposer(verify_cost=verify_cost(model)), _self_draft(model, name.args, None))


def draft_model(name, model) -> DraftModelProposer:
    """draft-model:ALIAS[/K][/tree]: a smaller model of the same tokenizer drafts K tokens (/tree:
    with its runner-up token beside each, as one token tree)."""
    alias = name.arg(0)
    if not alias:
        raise ValueError("draft-model needs a model: draft-model:ALIAS[/K][/tree]")
    draft = load(alias, dtype=str(model.dtype).removeprefix("torch."), device=str(model.device),
                 progress=lambda m: None, quant=model.quant)  # the target's weight format and kernels
    return DraftModelProposer(draft, model, *_ints(name.args[1:], "DRAFT_LENGTH"), tree="tree" in name.options)


def retrieval(name, model) -> RetrievalProposer:
    """retrieval:STORE[/K][/tree]: the datastore STORE (`dyncomplete index`) or the context's
    lookup, one chain of at most K tokens (/tree: both as one token tree)."""
    if not name.arg(0):
        raise ValueError("retrieval needs a datastore: retrieval:STORE[/K] (build one with `dyncomplete index`)")
    store = Datastore.for_model(model, name.arg(0))
    return RetrievalProposer(store, *_ints(name.args[1:], "MAX_DRAFT"), verify_cost=verify_cost(model),
                             tree="tree" in name.options)


def stand(name, model) -> StandProposer:
    """stand[:K][/tree]: the likeliest continuations by n-gram counts (STAND), a chain of at most K
    tokens (/tree: a token tree of at most K)."""
    return StandProposer(*_ints(name.args, "MAX_DRAFT"), verify_cost=verify_cost(model), tree="tree" in name.options)


# Every drafter family: name -> the builder of its proposer from the parsed name and the target
# model. A new drafter is its module (a `Proposer` and its builder) plus one line here, and its
# family's grammar in `registry.FAMILIES` (module "dyncomplete.methods.speculative").
PROPOSERS: dict[str, Callable[[MethodName, LayeredModel], Proposer]] = {
    "lookup": lookup,
    "self-spec": self_spec,
    "lookup+self": lookup_then_self,
    "draft-model": draft_model,
    "retrieval": retrieval,
    "stand": stand,
}


def build(name: MethodName, model: LayeredModel) -> SpeculativeDecoding:
    if name.family not in PROPOSERS:
        raise ValueError(f"{name.family!r} is not a drafter family: speculative.PROPOSERS has {', '.join(PROPOSERS)}")
    return SpeculativeDecoding(PROPOSERS[name.family](name, model))
