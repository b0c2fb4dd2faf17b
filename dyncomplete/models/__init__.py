"""Model registry, loading and the per-layer view."""

from .kv_cache import KVCache
from .layered import LayeredModel
from .loading import load, registered_gguf, resolve_dtype
from .registry import DEFAULT_MODEL, REGISTRY, ModelError

__all__ = ["KVCache", "LayeredModel", "load", "registered_gguf", "resolve_dtype", "DEFAULT_MODEL", "REGISTRY", "ModelError"]
