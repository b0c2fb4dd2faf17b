"""Method registry: a benchmark or server method name -> a `DecodingMethod`.

Names are `FAMILY[:ARG][@THRESHOLD]`, e.g. `baseline`, `lookup`, `early-exit:confidence@0.9`,
`draft-model:qwen2.5-coder-0.5b`. A family registers a factory that receives the rest of the name
and the loaded model; adding a method is one `register(...)` call in the module that implements it.
"""

from __future__ import annotations

import importlib
from typing import Callable

from .decoding import Baseline, DecodingMethod

Factory = Callable[[str, object], DecodingMethod]  # (argument after "FAMILY:", model) -> method

_FACTORIES: dict[str, Factory] = {}
_WRAPPERS: dict[str, Callable] = {}

# Modules that register method families when imported (kept lazy: they may pull in heavy code).
PLUGIN_MODULES: list[str] = ["dyncomplete.decoding.hf_generate", "dyncomplete.decoding.early_exit",
                              "dyncomplete.exits.stop_rule", "dyncomplete.decoding.speculative"]


def register(family: str, factory: Factory) -> None:
    _FACTORIES[family] = factory


def _load_plugins() -> None:
    for module in PLUGIN_MODULES:
        importlib.import_module(module)


def families() -> list[str]:
    _load_plugins()
    return sorted(_FACTORIES)


def register_wrapper(family: str, factory: Callable[[str, object, DecodingMethod], DecodingMethod]) -> None:
    """A family written `METHOD+FAMILY:ARG` that wraps any method (e.g. the `+stop:T` rule)."""
    _WRAPPERS[family] = factory


def make_method(name: str, model) -> DecodingMethod:
    """Build the method called `name` for `model`; ValueError with the known families otherwise."""
    _load_plugins()
    inner, plus, wrapper = name.rpartition("+")
    # a family may have "+" in its name (lookup+self): a wrapper only if "+X" names one or nothing else fits
    if plus and (wrapper.partition(":")[0] in _WRAPPERS or name.partition(":")[0] not in _FACTORIES):
        family, _, arg = wrapper.partition(":")
        if family not in _WRAPPERS:
            raise ValueError(f"unknown wrapper {family!r} in {name!r}: known are {', '.join(sorted(_WRAPPERS))}")
        method = _WRAPPERS[family](arg, model, make_method(inner, model))
        method.name = name
        return method
    family, _, arg = name.partition(":")
    if family not in _FACTORIES:
        raise ValueError(f"unknown method {name!r}: known families are {', '.join(sorted(_FACTORIES))}")
    method = _FACTORIES[family](arg, model)
    method.name = name
    return method


def _baseline(arg: str, model) -> DecodingMethod:
    if arg:
        raise ValueError(f"baseline takes no argument, got {arg!r}")
    return Baseline()


register("baseline", _baseline)
