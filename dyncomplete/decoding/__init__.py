"""Decode loops, proposers, verification and stop rules."""

from .api import Completion, Emitter, GenerationParams, Stats
from .baseline import Baseline, DecodingMethod, prefill

__all__ = ["Baseline", "Completion", "DecodingMethod", "Emitter", "GenerationParams", "Stats", "prefill"]
