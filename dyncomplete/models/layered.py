"""`LayeredModel`: one per-layer view over Hugging Face decoder models.

Everything in dyncomplete runs a model one decoder layer at a time: early exit stops between
layers, self-speculation drafts with the first layers and verifies with the rest. This class
hides the differences between architectures (how positions enter, which norm is final, whether
some layers use a sliding window, logit soft-capping) behind five calls:
`embed`, `run_layer` (`run_layers` for several in a row), `final_norm`, `head`, and `forward` (all
layers at once).

An engine (`step.Engine`) computes them. `hf` (`hf.HFEngine`) calls the Hugging Face modules
(every architecture; the only one that trains: LoRA adapters and gradients need the modules).
`fast` (llama and qwen2, the default for them) runs `fast.FastEngine`: fused weights, plain
tensor functions, optional int8/int4 weights. While the model is in training mode, or once its
modules were wrapped (peft), the `hf` engine runs, so training code sees its adapters.
"""

from __future__ import annotations

import torch

from . import fast
from .attention import SHORT_QUERY, use_short_query_attention
from .decoder import decoder_of
from .hf import HFEngine
from .invariant import make_batch_invariant
from .kv_cache import KVCache
from .step import Engine, StepContext

ENGINES = ("auto", "fast", "hf")


class LayeredModel:
    def __init__(self, hf_model, tokenizer=None, name: str = "model", source_sha256: str | None = None,
                 engine: str = "auto", quant: str = "none", packed: dict[str, torch.Tensor] | None = None):
        """`packed`: the fast engine's int4 blocks, already made (a snapshot's: `packed.py`)."""
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.source_sha256 = source_sha256
        self.config = hf_model.config
        decoder = decoder_of(hf_model)
        self.kind, self.core, self.layers, self.lm_head = decoder.kind, decoder.core, decoder.layers, decoder.lm_head
        self.num_layers = len(self.layers)
        self.layer_types, self.sliding_window, self.softcap = decoder.layer_types, decoder.sliding_window, decoder.softcap
        self.hidden_size = self.config.hidden_size
        self.vocab_size = self.lm_head.out_features
        self.head_tap = None  # called with every input of `head` (the stop rule reads those rows)
        if self.kind in ("llama", "qwen2", "gemma3"):
            use_short_query_attention(hf_model)
        if self.device.type == "cpu" and self.dtype != torch.float32:
            make_batch_invariant(self.layers)
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}: use {', '.join(ENGINES)}")
        if engine == "auto":
            engine = "fast" if fast.supports(decoder) else "hf"
        if quant == "auto":
            quant = fast.default_quant(engine, self.device, self.dtype)
        if quant != "none" and engine != "fast":
            raise ValueError(f"quantized weights (--quant {quant}) need the fast engine: llama or qwen2, not "
                             f"{self.config.model_type}")
        self.engine = engine  # the chosen engine's name
        self.quant = quant
        self.engines: dict[str, Engine] = {}
        if engine == "fast":
            self.engines["fast"] = fast.FastEngine(decoder, quant, packed)
        # on the fast engine's rotary tables where it has them: both engines see the same values
        self.engines["hf"] = HFEngine(decoder, self.engines["fast"].rotary if engine == "fast" else None)

    def set_engine(self, engine: str) -> None:
        """Switch between `fast` and `hf` on the same weights (a quantized model's modules hold
        the dequantized weights, so `hf` is then a reference for, not a copy of, its products)."""
        if engine not in self.engines:
            raise ValueError(f"engine {engine!r} is not available for this model")
        self.engine = engine

    def _engine(self) -> Engine:
        """The engine that runs now: the chosen one, but `hf` while training or where the chosen
        one cannot run the modules as they are (peft wrapped them)."""
        engine = self.engines[self.engine]
        return engine if not self.hf.training and engine.ready() else self.engines["hf"]

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, in the format the chosen engine reads."""
        return self.engines[self.engine].weight_bytes_per_token()

    # -- the five calls -------------------------------------------------------------------------

    def context(self, positions: torch.Tensor, tree_parents: list[int] | None = None) -> StepContext:
        """Shared inputs for one step whose tokens sit at `positions` (a 1-D or (1, q) tensor);
        `tree_parents` for a token tree (see StepContext), whose first row sits at positions[0]
        and takes the next cache slot."""
        positions = positions.reshape(1, -1).to(self.device)
        ctx = StepContext(positions)
        if tree_parents is not None:
            ctx.tree_parents, ctx.tree_start = list(tree_parents), int(positions[0, 0])
        ctx.state_of(self._engine())  # the engine's own inputs, prepared now
        return ctx

    def embed(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self._engine().embed(input_ids.reshape(1, -1).to(self.device), ctx)

    def run_layer(self, i: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor:
        """Run decoder layer i on the step's tokens, appending their keys/values to `cache`."""
        return self._engine().run_layer(i, hidden, ctx, cache)

    def run_layers(self, first: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None,
                   end: int | None = None) -> torch.Tensor:
        """`run_layer` for layers first..end-1 (default: to the last); the fast engine's native
        kernels run them in one call where they can, with the same results."""
        return self._engine().run_layers(range(first, self.num_layers if end is None else end), hidden, ctx, cache)

    def project_kv(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache) -> None:
        """Keys and values of `layers` for the step's positions computed from `hidden` alone (input
        norm, key/value projections, rotary embedding) and appended to `cache`: what early exit's
        propagation (CALM, GREEN-CODE) writes for the layers a token skipped. llama/qwen2 layouts."""
        self._engine().project_kv(layers, hidden, ctx, cache)

    def run_exit(self, hidden: torch.Tensor, resume: list[int], ctx: StepContext, cache: KVCache, exits,
                 propagate: bool) -> tuple[int, torch.Tensor] | None:
        """One early-exit step with the decisions inside the native layer loop (`exits`: a
        `native.bindings.Exits`): hidden (1, q, d) at the step's positions, row r still lacking
        layers resume[r].. (the last row, the new token, all of them). Returns the exit layer and
        each row's state after the last layer it ran, the cache holding what those layers wrote
        (`propagate`: keys and values of the skipped layers projected from the exit state); None
        where the running engine cannot (then nothing ran)."""
        return self._engine().run_exit(hidden, resume, ctx, cache, exits, propagate)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._engine().final_norm(hidden)

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        if self.head_tap is not None:
            self.head_tap(normed)
        return self._engine().head(normed)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of hidden states after the last layer: `head(final_norm(hidden))`, the
        fast engine's in one native call (the same values)."""
        if self.head_tap is not None:
            return self.head(self.final_norm(hidden)).float()
        return self._engine().logits(hidden)

    def batchable(self, cache: KVCache | None, start: int, q_len: int) -> bool:
        """Whether `forward_batch` takes q_len new tokens at `start` after `cache`'s contents."""
        return self._engine().batchable(cache, start, q_len)

    @torch.inference_mode()
    def forward_batch(self, steps: list[tuple[list[int], KVCache, int, int]]) -> list[torch.Tensor | None]:
        """`forward` for several sequences at once (continuous batching): each step is (new token
        ids, its cache, their first position, how many of its last positions want logits), each
        `batchable`. Returns each step's logits (those positions, vocab) (None where unwanted), the
        bits `forward` gives it alone."""
        engine = self._engine()
        if self.head_tap is None:
            logits = engine.forward_chains(steps)
            if logits is not None:
                return logits
        runs = []
        for ids, cache, start, _ in steps:
            ctx = self.context(torch.arange(start, start + len(ids)))
            runs.append((self.embed(torch.tensor(ids), ctx), ctx, cache))
        outs = engine.run_batch(runs)
        wanted = torch.cat([out[0, len(out[0]) - step[3]:] for out, step in zip(outs, steps)])
        heads = [self.logits(wanted[None, a : a + SHORT_QUERY])[0]  # the quantized kernel's rows
                 for a in range(0, len(wanted), SHORT_QUERY)]
        rows = torch.cat(heads) if heads else wanted
        logits, at = [], 0
        for _, _, _, count in steps:
            logits.append(rows[at : at + count] if count else None)
            at += count
        return logits

    def score_chain(self, ids: list[int], cache: KVCache, start: int, rates: list[float] | None = None) -> torch.Tensor:
        """Float32 logits (len(ids), vocab) of a verification pass over a chain of token ids at
        `start`. `rates` (each drafted token's estimated acceptance) weigh positions only in a
        batched model's shared verify budget (serve/batching.py), which may score fewer rows."""
        return self.forward(torch.tensor(ids), cache, start=start, last_only=False)[0]

    @torch.inference_mode()
    def fill(self, ids: list[int], cache: KVCache) -> None:
        """All layers over new tokens that follow the cache's contents, for their keys and values
        only: a prompt's part whose logits nobody reads (no head)."""
        ctx = self.context(torch.arange(cache.lengths[0], cache.lengths[0] + len(ids)))
        self.run_layers(0, self.embed(torch.tensor(ids).reshape(1, -1), ctx), ctx, cache)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: KVCache | None = None, start: int | None = None, last_only: bool = True
    ) -> torch.Tensor:
        """All layers over new tokens that follow the cache's contents; returns float32 logits."""
        if self.head_tap is None:
            logits = self._engine().forward_chain(input_ids, cache, start, last_only)
            if logits is not None:
                return logits
        ids = input_ids.reshape(1, -1)
        start = cache.lengths[0] if (start is None and cache is not None) else (start or 0)
        ctx = self.context(torch.arange(start, start + ids.shape[1]))
        hidden = self.run_layers(0, self.embed(ids, ctx), ctx, cache)
        if last_only:
            hidden = hidden[:, -1:]
        return self.logits(hidden)
