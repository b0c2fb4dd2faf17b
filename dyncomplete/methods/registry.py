"""The method registry and the one parser of method names.

A name is `FAMILY[:ARG[/ARG...]][/OPTION[=VALUE]...][@THRESHOLD][+WRAPPER[:ARG]]`, for example
`baseline`, `lookup:8`, `self-spec:24/3`, `self-spec:dynamic@0.7`,
`early-exit:confidence/kv=propagate@0.9`, `draft-model:qwen2.5-coder-0.5b/4`,
`lookup+stop:0.8`. `parse_method` checks a name against the family's declared form without
building anything (the server refuses a bad name with it before a request is queued);
`make_method` then imports the family's module and calls its `build(name, model)`.

Adding a method is one module with `build(name: MethodName, model)` plus one line in `FAMILIES`.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    name: str
    module: str  # defines build(name: MethodName, model) -> DecodingMethod
    args: tuple[str, ...] = ()  # names of the optional positional parts after "FAMILY:", "/" between
    options: dict[str, str] = field(default_factory=dict)  # option -> "flag" | "value" | "path"
    threshold: bool = False  # whether "@T" is allowed
    wrapper: bool = False  # written after another method: METHOD+FAMILY[:ARG]
    wrappable: bool = True  # decodes through DecodingMethod.generate, so a wrapper can wrap it


_EARLY_EXIT_OPTIONS = {"lens": "flag", "heads": "path", "kv": "value", "min": "value", "at": "value",
                       "short": "value", "emit": "value", "line": "value", "prompt": "value"}

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("baseline", "dyncomplete.methods.baseline"),
    Family("early-exit", "dyncomplete.methods.early_exit", ("POLICY",), _EARLY_EXIT_OPTIONS, threshold=True),
    Family("lookup", "dyncomplete.methods.speculative", ("MAX_DRAFT",)),
    Family("self-spec", "dyncomplete.methods.speculative", ("EXIT_LAYER|dynamic|entropy", "DRAFT_LENGTH"),
           threshold=True),
    Family("lookup+self", "dyncomplete.methods.speculative", ("EXIT_LAYER", "DRAFT_LENGTH")),
    Family("draft-model", "dyncomplete.methods.speculative", ("ALIAS", "DRAFT_LENGTH"), {"tree": "flag"}),
    Family("retrieval", "dyncomplete.methods.speculative", ("STORE", "MAX_DRAFT"), {"tree": "flag"}),
    Family("stand", "dyncomplete.methods.speculative", ("MAX_DRAFT",), {"tree": "flag"}),
    Family("hf-generate", "dyncomplete.methods.hf_generate", ("prompt-lookup|assisted:ALIAS",), wrappable=False),
    Family("llama-cpp", "dyncomplete.methods.llama_cpp", ("prompt-lookup",), wrappable=False),
    Family("stop", "dyncomplete.methods.stop_rule", ("T",), wrapper=True, wrappable=False),
]}

_THRESHOLD = re.compile(r"@([-+0-9.eE]+)")


@dataclass(frozen=True)
class MethodName:
    text: str  # the whole name, as given
    family: str
    args: tuple[str, ...] = ()
    options: dict[str, str] = field(default_factory=dict)
    threshold: float | None = None
    inner: "MethodName | None" = None  # the wrapped method, for a wrapper family

    def arg(self, i: int, default: str = "") -> str:
        return self.args[i] if i < len(self.args) else default


def families() -> list[str]:
    return sorted(FAMILIES)


def family_list() -> str:
    """The families for messages and help texts: "baseline, ...; wrappers +stop"."""
    plain = ", ".join(f for f in families() if not FAMILIES[f].wrapper)
    wrappers = ", ".join(f"+{f}" for f in families() if FAMILIES[f].wrapper)
    return f"{plain}; wrappers {wrappers}"


def parse_method(text: str) -> MethodName:
    """Check `text` against the grammar and its family's form; ValueError says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty method name")
    inner, plus, last = text.rpartition("+")
    if plus and last.partition(":")[0] in FAMILIES and FAMILIES[last.partition(":")[0]].wrapper:
        return _parse_one(last, text, parse_method(inner))
    return _parse_one(text, text, None)


def _parse_one(part: str, text: str, inner: MethodName | None) -> MethodName:
    name, rest = re.match(r"([^:@]*)(.*)", part).groups()
    body = rest[1:] if rest.startswith(":") else rest
    family = FAMILIES.get(name)
    if family is None or family.wrapper != (inner is not None):
        raise ValueError(f"unknown method {text!r}: known families are {family_list()}")
    if inner is not None and not FAMILIES[inner.family].wrappable:
        why = "one wrapper per method" if FAMILIES[inner.family].wrapper else \
            f"{inner.family} does not decode through dyncomplete's loop"
        raise ValueError(f"+{name} cannot wrap {inner.text}: {why}")
    threshold = None
    found = _THRESHOLD.search(body)
    if found:
        if not family.threshold:
            raise ValueError(f"{name} takes no @threshold, got {text!r}")
        try:
            threshold = float(found.group(1))
        except ValueError:
            raise ValueError(f"bad threshold {found.group(1)!r} in {text!r}") from None
        body = body[: found.start()] + body[found.end():]
    args, options, last = [], {}, None
    for piece in body.split("/") if body else []:
        key, sep, value = piece.partition("=")
        kind = family.options.get(key)
        if kind is not None and (sep or kind == "flag"):
            if (kind == "flag") == bool(sep):
                raise ValueError(f"option {key} of {name} {'takes no' if kind == 'flag' else 'needs a'} value in {text!r}")
            options[key], last = value, key
        elif last is not None and family.options[last] == "path":  # a path's own slashes
            options[last] += "/" + piece
        elif not options and len(args) < len(family.args) and piece:
            args.append(piece)
        else:
            raise ValueError(f"bad {name} method {text!r}: {usage(family)}")
    return MethodName(text, name, tuple(args), options, threshold, inner)


def usage(family: Family) -> str:
    if not (family.args or family.options or family.threshold):
        return f"{family.name} takes no argument"
    form = family.name + (f"[:{'[/'.join(family.args)}{']' * len(family.args)}" if family.args else "")
    form += "".join(f"[/{k}{'' if kind == 'flag' else '=' + kind.upper()}]" for k, kind in family.options.items())
    return "use " + form + ("[@T]" if family.threshold else "")


def make_method(name: str | MethodName, model):
    """Build the method called `name` for `model` (ValueError for a bad name)."""
    parsed = parse_method(name) if isinstance(name, str) else name
    module = importlib.import_module(FAMILIES[parsed.family].module)
    method = module.build(parsed, model)
    method.name = parsed.text
    return method
