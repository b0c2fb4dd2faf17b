"""`dyncomplete serve --ray`: two replicas of SmolLM2 on a real two-node Ray cluster that the tests
start on this machine (Ray's `cluster_utils.Cluster`: a head and a second node, one CPU each, each
its own raylet), the server as the CLI runs it. Answers are the single server's; each editor stays
on its replica; editors replay at once; a replica killed mid-request loses nothing."""

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

pytestmark = pytest.mark.model

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
    nodes = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        nodes.add_node(num_cpus=1)
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


def test_each_editor_stays_on_one_replica_and_editors_spread(cluster):
    url, _ = cluster
    homes = {}
    for k in range(12):  # all twelve on one replica by chance: 2 in 4096
        seen = {infill(url, f"editor-{k}", f"x{k} = {i}\n").headers["x-dyncomplete-replica"] for i in range(2)}
        assert len(seen) == 1, f"editor-{k} moved between replicas: {seen}"
        homes[k] = seen.pop()
    assert len(set(homes.values())) == REPLICAS


def test_editors_replaying_at_once(cluster):
    from pathlib import Path

    from dyncomplete.bench.session import cursors_of, replay_editors, summarise_editor

    url, _ = cluster
    sources = [Path(threading.__file__)] + [Path(httpx.__file__).with_name(f) for f in ("_client.py", "_models.py")]
    cursors = [c for path in sources for c in cursors_of(path, "down", 0.5, 3)]
    results, served = replay_editors(url, MODEL, "llama-vim", cursors, 16, {"Authorization": f"Bearer {SERVE_KEY}"},
                                     editors=3)
    assert len(results) == len(cursors) and served["completions_per_s"] > 0
    assert summarise_editor(results)["prompt_reused_share"] > 0  # the editors' later pauses hit their replica's cache


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
