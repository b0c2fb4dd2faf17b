"""`dyncomplete bench --ray ADDRESS`: the benchmark's examples spread over Ray actors, each with
its own copy of the model and the same `runner.Runner` as a local run, so the records (and the
predictions in them) are a local run's. The driver writes examples.jsonl as examples finish and
summarises as a local run does; a rerun resumes from the same file."""

from __future__ import annotations

from typing import Callable, Iterator

import ray

from .runner import Runner, Setup


@ray.remote
class BenchActor:
    """One model and its methods, as `Runner` holds them."""

    def __init__(self, model_options: dict, method_names: list[str], setup: Setup, threads: int):
        import torch

        from ..energy import open_meter
        from ..models import load

        torch.set_num_threads(threads)
        self.model = load(**model_options, progress=lambda message: None)
        self.runner = Runner(self.model, method_names, open_meter(model_options["device"]), setup)

    def describe(self) -> dict:
        return self.runner.describe()

    def run(self, example: dict, names: list[str], dataset_params, has_tests: bool) -> list[dict]:
        return list(self.runner.records(example, names, dataset_params, has_tests))


def start_actors(address: str, count: int, cpus: int, model_options: dict, method_names: list[str],
                 setup: Setup) -> tuple[list, dict]:
    """`count` actors, `cpus` CPUs (and threads) each, and what the first one loaded."""
    ray.init(address=address, logging_level="ERROR")
    actors = [BenchActor.options(num_cpus=cpus).remote(model_options, method_names, setup, cpus) for _ in range(count)]
    return actors, ray.get(actors[0].describe.remote())


def ray_records(actors: list, dataset) -> Callable:
    """`run_bench`'s producer: example i to actor i mod N (each actor runs its share in order),
    the records of each example as soon as it is done."""
    def produce(pending) -> Iterator[dict]:
        waiting = [actors[i % len(actors)].run.remote(example, names, dataset.params, dataset.has_tests)
                   for i, (example, names) in enumerate(pending)]
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            yield from ray.get(done[0])
    return produce
