"""Continuous batching (int4, decode.c): several sequences' rows in one call give each sequence the
bits it gets alone, and a worker with parallel slots gives every request baseline's tokens alone,
whatever shares its batches (prompts in chunks, other requests joining and leaving, a cancelled
one, a method that runs alone, lookup's verification passes under a shared verify budget); the
budget's choice of drafted positions (TETRIS)."""

import os
import time

import pytest
import torch
from helpers import ids_of, run_jobs, stdlib_prompts

from dyncomplete.engine import GenerationParams
from dyncomplete.serve.batching import ModelThread, shared_draft_lengths
from dyncomplete.serve.prefix_cache import PrefixCache
from dyncomplete.serve.worker import SLOT_NICENESS, Job, Worker

pytestmark = pytest.mark.model


def greedy_alone(model, ids, steps):
    cache = model.new_cache()
    out = [model.forward(torch.tensor(ids), cache)[0, -1]]
    for _ in range(steps):
        out.append(model.forward(torch.tensor([int(out[-1].argmax())]), cache)[0, -1])
    return out


def test_batched_rows_are_each_sequences_own_bits(smollm_int4):
    prompts = [ids_of(smollm_int4, p) for p in stdlib_prompts(3, 40)]
    alone = [greedy_alone(smollm_int4, ids, 5) for ids in prompts]
    caches = [smollm_int4.new_cache() for _ in prompts]
    done, logits = [0] * len(prompts), [[] for _ in prompts]
    # prompt chunks of 16 of every sequence together (different lengths: they end at different calls)
    while any(d < len(ids) for d, ids in zip(done, prompts)):
        steps, who = [], []
        for k, ids in enumerate(prompts):
            if done[k] < len(ids):
                chunk = ids[done[k] : done[k] + 16]
                assert smollm_int4.batchable(caches[k], done[k], len(chunk))
                steps.append((chunk, caches[k], done[k], int(done[k] + len(chunk) == len(ids))))
                who.append(k)
                done[k] += len(chunk)
        for k, row in zip(who, smollm_int4.forward_batch(steps)):
            if row is not None:
                logits[k].append(row[-1])
    for _ in range(5):
        steps = [([int(logits[k][-1].argmax())], caches[k], done[k], 1) for k in range(len(prompts))]
        for k, row in enumerate(smollm_int4.forward_batch(steps)):
            logits[k].append(row[0])
            done[k] += 1
    for mine, theirs in zip(logits, alone):
        assert len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_a_cache_behind_the_step_is_not_batchable(smollm_int4):
    cache = smollm_int4.new_cache()
    smollm_int4.forward(torch.tensor(ids_of(smollm_int4, "x = 1\n")), cache)
    assert not smollm_int4.batchable(cache, cache.lengths[0] + 1, 1)
    assert smollm_int4.batchable(cache, cache.lengths[0], 1)
    assert not smollm_int4.batchable(None, 0, 1)


def job(prefix, method="baseline", n=24):
    return Job(prefix=prefix, suffix=None, params=GenerationParams(max_new_tokens=n), method=method, use_cache=True,
               client_id=None, editor="", deadline=time.perf_counter() + 600, emit=lambda e: None)


def worker_of(model, parallel, verify_budget="shared"):
    w = Worker(model, ["baseline", "lookup", "lookup+stop:1.0"], queue_size=16, context_budget=512,
               prefix_cache=PrefixCache(2**27), parallel=parallel, verify_budget=verify_budget)
    w.start()
    return w


def completions(worker, prefixes, methods, cancel_after=None):
    finals = run_jobs(worker, [job(p, m) for p, m in zip(prefixes, methods)], cancel_after)
    assert all(kind == "done" for kind, _ in finals), finals
    return [result["completion"] for _, result in finals]


def batched(model, prefixes, method, parallel, verify_budget="shared"):
    """Every prefix with `method` through a worker of `parallel` slots: (completions, batching status)."""
    w = worker_of(model, parallel, verify_budget)
    try:
        return completions(w, prefixes, [method] * len(prefixes)), w.status()["batching"]
    finally:
        w.stop()


@pytest.fixture(scope="module")
def prefixes():
    return stdlib_prompts(6, 600)


@pytest.fixture(scope="module")
def alone(smollm_int4, prefixes):
    w = worker_of(smollm_int4, 1)
    try:
        return completions(w, prefixes, ["baseline"] * len(prefixes))
    finally:
        w.stop()


def test_batching_slots_run_below_the_model_threads_priority(smollm_int4, prefixes):
    """The slot threads' Python work yields the cores to the model thread's OpenMP threads."""
    w = worker_of(smollm_int4, 2)
    try:
        completions(w, prefixes[:2], ["baseline"] * 2)
        model = os.getpriority(os.PRIO_PROCESS, w.model_thread._thread.native_id)
        slots = [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in w._slots]
    finally:
        w.stop()
    assert slots == [min(19, model + SLOT_NICENESS)] * 2


def test_parallel_slots_give_each_request_its_tokens_alone(smollm_int4, prefixes, alone):
    together, status = batched(smollm_int4, prefixes, "baseline", 4)
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert max(status["batch_sizes"]) > 1  # the requests did share calls
    assert status["in_generation"] == 0
    assert status["batch_seconds"].keys() == status["batch_sizes"].keys()
    assert 0 < sum(status["batch_seconds"].values()) <= status["busy_s"]  # batched calls are part of the model's time


def test_a_cancelled_request_and_one_that_runs_alone_change_no_other(smollm_int4, prefixes, alone):
    w = worker_of(smollm_int4, 3)
    methods = ["baseline", "lookup+stop:1.0", "baseline", "lookup", "baseline", "baseline"]
    try:
        finals = run_jobs(w, [job(p, m) for p, m in zip(prefixes, methods)], cancel_after={2: 3})
    finally:
        w.stop()
    results = [result["completion"] for _, result in finals]
    assert finals[2][1]["stats"]["stopped_by"] == "disconnected" and results[2].stats.new_tokens < 24
    for k in (0, 1, 3, 4, 5):  # lookup is lossless, and a stop rule at 1.0 never fires: baseline's tokens too
        assert results[k].token_ids == alone[k].token_ids


def test_a_failing_step_reaches_its_slot_and_the_thread_goes_on(smollm_int4):
    thread = ModelThread(smollm_int4)
    thread.start()
    try:
        with pytest.raises(ValueError, match="boom"):
            thread.run_alone(lambda: (_ for _ in ()).throw(ValueError("boom")))
        cache = smollm_int4.new_cache()
        logits = thread.forward(0, ids_of(smollm_int4, "import os\n"), cache, 0)
        assert torch.equal(logits, smollm_int4.forward(torch.tensor(ids_of(smollm_int4, "import os\n")), smollm_int4.new_cache())[0, -1])
    finally:
        thread.stop()


@pytest.mark.parametrize("budget", ["shared", "per-request"])
def test_lookup_verifies_in_the_batches_and_gives_baselines_tokens(smollm_int4, prefixes, alone, budget):
    together, status = batched(smollm_int4, prefixes, "lookup", 3, budget)
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert status["verify_budget"] == budget and status["drafted_rows"] > 0
    assert max(status["batch_sizes"]) > 1
    if budget == "per-request":
        assert status["drafted_rows_cut"] == 0


def test_the_shared_budget_keeps_the_likeliest_positions_while_they_pay():
    # alone (one sure token, one row), an extra row at 0.5 of a step: 0.6 pays, 0.6 * 0.6 no more
    assert shared_draft_lengths(1, 1, [[0.6, 0.6]], 0.5, 64) == [1]
    # beside four decode steps the same first position no longer pays for its row
    assert shared_draft_lengths(5, 5, [[0.6, 0.6]], 0.5, 64) == [0]
    # the likelier draft gets the rows; cumulative chances decide across drafts
    assert shared_draft_lengths(2, 2, [[0.95, 0.95, 0.95], [0.3]], 0.2, 64) == [3, 0]
    # sure drafts fill the batch up to its row bound
    assert shared_draft_lengths(2, 2, [[1.0] * 10, [1.0] * 10], 0.1, 8) == [3, 3]
    assert shared_draft_lengths(3, 3, [[], [0.9]], 0.1, 64) == [0, 1]


def test_a_cut_verification_gives_the_rows_it_scored(smollm_int4):
    ids = ids_of(smollm_int4, "import os\nimport sys\n")
    draft = ids_of(smollm_int4, "import re")
    thread = ModelThread(smollm_int4, verify_row_cost=0.5)
    thread.start()
    try:
        runs = {}
        for name, rates in (("unlikely", [0.05] * len(draft)), ("likely", [0.99] * len(draft))):
            cache = smollm_int4.new_cache()
            smollm_int4.forward(torch.tensor(ids[:-1]), cache)
            runs[name] = thread.score_chain(0, [ids[-1]] + draft, cache, len(ids) - 1, rates)
            assert cache.lengths[0] == len(ids) - 1 + len(runs[name])
    finally:
        thread.stop()
    cache = smollm_int4.new_cache()
    smollm_int4.forward(torch.tensor(ids[:-1]), cache)
    full = smollm_int4.score_chain([ids[-1]] + draft, cache, len(ids) - 1)
    assert len(runs["unlikely"]) == 1 and len(runs["likely"]) == len(draft) + 1
    assert torch.equal(runs["likely"], full) and torch.equal(runs["unlikely"][0], full[0])


def test_the_servers_verify_budget_choices_are_the_workers():
    from dyncomplete.cli import build_parser
    from dyncomplete.serve.worker import VERIFY_BUDGETS

    parser = build_parser()
    assert parser.parse_args(["serve"]).verify_budget == "shared"
    assert [parser.parse_args(["serve", "--verify-budget", b]).verify_budget for b in VERIFY_BUDGETS] == list(VERIFY_BUDGETS)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--verify-budget", "tetris"])
