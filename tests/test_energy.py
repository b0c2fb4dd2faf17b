"""Energy meters and the compute-per-token work counter."""

import time

import pytest

from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline
from dyncomplete.engine import Stats
from dyncomplete.energy import compute_per_token, open_meter
from dyncomplete.energy.meters import EstimateMeter, RaplMeter
from dyncomplete.energy.work import head_macs, layer_macs


def busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_estimate_is_cpu_seconds_times_watts():
    meter = EstimateMeter(watts_per_core=4.0)
    with meter.measure() as m:
        busy(0.05)
    assert m.source == "estimate" and "4 W per core" in m.formula
    assert m.cpu_seconds >= 0.05 and m.seconds > 0
    assert m.joules == pytest.approx(m.cpu_seconds * 4.0, rel=0.05)


def test_open_meter_labels_its_source():
    meter = open_meter("cpu")
    with meter.measure() as m:
        busy(0.01)
    assert m.source in ("rapl", "estimate") and m.formula and m.joules > 0
    with pytest.raises(ValueError, match="unknown device"):
        open_meter("tpu")


def write_zone(root, name, uj, max_uj):
    zone = root / name
    zone.mkdir(exist_ok=True)
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_sums_packages_skips_subzones_and_handles_wraparound(tmp_path):
    """A powercap tree in the kernel's layout: two packages (one wraps), one core sub-zone."""
    write_zone(tmp_path, "intel-rapl:0", 900_000, 1_000_000)
    write_zone(tmp_path, "intel-rapl:1", 5_000_000, 10_000_000)
    write_zone(tmp_path, "intel-rapl:0:0", 0, 1_000_000)
    meter = RaplMeter(tmp_path)
    assert [z.name for z in meter.zones] == ["intel-rapl:0", "intel-rapl:1"]
    with meter.measure() as m:
        write_zone(tmp_path, "intel-rapl:0", 100_000, 1_000_000)  # wrapped: +200_000 uJ
        write_zone(tmp_path, "intel-rapl:1", 6_500_000, 10_000_000)  # +1_500_000 uJ
        write_zone(tmp_path, "intel-rapl:0:0", 999_999, 1_000_000)  # ignored
    assert m.source == "rapl" and m.joules == pytest.approx(1.7)


def test_rapl_without_zones_is_refused(tmp_path):
    with pytest.raises(OSError):
        RaplMeter(tmp_path)


@pytest.mark.model
def test_cost_model_figures_of_smollm(smollm):
    """docs/metrics.md: one layer ~3.5M MACs per token, the 49k-vocabulary head ~28M."""
    assert layer_macs(smollm) == pytest.approx(3.5e6, rel=0.03)
    assert head_macs(smollm) == 576 * 49152


@pytest.mark.model
def test_compute_per_token(smollm):
    ids = smollm.tokenizer("def add(a, b):\n", add_special_tokens=False).input_ids
    full = Baseline().generate(smollm, ids, GenerationParams(max_new_tokens=4)).stats
    assert compute_per_token(full, smollm) == pytest.approx(1.0)
    half = Stats(new_tokens=2, layer_evals=30, head_evals=2, extra_macs=1e6)
    layer, head = layer_macs(smollm), head_macs(smollm)
    expected = (30 * layer + 2 * head + 1e6) / 2 / (30 * layer + head)
    assert compute_per_token(half, smollm) == pytest.approx(expected)
    assert 0.6 < expected < 0.7  # the head keeps half depth from halving the work
    assert compute_per_token(Stats(), smollm) == 0.0
