"""Repository context in prompts, and the cross-file dataset cut from a real package."""

import copy
import os

import h11
import pytest

from dyncomplete.data.crossfile import build_cross_file
from dyncomplete.engine import build_prompt
from dyncomplete.engine.repo_context import Chunk, RepoContext, rank_chunks, windows

PREFIX = "from .models import Request\n\n\ndef send(url):\n    request ="
CHUNKS = [Chunk("pkg/models.py", "class Request:\n    def __init__(self, method, url):\n        pass"),
          Chunk("pkg/big.py", "x = 1\n" * 400),
          Chunk("pkg/util.py", "def quote(text):\n    return text")]


@pytest.fixture(scope="module")
def repo_tokenizer(smollm):
    """SmolLM2's tokenizer with Qwen2.5-Coder's two repository tokens added."""
    tokenizer = copy.deepcopy(smollm.tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|repo_name|>", "<|file_sep|>"]})
    return tokenizer


@pytest.mark.model
def test_context_goes_first_in_the_repository_format_and_the_file_prompt_follows_unchanged(repo_tokenizer):
    vocab = repo_tokenizer.get_vocab()
    repo, sep = vocab["<|repo_name|>"], vocab["<|file_sep|>"]
    plain = build_prompt(repo_tokenizer, PREFIX, budget=1024)
    context = RepoContext(CHUNKS, path="pkg/client.py", repo="pkg")
    prompt = build_prompt(repo_tokenizer, PREFIX, budget=1024, context=context)
    assert prompt.ids[0] == repo and prompt.ids[-len(plain.ids):] == plain.ids
    # the 400-line chunk does not fit in half the budget; the one after it still does
    assert prompt.context_chunks == 2 and prompt.ids.count(sep) == 3
    text = repo_tokenizer.decode(prompt.ids)
    # laid out in reverse: the most important chunk ends next to the current file
    assert text.index("pkg/util.py") < text.index("pkg/models.py") < text.index("pkg/client.py\nfrom .models")
    assert "x = 1" not in text
    assert len(prompt.ids) - len(plain.ids) <= 512


@pytest.mark.model
def test_models_without_repository_tokens_get_a_comment_per_file(smollm):
    prompt = build_prompt(smollm.tokenizer, PREFIX, budget=1024, context=RepoContext(CHUNKS[:1], "pkg/client.py"))
    text = smollm.tokenizer.decode(prompt.ids)
    assert text.startswith("# pkg/models.py\nclass Request:") and "\n# pkg/client.py\nfrom .models" in text


@pytest.mark.model
def test_no_chunk_fits_means_no_context(smollm):
    prompt = build_prompt(smollm.tokenizer, PREFIX, budget=64, context=RepoContext(CHUNKS[1:2], "pkg/client.py"))
    assert prompt.context_chunks == 0 and prompt.ids == build_prompt(smollm.tokenizer, PREFIX, budget=64).ids


def test_retrieval_ranks_by_identifier_overlap_and_drops_unrelated_windows():
    text = "\n".join(f"line_{i} = {i}" for i in range(30))
    assert [len(w.text.splitlines()) for w in windows("f.py", text)] == [10] * 5
    candidates = [Chunk("a.py", "unrelated = 1"), Chunk("b.py", "request = send(url)"), Chunk("c.py", "def send(url, request):")]
    assert [c.filename for c in rank_chunks(PREFIX, candidates, 5)] == ["c.py", "b.py"]


def test_cross_file_examples_start_with_a_name_from_another_file_and_never_see_their_own_file():
    root = os.path.dirname(h11.__file__)
    examples = build_cross_file(root, 40, seed=0)
    assert len(examples) == 40 and len({e["path"] for e in examples}) > 5  # spread over the package's files
    for e in examples:
        rel = e["path"].removeprefix("h11/")
        source = open(os.path.join(root, rel), encoding="utf-8").read()
        line = int(e["id"].rsplit(":", 1)[1])
        assert (e["input"] + e["gt"]).endswith(source.splitlines()[line - 1].rstrip())
        assert e["gt"].lstrip().startswith(e["cross_file_name"]) and e["defined_in"] != e["path"]
        assert e["extra"] and all(x["filename"] != e["path"] for x in e["extra"])
    assert build_cross_file(root, 40, seed=0) == examples


@pytest.mark.model
def test_infill_chunks_are_laid_out_in_the_order_sent_as_llama_cpp_does(smollm):
    from dyncomplete.serve.editors import _extra

    sent = [{"filename": "first.py", "text": "a = 1"}, {"filename": "last.py", "text": "b = 2"}]
    prompt = build_prompt(smollm.tokenizer, PREFIX, budget=1024, context=_extra({"input_extra": sent}))
    text = smollm.tokenizer.decode(prompt.ids)
    assert prompt.context_chunks == 2 and text.index("first.py") < text.index("last.py") < text.index("from .models")
