"""Every wrapper over every method family (issue 15, item 11): a wrapper runs the wrapped method's
prompt work (`prepare`) and decoding, or the name is refused by the parser with a clear error;
nothing fails inside a request."""

import pytest

from dyncomplete.engine import GenerationParams
from dyncomplete.methods import FAMILIES, make_method, parse_method
from dyncomplete.methods.datastore import Datastore

# One buildable name per family, cheap on SmolLM2. A new family needs a line here.
EXAMPLES = {
    "baseline": "baseline",
    "early-exit": "early-exit:confidence@0.9",
    "lookup": "lookup:4",
    "self-spec": "self-spec",
    "lookup+self": "lookup+self",
    "draft-model": "draft-model:smollm2-135m/2",  # drafts with the model itself (load patched below)
    "retrieval": "retrieval:test/4",  # a store of a few lines (opening patched below)
    "stand": "stand:4/tree",
    "hf-generate": "hf-generate",
    "llama-cpp": "llama-cpp",
}
# Each wrapper at a setting that never changes the wrapped method's tokens (P(wrong) > 1 never holds).
WRAPPERS = {"stop": "stop:1.0"}

PLAIN = sorted(f for f, family in FAMILIES.items() if not family.wrapper)
WRAPPER_FAMILIES = sorted(f for f, family in FAMILIES.items() if family.wrapper)


def test_every_family_and_wrapper_has_an_example():
    assert sorted(EXAMPLES) == PLAIN and sorted(WRAPPERS) == WRAPPER_FAMILIES
    assert all(parse_method(name).family == family for family, name in EXAMPLES.items())


@pytest.mark.model
@pytest.mark.parametrize("wrapper", WRAPPER_FAMILIES)
@pytest.mark.parametrize("family", PLAIN)
def test_every_wrapper_over_every_family(smollm, monkeypatch, wrapper, family):
    name = f"{EXAMPLES[family]}+{WRAPPERS[wrapper]}"
    if not FAMILIES[family].wrappable:
        with pytest.raises(ValueError, match=f"cannot wrap {EXAMPLES[family]}"):
            parse_method(name)
        return
    monkeypatch.setattr("dyncomplete.methods.speculative.load", lambda *args, **kwargs: smollm)
    text = "def area(r):\n    return 3.14 * r * r\n" * 3
    store = Datastore.build([smollm.tokenizer(text, add_special_tokens=False).input_ids], len(smollm.tokenizer))
    monkeypatch.setattr(Datastore, "for_model", lambda model, name: store)
    ids = smollm.tokenizer("def area(r):\n    return 3.14 *", add_special_tokens=False).input_ids
    params = GenerationParams(max_new_tokens=6)
    wrapped = make_method(name, smollm).generate(smollm, ids, params)
    alone = make_method(EXAMPLES[family], smollm).generate(smollm, ids, params)
    assert wrapped.token_ids and wrapped.token_ids == alone.token_ids
    assert wrapped.stats.extra_macs > alone.stats.extra_macs  # the wrapper's check ran on every token
    assert smollm.head_tap is None
