"""Decoding methods: baseline, early exit, speculative decoding (proposers, verifier, draft
control), Hugging Face references and the stop-rule wrapper, behind one registry."""

from .registry import FAMILIES, MethodName, families, make_method, parse_method

__all__ = ["FAMILIES", "MethodName", "families", "make_method", "parse_method"]
