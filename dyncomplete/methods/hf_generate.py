"""Hugging Face `generate` as a benchmark method: the reference every user knows.

Names: `hf-generate` (plain greedy or sampled decoding), `hf-generate:prompt-lookup` (prompt
lookup decoding, `prompt_lookup_num_tokens=10`) and `hf-generate:assisted:ALIAS` (assisted
generation with the registered model ALIAS as the draft model).

A stopping criterion, which `generate` calls after every step, hands the new tokens to our
`Emitter`: its completions stop by exactly the same rules as ours (and `generate` stops at once,
without the extra step a streamer would see), so predictions compare token for token. Timing:
prefill is the time until the first step's tokens exist (for the assisted variants this includes
verifying the first draft), decode the rest. Work is counted by a hook on the model's forward
(tokens each call feeds through all layers). In the assisted variants every step counts as one
verification step, also one whose draft was empty.
"""

from __future__ import annotations

import time

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from ..energy.work import full_pass_macs
from ..engine import Completion, DecodingMethod, Emitter, Stats, eos_ids_of, healing
from ..models import load

PROMPT_LOOKUP_TOKENS = 10


class _FeedEmitter(StoppingCriteria):
    """Called by `generate` after every step with the whole sequence: hands the new tokens to the
    Emitter (whose stop rules then end `generate` at once) and pairs the step with the tokens the
    model's forward saw (drafted = tokens fed beyond the one already decided)."""

    def __init__(self, emitter: Emitter, prompt_len: int, num_layers: int, counting_drafts: bool):
        self.emitter = emitter
        self.seen = prompt_len
        self.num_layers = num_layers
        self.counting_drafts = counting_drafts
        self.first_token_at: float | None = None
        self.fed: list[int] = []  # tokens per model forward call, appended by the hook

    def __call__(self, input_ids, scores, **kwargs):
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        tokens = input_ids[0, self.seen :].tolist()
        if self.counting_drafts and self.fed:
            already = self.seen if len(self.fed) == 1 else 1  # prompt (first call) or the last token
            self.emitter.stats.record_draft(self.fed[-1] - already, len(tokens) - 1)
        self.seen = input_ids.shape[1]
        for t in tokens:
            if self.emitter.emit(t, self.num_layers, "full"):
                break
        return torch.full((input_ids.shape[0],), self.emitter.done, dtype=torch.bool, device=input_ids.device)


class _HealFirstToken(LogitsProcessor):
    """Token healing inside `generate`: constrain the scores of the first new position only
    (the assisted variants call processors once per verified position, with that position's ids)."""

    def __init__(self, heal: healing.Healing, prompt_len: int):
        self.heal, self.prompt_len = heal, prompt_len

    def __call__(self, input_ids, scores):
        return self.heal.constrain(scores) if input_ids.shape[1] == self.prompt_len else scores


class HFGenerate(DecodingMethod):
    name = "hf-generate"

    def __init__(self, mode: str = "", assistant=None):
        self.mode = mode  # "", "prompt-lookup" or "assisted"
        self.assistant = assistant  # a LayeredModel when assisted

    def generate(self, model, prompt_ids, params, cache=None, on_text=None, cancelled=None) -> Completion:
        if not prompt_ids:
            raise ValueError("empty prompt: nothing to complete")
        prompt_ids, heal = healing.heal_prompt(model.tokenizer, prompt_ids, params.token_healing)
        stats = Stats(model=model.name, method=self.name, prompt_tokens=len(prompt_ids))
        emitter = Emitter(model.tokenizer, params, eos_ids_of(model), stats, on_text, cancelled,
                          healed=heal.tail_text if heal else "")
        feed = _FeedEmitter(emitter, len(prompt_ids), model.num_layers, counting_drafts=bool(self.mode))
        hooks = [model.hf.register_forward_pre_hook(self._counter(feed.fed), with_kwargs=True)]
        assistant_fed: list[int] = []
        if self.assistant is not None:
            hooks.append(self.assistant.hf.register_forward_pre_hook(self._counter(assistant_fed), with_kwargs=True))
        ids = torch.tensor([prompt_ids], device=model.device)
        kwargs = dict(
            attention_mask=torch.ones_like(ids), max_new_tokens=params.max_new_tokens, min_new_tokens=0,
            stopping_criteria=StoppingCriteriaList([feed]),
            pad_token_id=next(iter(eos_ids_of(model)), None),
        )
        if heal is not None:
            kwargs["logits_processor"] = LogitsProcessorList([_HealFirstToken(heal, len(prompt_ids))])
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if self.mode == "prompt-lookup":
            kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
        elif self.mode == "assisted":
            kwargs["assistant_model"] = self.assistant.hf
        start = time.perf_counter()
        try:
            # generate draws from the global random stream: seed a fork of it, not the caller's
            with torch.inference_mode(), torch.random.fork_rng(devices=[model.device] if model.device.type != "cpu" else []):
                if params.temperature > 0:
                    torch.manual_seed(params.seed if params.seed is not None else time.time_ns() % (2**31))
                model.hf.generate(ids, **kwargs)
        finally:
            for h in hooks:
                h.remove()
        end = time.perf_counter()
        if not emitter.done:
            emitter.finish("max_tokens")
        first = feed.first_token_at or end
        stats.prefill_s, stats.decode_s = first - start, end - first
        # beyond the prompt; +1: the prefill's last position decided the first token (as in baseline)
        decode_tokens = sum(feed.fed) - len(prompt_ids) + 1
        stats.count_full_steps(decode_tokens, model.num_layers)
        if self.assistant is not None:
            stats.extra_macs = sum(assistant_fed) * full_pass_macs(self.assistant)
        return Completion(emitter.text, emitter.ids, stats, emitter.healed)

    @staticmethod
    def _counter(sink: list[int]):
        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                sink.append(int(ids.shape[-1]))

        return hook


def build(name, model) -> HFGenerate:
    arg = name.arg(0)
    if arg == "":
        return HFGenerate()
    if arg == "prompt-lookup":
        return HFGenerate("prompt-lookup")
    kind, _, alias = arg.partition(":")
    if kind == "assisted" and alias:
        assistant = load(alias, dtype=str(model.dtype).removeprefix("torch."), device=str(model.device),
                         progress=lambda m: None)
        return HFGenerate("assisted", assistant)
    raise ValueError(f"unknown hf-generate variant {arg!r}: use hf-generate, hf-generate:prompt-lookup "
                     "or hf-generate:assisted:ALIAS")
