"""What every decoding method shares: parameters, stats, the emitter and its editor guards,
sampling, the method base with its prefill, token healing and the prompt builder."""

from ..models.end_tokens import eos_ids_of
from .emitter import Emitter
from .guards import EditorGuards
from .method import DecodingMethod, prefill
from .params import MAX_NEW_TOKENS_LIMIT, GenerationParams
from .prompts import DEFAULT_CONTEXT_BUDGET, Prompt, build_prompt
from .stats import Completion, Stats

__all__ = ["Completion", "DecodingMethod", "DEFAULT_CONTEXT_BUDGET", "EditorGuards", "Emitter", "GenerationParams",
           "MAX_NEW_TOKENS_LIMIT", "Prompt", "Stats", "build_prompt", "eos_ids_of", "prefill"]
