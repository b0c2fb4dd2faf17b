"""One grammar for method names (`methods.parse_method`), used by the registry, the server's input
check and the benchmark's option check. No model needed."""

import pytest

from dyncomplete.commands.bench import method_list
from dyncomplete.methods import FAMILIES, parse_method
from dyncomplete.serve.request import ApiError, parse_completion


@pytest.mark.parametrize("name, family, args, options, threshold", [
    ("baseline", "baseline", (), {}, None),
    ("lookup:8", "lookup", ("8",), {}, None),
    ("lookup+self", "lookup+self", (), {}, None),
    ("self-spec:24/3", "self-spec", ("24", "3"), {}, None),
    ("self-spec:dynamic@0.7", "self-spec", ("dynamic",), {}, 0.7),
    ("early-exit:confidence@0.9/lens/kv=propagate", "early-exit", ("confidence",), {"lens": "", "kv": "propagate"}, 0.9),
    ("early-exit:confidence/lens@0.9", "early-exit", ("confidence",), {"lens": ""}, 0.9),
    ("early-exit:margin@0.5/min=24", "early-exit", ("margin",), {"min": "24"}, 0.5),
    ("early-exit:classifier/at=18.22@0.9", "early-exit", ("classifier",), {"at": "18.22"}, 0.9),
    ("early-exit:margin/heads=runs/q/h.safetensors/kv=propagate@0.5", "early-exit", ("margin",),
     {"heads": "runs/q/h.safetensors", "kv": "propagate"}, 0.5),
    ("hf-generate:assisted:qwen2.5-coder-0.5b", "hf-generate", ("assisted:qwen2.5-coder-0.5b",), {}, None),
    ("draft-model:qwen2.5-coder-0.5b/4", "draft-model", ("qwen2.5-coder-0.5b", "4"), {}, None),
    ("draft-model:qwen2.5-coder-0.5b/4/tree", "draft-model", ("qwen2.5-coder-0.5b", "4"), {"tree": ""}, None),
    ("stand:10/tree", "stand", ("10",), {"tree": ""}, None),
])
def test_names_parse(name, family, args, options, threshold):
    parsed = parse_method(name)
    assert (parsed.family, parsed.args, parsed.options, parsed.threshold) == (family, args, options, threshold)
    assert parsed.text == name and parsed.inner is None


def test_wrappers_nest_around_any_method():
    parsed = parse_method("lookup+self:24/3+stop:0.5")
    assert (parsed.family, parsed.args) == ("stop", ("0.5",))
    assert (parsed.inner.family, parsed.inner.args) == ("lookup+self", ("24", "3"))


@pytest.mark.parametrize("bad, says", [
    ("", "empty"), ("nonsense", "unknown method"), ("stop:0.5", "unknown method"),
    ("baseline+nonsense:1", "unknown method"), ("baseline:1", "takes no argument"), ("lookup@0.5", "no @threshold"),
    ("lookup:4/2", "use lookup"), ("self-spec:1/2/3", "use self-spec"), ("early-exit:confidence/bogus@0.9", "use early-exit"),
    ("early-exit:confidence/lens=1@0.9", "takes no value"), ("early-exit:confidence/kv@0.9", "use early-exit"),
    ("early-exit:x@1e", "bad threshold"),
])
def test_bad_names_say_what_is_wrong(bad, says):
    with pytest.raises(ValueError, match=says):
        parse_method(bad)


@pytest.mark.parametrize("name", ["hf-generate+stop:0.5", "hf-generate:prompt-lookup+stop:0.5", "llama-cpp+stop:0.5",
                                  "baseline+stop:0.5+stop:0.9"])
def test_a_wrapper_over_a_method_it_cannot_wrap_is_refused_by_the_parser(name):
    """hf-generate and llama-cpp decode in their own loops (no guard, no LM-head rows), so `+stop`
    is refused where every name is checked (the server: a 400 before queueing), not when built."""
    with pytest.raises(ValueError, match="cannot wrap"):
        parse_method(name)


def test_every_family_names_an_importable_module():
    import importlib

    for family in FAMILIES.values():
        assert hasattr(importlib.import_module(family.module), "build"), family.name


def test_the_server_refuses_a_bad_method_before_queueing():
    body = {"model": "m", "prompt": "x = ", "method": "early-exit:confidence/bogus@0.9"}
    with pytest.raises(ApiError) as refused:
        parse_completion(body, "m", ["baseline"], 64)
    assert refused.value.status == 400 and refused.value.param == "method" and "use early-exit" in refused.value.message
    ok = parse_completion({**body, "method": "lookup+stop:0.8"}, "m", ["baseline", "lookup+stop:0.8"], 64)
    assert ok.method == "lookup+stop:0.8"


def test_the_benchmark_refuses_a_bad_method_before_loading():
    assert method_list("lookup", ["early-exit:confidence@0.5,0.9"])[0] == [
        "baseline", "lookup", "early-exit:confidence@0.5", "early-exit:confidence@0.9"]
    with pytest.raises(ValueError, match="unknown method"):
        method_list("lookup,nonsense", [])
