"""Kept answers (serve/suggestions.py): typing that continues an editor's recent answer gets its
rest, and the answer prefetched for a suggestion accepted is the one the model gives that request."""

import time

import pytest
from helpers import SERVE_KEY
from starlette.testclient import TestClient

from dyncomplete.engine import EditorGuards, GenerationParams
from dyncomplete.serve import Settings, create_app
from dyncomplete.serve.suggestions import TYPED_BACK, Suggestions, accepted, same_request, shown
from dyncomplete.serve.worker import Job

PREFIX, SUFFIX = "def area(r):\n    ", "\n\nprint(area(2))\n"
ANSWER = "return 3.14 * r * r"


def job(prefix=PREFIX, suffix=SUFFIX, editor="vim", temperature=0.0, n_indent=0, max_new_tokens=48):
    guards = EditorGuards.for_cursor(prefix, suffix, 1.0, n_indent)
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=temperature, editor=guards)
    return Job(prefix=prefix, suffix=suffix, params=params, method="baseline", use_cache=True, client_id=None,
               editor=editor, deadline=float("inf"), emit=lambda event: None)


def test_typing_on_gets_the_rest_of_the_answer_it_continues():
    kept = Suggestions()
    kept.add(job(), ANSWER, "eos", "answer")
    assert kept.find(job(PREFIX + "return 3")) == (".14 * r * r", "eos", "answer")
    assert kept.find(job()) == (ANSWER, "eos", "answer")  # the same request again
    assert kept.find(job(PREFIX + "return 4")) is None  # typed otherwise
    assert kept.find(job(PREFIX + ANSWER)) is None  # typed all of it: nothing left to suggest
    assert kept.find(job(PREFIX + "return 3", suffix=SUFFIX + "x = 1\n")) is None  # other text after the cursor
    assert kept.find(job(PREFIX + "return 3", editor="vscode")) is None  # another editor's
    assert kept.find(job(PREFIX + "return 3", max_new_tokens=16)) is None  # other limits
    assert kept.find(job(PREFIX + "return 3", temperature=0.7)) is None  # sampled: not reused
    long = "x" * (TYPED_BACK + 2)
    kept.add(job(), long, "max_tokens", "answer")
    assert kept.find(job(PREFIX + long[:TYPED_BACK])) == ("xx", "max_tokens", "answer")
    assert kept.find(job(PREFIX + long[:TYPED_BACK + 1])) is None  # typed too far past it


def test_an_answer_after_typed_blanks_is_followed_as_the_editors_insert_it():
    """At a cursor after only blanks Qwen2.5-Coder writes the indentation again; the plugins drop it."""
    kept = Suggestions()
    kept.add(job(), "    return r", "eos", "answer")
    assert kept.find(job()) == ("    return r", "eos", "answer")  # the same request: the same answer
    assert kept.find(job(PREFIX + "ret")) == ("urn r", "eos", "answer")
    assert accepted(job(), "    return r").prefix == PREFIX + "return r"
    assert shown("x = 1\n  ", "      y") == "    y" and shown("x = (", "  y") == "  y"


def test_a_sampled_answer_is_not_kept():
    kept = Suggestions()
    kept.add(job(temperature=0.5), ANSWER, "eos", "answer")
    assert kept.find(job(PREFIX + "ret")) is None


def test_the_rest_is_cut_by_the_new_requests_own_guards():
    kept = Suggestions()
    kept.add(job(), "return (3.14 * r\n    * r)\nx = 1", "max_tokens", "answer")
    # n_indent 4 of the new request: the line at column 0 ends it, where generating would have stopped
    assert kept.find(job(PREFIX + "return", n_indent=4)) == (" (3.14 * r\n    * r)\n", "indent", "answer")


def test_the_accepted_request_continues_after_the_answer_with_its_own_guards():
    asked = job(n_indent=4)
    ahead = accepted(asked, ANSWER)
    assert (ahead.prefix, ahead.suffix, ahead.editor, ahead.client_id) == (PREFIX + ANSWER, SUFFIX, "vim", None)
    assert ahead.params.editor == EditorGuards.for_cursor(PREFIX + ANSWER, SUFFIX, 1.0, 4)
    assert ahead.params.max_new_tokens == asked.params.max_new_tokens
    ahead.cancel("superseded")
    assert ahead.cancelled() and not asked.cancelled()  # a flag of its own
    assert same_request(ahead, accepted(job(n_indent=4), ANSWER)) and not same_request(ahead, asked)


# -- through the server -----------------------------------------------------------------------------------


def served(model, **changes):
    settings = Settings(**{"methods": (), "api_key": SERVE_KEY, "max_tokens_limit": 48, "context_budget": 256,
                           "cache_bytes": 2**24, "client_memory": False, **changes})
    return TestClient(create_app(model, settings), base_url="http://localhost",
                      headers={"Authorization": f"Bearer {SERVE_KEY}"})


def infill(http, prefix, n_indent=4):
    r = http.post("/infill", json={"input_prefix": prefix, "input_suffix": SUFFIX, "prompt": "", "n_predict": 48,
                                   "n_indent": n_indent, "response_fields": []})
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(worker, counter, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while worker.status().get(counter, 0) < 1:
        assert time.monotonic() < deadline, worker.status()
        time.sleep(0.02)


@pytest.mark.model
def test_the_prefetched_answer_is_the_one_generating_gives(smollm):
    """After an answer, the server generates the request for it accepted in idle time; that request
    then comes from the prefetch, with the text a server without kept answers generates for it."""
    with served(smollm) as http:
        first = infill(http, PREFIX)
        text = first["content"]
        assert text and first["dyncomplete"]["reused"] is None
        wait_for(http.app.state.server.worker, "prefetched")
        cache = http.app.state.server.prefix_cache  # the prefetch read it without counting or storing
        assert (cache.counters.lookups, len(cache)) == (1, 1)
        inserted = shown(PREFIX, text)  # as the editor inserts it after the typed blanks
        ahead = infill(http, PREFIX + inserted)
        assert ahead["dyncomplete"]["reused"] == "prefetch" and ahead["tokens_predicted"] == 0
        typed = infill(http, PREFIX + inserted[:3])  # typing the first answer on
        assert typed["dyncomplete"]["reused"] == "answer" and typed["content"] == inserted[3:]
    with served(smollm, suggestions=False) as http:
        assert infill(http, PREFIX)["content"] == text
        fresh = infill(http, PREFIX + inserted)
        assert fresh["dyncomplete"]["reused"] is None and fresh["tokens_predicted"] > 0
        assert http.app.state.server.worker.status().get("prefetched", 0) == 0
    assert ahead["content"] == fresh["content"]
