"""`dyncomplete serve --ray` and `bench --ray` on a real two-node Ray cluster that the tests start on
this machine (Ray's `cluster_utils.Cluster`: a head and a second node, each its own raylet, two
logical CPUs each), the server as the CLI runs it, two replicas of SmolLM2. Answers are the single
server's; each editor stays on its replica; editors replay at once; a bench on Ray writes a local
run's predictions; a replica killed mid-request loses nothing. And the routing's hashing alone."""

import collections
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from helpers import SERVE_KEY

from dyncomplete.bench.launch import free_port, running
from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline

ray = pytest.importorskip("ray", reason="the 'cluster' extra (Ray Serve) is not installed")
cluster_utils = pytest.importorskip("ray.cluster_utils")

MODEL = "smollm2-135m"
AUTH = {"Authorization": f"Bearer {SERVE_KEY}", "Content-Type": "application/json"}
REPLICAS = 2


def replica_states(url: str) -> dict:
    return httpx.get(f"{url}/health", headers=AUTH, timeout=30).json()["replicas"]


def wait_for_replicas(url: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while replica_states(url) != {"RUNNING": REPLICAS}:
        assert time.monotonic() < deadline, f"replicas not running: {replica_states(url)}"
        time.sleep(1)


@pytest.fixture(scope="module")
def cluster():
    """(base URL, GCS address) of `dyncomplete serve --ray` with two replicas on a two-node cluster."""
    # two logical CPUs a node: a replica each, and a bench actor each beside them
    nodes = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        nodes.add_node(num_cpus=2)
        port = free_port()
        cmd = [sys.executable, "-m", "dyncomplete", "serve", "--model", MODEL, "--dtype", "float32",
               "--api-key", SERVE_KEY, "--ray", nodes.address, "--replicas", str(REPLICAS), "--port", str(port)]
        with running(cmd, port, start_timeout_s=300) as (url, _):
            wait_for_replicas(url)
            yield url, nodes.address
    finally:
        nodes.shutdown()


def infill(url: str, editor: str, prefix: str, n_predict: int = 8) -> httpx.Response:
    r = httpx.post(f"{url}/infill", headers=AUTH | {"X-Client-Id": editor}, timeout=120,
                   json={"input_prefix": prefix, "input_suffix": "\n", "prompt": "", "n_predict": n_predict})
    assert r.status_code == 200, r.text
    return r


def test_rendezvous_moves_only_a_lost_replicas_editors():
    from types import SimpleNamespace

    from dyncomplete.serve.cluster import rendezvous

    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}")) for i in range(4)]
    editors = [f"127.0.0.1|key|editor-{k}" for k in range(400)]
    home = {e: rendezvous(e, replicas)[0] for e in editors}
    assert all(rendezvous(e, replicas[::-1])[0] is home[e] for e in editors)  # the order given does not matter
    assert 70 < min(sum(h is r for h in home.values()) for r in replicas)  # about 100 each
    lost = replicas[1]
    after = {e: rendezvous(e, [r for r in replicas if r is not lost])[0] for e in editors}
    assert all(after[e] is home[e] for e in editors if home[e] is not lost)
    assert all(after[e] is rendezvous(e, replicas)[1] for e in editors if home[e] is lost)  # to its second choice


@pytest.mark.model
def test_answers_are_the_single_servers_streamed_and_not(cluster, smollm):
    url, _ = cluster
    prompt = "def add(a, b):\n"
    ids = smollm.tokenizer(prompt, add_special_tokens=False).input_ids
    want = Baseline().generate(smollm, ids, GenerationParams(max_new_tokens=8, token_healing=True)).text
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    whole = httpx.post(f"{url}/v1/completions", headers=AUTH, json=body, timeout=120)
    assert whole.status_code == 200 and whole.json()["choices"][0]["text"] == want
    with httpx.stream("POST", f"{url}/v1/completions", headers=AUTH, json=body | {"stream": True}, timeout=120) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2  # chunk by chunk, not one body
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 401  # the key is checked


def test_homes_are_bounded_by_each_replicas_share_and_kept():
    """Bounded loads: editors arriving one by one fill the replicas evenly, each taking the first of
    its own rendezvous order that has room; a kept home stays; a lost replica's editors move
    to replicas with room, the others stay."""
    from types import SimpleNamespace

    from dyncomplete.serve.cluster import assign_home, rendezvous

    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}")) for i in range(3)]

    def order(editor, running):
        return [r.replica_id.unique_id for r in rendezvous(editor, running)]

    homes = {}
    for k in range(10):
        editor = f"editor-{k}"
        homes[editor] = assign_home(editor, order(editor, replicas), homes)
        held = collections.Counter(homes.values())
        assert max(held.values()) - min(held[f"r{i}"] for i in range(3)) <= 1, held
    first_choices = sum(homes[e] == order(e, replicas)[0] for e in homes)
    assert first_choices >= 4  # room was the only reason to pass one's first choice
    assert all(assign_home(e, order(e, replicas), homes) == homes[e] for e in homes)
    running = replicas[:2]
    moved = dict(homes)
    for editor in homes:
        moved[editor] = assign_home(editor, order(editor, running), moved)
    assert all(moved[e] == homes[e] for e in homes if homes[e] != "r2")
    assert set(moved.values()) == {"r0", "r1"} and max(collections.Counter(moved.values()).values()) <= 5
    crowded = {f"editor-{k}": "r0" for k in range(4)}  # four editors on the one replica there was
    for _ in range(2):  # a replica added: each editor's next requests
        for editor in crowded:
            crowded[editor] = assign_home(editor, order(editor, replicas[:2]), crowded)
    assert sorted(collections.Counter(crowded.values()).values()) == [2, 2]


@pytest.mark.model
def test_each_editor_stays_on_one_replica_and_editors_spread_evenly(cluster):
    url, _ = cluster
    homes = {}
    for k in range(12):
        seen = {infill(url, f"editor-{k}", f"x{k} = {i}\n").headers["x-dyncomplete-replica"] for i in range(2)}
        assert len(seen) == 1, f"editor-{k} moved between replicas: {seen}"
        homes[k] = seen.pop()
    assert sorted(collections.Counter(homes.values()).values()) == [12 // REPLICAS] * REPLICAS


@pytest.mark.model
def test_editors_replaying_at_once(cluster):
    from pathlib import Path

    from dyncomplete.bench.session import cursors_of, replay_editors, summarise_editor

    url, _ = cluster
    sources = [Path(threading.__file__), Path(httpx.__file__).with_name("_client.py")]
    cursors = [c for path in sources for c in cursors_of(path, "down", 0.5, 3)]
    results, served = replay_editors(url, MODEL, "llama-vim", cursors, 8, {"Authorization": f"Bearer {SERVE_KEY}"},
                                     editors=2)
    assert len(results) == len(cursors) and served["completions_per_s"] > 0
    assert summarise_editor(results)["prompt_reused_share"] > 0  # the editors' later pauses hit their replica's cache


@pytest.mark.model
def test_bench_on_ray_writes_a_local_runs_predictions_and_resumes(cluster, tmp_path):
    _, address = cluster

    def bench(out, *extra):
        cmd = [sys.executable, "-m", "dyncomplete", "bench", "--model", MODEL, "--dtype", "float32", "--dataset",
               "line-py", "--limit", "3", "--methods", "lookup", "--context-budget", "128",
               "--no-progress", "--json", "--out", str(out), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return {(r["id"], r["method"]): r["prediction"] for r in map(json.loads, (out / "examples.jsonl").open())}

    local = bench(tmp_path / "local")
    on_ray = bench(tmp_path / "ray", "--ray", address, "--actors", "2")
    assert on_ray == local and len(local) == 3 * 2
    lines = (tmp_path / "ray" / "examples.jsonl").read_text().splitlines()
    (tmp_path / "ray" / "examples.jsonl").write_text("\n".join(lines[:-2]) + "\n")  # two results lost: run again
    assert bench(tmp_path / "ray", "--ray", address, "--actors", "1") == local
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["ray"]["actors"] == 1 and summary["n"] == 3


@pytest.mark.model
def test_a_replica_killed_mid_request_loses_nothing(cluster):
    url, address = cluster
    home = infill(url, "editor-kill", "def f():\n").headers["x-dyncomplete-replica"]
    body = {"model": MODEL, "prompt": "# the first 200 primes\nPRIMES = [2, 3, 5, 7, 11,", "max_tokens": 64}
    answers = []
    request = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{url}/v1/completions", headers=AUTH | {"X-Client-Id": "editor-kill"}, json=body, timeout=300)))
    request.start()
    time.sleep(1)  # 64 tokens take seconds on one thread: the answer is not out yet
    ray.init(address=address, logging_level="ERROR")
    try:
        ray.kill(ray.get_actor(f"SERVE_REPLICA::dyncomplete#Engine#{home}", namespace="serve"), no_restart=True)
    finally:
        ray.shutdown()
    request.join(timeout=120)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert answers[0].headers["x-dyncomplete-replica"] != home
    assert answers[0].json()["usage"]["completion_tokens"] == 64
    wait_for_replicas(url)  # Ray Serve replaced the lost replica
