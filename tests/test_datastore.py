"""The datastore behind `retrieval` drafting: its matches and continuations agree with a brute
force search over the same token lists, it survives a save and reopen, and names stay names."""

import random
from pathlib import Path

import pytest

from dyncomplete.methods.datastore import Datastore, store_dir

SEPARATOR = 50


def documents(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    phrases = [[rng.randrange(SEPARATOR) for _ in range(rng.randrange(2, 7))] for _ in range(12)]
    return [[t for _ in range(rng.randrange(5, 40)) for t in rng.choice(phrases)] for _ in range(30)]


def occurrences(docs, tail):
    """(document, index after the occurrence) of every occurrence of `tail`."""
    n = len(tail)
    return [(d, i + n) for d, doc in enumerate(docs) for i in range(len(doc) - n + 1) if doc[i : i + n] == tail]


def test_longest_match_and_continuation_agree_with_brute_force():
    docs = documents()
    store = Datastore.build(docs, SEPARATOR)
    rng = random.Random(1)
    for _ in range(200):
        doc = rng.choice(docs)
        cut = rng.randrange(1, len(doc))
        context = [rng.randrange(SEPARATOR)] * rng.randrange(2) + doc[:cut]
        n, lo, hi = store.longest_match(context, max_len=12)
        want = max(k for k in range(0, min(12, len(context)) + 1) if k == 0 or occurrences(docs, context[-k:]))
        assert n == want and hi - lo == len(occurrences(docs, context[-n:]))
        steps = store.continuation(lo, hi, 3)
        found = occurrences(docs, context[-n:])
        for step in steps:  # each token is the most frequent next one among the occurrences still agreeing
            nexts = [docs[d][i] for d, i in found if i < len(docs[d])]
            assert step.of == len(found) and step.count == nexts.count(step.token) == max(map(nexts.count, nexts))
            found = [(d, i + 1) for d, i in found if i < len(docs[d]) and docs[d][i] == step.token]
        if len(steps) < 3:  # the walk stopped only where the most frequent "next token" is a file's end
            ends = sum(i >= len(docs[d]) for d, i in found)
            assert ends and ends >= max(([docs[d][i] for d, i in found if i < len(docs[d])] or [0]).count(t)
                                        for t in range(SEPARATOR))


def test_no_match_and_unknown_tokens():
    store = Datastore.build(documents(), SEPARATOR)
    assert store.longest_match([SEPARATOR + 7], max_len=8) == (0, 0, 0)
    assert store.longest_match([], max_len=8) == (0, 0, 0)


def test_saved_store_reopens_the_same(tmp_path):
    docs = documents(2)
    store = Datastore.build(docs, SEPARATOR, meta={"model": "m"})
    store.save(tmp_path / "s")
    again = Datastore.open(tmp_path / "s")
    assert again.meta == store.meta and again.meta["tokens"] == sum(map(len, docs))
    context = docs[3][:9]
    assert again.longest_match(context, 8) == store.longest_match(context, 8)
    with pytest.raises(ValueError, match="dyncomplete index"):
        Datastore.open(tmp_path / "missing")


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "x" * 65])
def test_store_names_are_names_not_paths(bad):
    with pytest.raises(ValueError, match="datastore name"):
        store_dir("smollm2-135m", bad)


@pytest.mark.model
def test_index_command_builds_a_store_that_retrieval_opens(tmp_path, capsys):
    import json
    import shutil

    from dyncomplete.cli import main
    from dyncomplete.methods import make_method
    from dyncomplete.models import load

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def area(r):\n    return 3.14159 * r * r\n" * 20)
    (tmp_path / "pkg" / "vendored").mkdir()
    (tmp_path / "pkg" / "vendored" / "b.py").write_text("x = 1\n")
    name = f"test-index-{random.randrange(10**9)}"
    assert main(["index", str(tmp_path / "pkg"), "--model", "smollm2-135m", "--name", name, "--exclude",
                 "vendored", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    try:
        assert report["files"] == 1 and report["tokens"] > 100 and report["bytes"] > 4 * report["tokens"]
        model = load("smollm2-135m", progress=lambda m: None)
        method = make_method(f"retrieval:{name}/6", model)
        assert method.proposer.store.meta["tokens"] == report["tokens"] and method.proposer.max_draft == 6
        assert not method.proposer.tree and make_method(f"retrieval:{name}/tree", model).proposer.tree
        with pytest.raises(ValueError, match="dyncomplete index"):
            make_method("retrieval:no-such-store", model)
        with pytest.raises(ValueError, match="needs a datastore"):
            make_method("retrieval", model)
        meta_file = Path(report["path"]) / "meta.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps(dict(meta, tokenizer="another")))  # as if built for another model
        with pytest.raises(ValueError, match="another tokenizer"):
            make_method(f"retrieval:{name}", model)
    finally:
        shutil.rmtree(report["path"])
    assert main(["index", str(tmp_path), "--model", "smollm2-135m", "--name", "../up"]) == 2
