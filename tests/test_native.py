"""The native decode kernels (models/native): the scalar build (no AVX2) and the AVX2 build (no
AVX-512) compute the same products as the one for this CPU, bit for bit, each row independent of the
rows beside it, and whole layers to rounding; CPUs that share a name get their own library; a
machine without a compiler gets a clear refusal instead of int4 weights; a thread other than the
loading one runs the kernels as fast."""

import ctypes
import json
import json.decoder

import pytest
import torch
from helpers import products_here_and_on_a_later_thread

from dyncomplete import paths
from dyncomplete.models import native
from dyncomplete.models.native import bindings
from dyncomplete.models.weights import Linear

BUILDS = {"scalar": "x86-64", "avx2": "x86-64-v3"}  # -march of the kernels' portable loops and of their AVX2 version


def cpu_has(flag: str) -> bool:
    return any(line.startswith("flags") and f" {flag} " in f"{line} " for line in open("/proc/cpuinfo"))


def product(lib, lin: Linear, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], lin.out_features, dtype=torch.bfloat16)
    work = torch.empty(lib.linear_workspace_floats(lin.in_features, lin.out_features, x.shape[0]))
    lib.linear_bf16(ctypes.byref(lin.native), x.data_ptr(), x.shape[0], out.data_ptr(), work.data_ptr())
    return out


@pytest.fixture(scope="module", params=list(BUILDS))
def portable(request, tmp_path_factory):
    if request.param == "avx2" and not (cpu_has("avx2") and cpu_has("fma")):
        pytest.skip("this CPU has no AVX2")
    flags = [f if f != "-march=native" else f"-march={BUILDS[request.param]}" for f in native.FLAGS]
    return native.compile_library(tmp_path_factory.mktemp("native") / f"{request.param}.so", flags)


# (1020, 160): a partial last block inside a whole unit of blocks; 13 rows: tiles of 8, 4 and 1
@pytest.mark.parametrize("quant", ["int4", "int8"])
@pytest.mark.parametrize("shape", [(100, 96), (576, 1536), (1001, 864), (1020, 160)])
def test_portable_builds_compute_the_same_products_row_by_row(portable, shape, quant):
    g = torch.Generator().manual_seed(shape[1])
    lin = Linear((torch.randn(shape, generator=g) * 0.05).bfloat16(), torch.randn(shape[0]).bfloat16(), quant)
    rows = 13
    x = torch.randn(rows, shape[1], generator=g).bfloat16()
    here = product(native.library(), lin, x)
    anywhere = product(portable, lin, x)
    assert torch.equal(anywhere, here)  # the same floating-point operations in the same order
    alone = [product(portable, lin, x[r : r + 1].contiguous())[0] for r in range(rows)]
    assert all(torch.equal(anywhere[r], alone[r]) for r in range(rows))
    # the product the kernels compute is the dequantized weight times the input
    ref = x.float() @ lin.dequantized().float().t() + lin.bias.float()
    torch.testing.assert_close(here.float(), ref, atol=0.05, rtol=0.02)


@pytest.mark.model
def test_portable_builds_run_whole_layers_to_nearly_the_same_logits(portable, smollm_int4, monkeypatch):
    """A prompt in decode.c's chunks (keys in vectors of 16, the last ones 8 at a time, the chunk's
    own rows), then one-token steps, in each build: the same logits to rounding (the portable
    loops' expf and norms round differently from the vector versions; products do not)."""
    model = smollm_int4
    monkeypatch.setattr(model.engines["fast"], "native_prompt_max", None)
    ids = model.tokenizer(open(json.decoder.__file__).read()).input_ids[:45]

    def run():
        cache = model.new_cache()
        logits = [model.forward(torch.tensor(ids[:41]), cache, last_only=False)[0]]
        return torch.cat(logits + [model.forward(torch.tensor([t]), cache)[0] for t in ids[41:]])

    here = run()
    monkeypatch.setattr(bindings, "library", lambda: portable)
    anywhere = run()
    assert anywhere.shape == (len(ids), model.vocab_size)
    # bf16 hidden states carry each layer's last-bit differences on: a mean of 0.18 against a
    # spread of 7.3, the same top token at 43 of 45 positions (SmolLM2, the scalar build here)
    assert (anywhere - here).abs().mean() < 0.05 * here.std()
    assert (anywhere.argmax(-1) == here.argmax(-1)).float().mean() >= 0.9


def test_cpus_that_share_a_name_get_their_own_kernels_and_measurements(tmp_path, monkeypatch):
    """Virtual machines of AMD Zen 3 (AVX2) and Zen 4 (AVX-512) both report "AMD EPYC": a library
    compiled with -march=native on one would stop the other with an illegal instruction, and a
    figure measured on one is not the other's. Both are filed under `cpu_identity`."""
    kinds = {"zen3": "cpu family\t: 25\nmodel\t\t: 1\nflags\t\t: fpu sse2 avx2 fma\n",
             "zen4": "cpu family\t: 25\nmodel\t\t: 17\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni\n"}
    monkeypatch.setenv("DYNCOMPLETE_CACHE", str(tmp_path))
    seen = {}
    for kind in ("zen3", "zen4", "zen3"):
        text = f"processor\t: 0\nmodel name\t: AMD EPYC\n{kinds[kind]}\nprocessor\t: 1\n{kinds['zen4']}"
        monkeypatch.setattr(paths, "_cpuinfo", lambda: text)
        seen.setdefault(kind, set()).add(paths.cpu_identity())
        paths.machine_measurement("figure.json", "copy bandwidth", lambda: {"zen3": 1.0, "zen4": 2.0}[kind])
    assert len(seen["zen3"]) == 1 and seen["zen3"] != seen["zen4"]
    assert all(identity.startswith("AMD EPYC [") for ids in seen.values() for identity in ids)
    assert sorted(json.loads((tmp_path / "figure.json").read_text()).values()) == [1.0, 2.0]
    assert native.cpu_identity is paths.cpu_identity  # the kernels' library is named after it too


def test_without_a_compiler_int4_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(native.NativeUnavailable, match="apt-get install gcc.*--quant none"):
        native.compile_library(tmp_path / "k.so")


def test_a_thread_that_did_not_load_runs_the_kernels_as_fast_as_the_loading_one():
    """The server loads in its main thread and decodes in a worker thread; `load` ends with
    `release_thread_pool` (without it the worker's products took about three times as long)."""
    here, there = products_here_and_on_a_later_thread(native.release_thread_pool)
    assert there < 1.5 * here, (here, there)
