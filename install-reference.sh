#!/usr/bin/env bash
# llama.cpp as the speed reference, built from source for this CPU (minutes):
#  - llama-cpp-python, the `llama-cpp` method;
#  - llama-server and llama-bench from the llama.cpp sources vendored in the same llama-cpp-python
#    sdist, into $DYNCOMPLETE_CACHE/llama.cpp/VERSION/bin (default ~/.cache/dyncomplete), for
#    `bench-session --server llama-server`; skipped when both binaries are there.
# Built for the instruction sets /proc/cpuinfo lists, but never AMX: on the VMs we run on the CPU
# reports AMX and arch_prctl grants the tile state, yet ggml's AMX kernels die on an illegal
# instruction at the first decode (seen 2026-12-01, Xeon). A build that already has AMX is rebuilt.
# JOBS=N sets the build's parallel jobs (default: all cores).
set -euo pipefail
cd "$(dirname "$0")"
pin=$(python3 -c 'import tomllib; print([d for d in tomllib.load(open("pyproject.toml","rb"))["project"]["optional-dependencies"]["reference"] if d.startswith("llama-cpp-python")][0])')
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
            avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if [[ " $flags " == *" ${pair%%:*} "* ]]; then args="$args -DGGML_${pair##*:}=ON"; fi
done

if python3 -c "import llama_cpp, sys; sys.exit('AMX_INT8 = 1' in llama_cpp.llama_print_system_info().decode())" 2>/dev/null; then
  echo "llama-cpp-python already built without AMX"
else
  echo "building llama-cpp-python with $args"
  CMAKE_ARGS="$args" python3 -m pip install -q --no-cache-dir --force-reinstall --no-deps "$pin"
fi
python3 -m pip install -q -e ".[reference]"

home="${DYNCOMPLETE_CACHE:-$HOME/.cache/dyncomplete}/llama.cpp/${pin#*==}"
if [[ -x $home/bin/llama-server && -x $home/bin/llama-bench ]]; then
  echo "llama-server and llama-bench already in $home/bin"
  exit 0
fi
mkdir -p "$home"
sdist=$(ls "$home"/llama_cpp_python-*.tar.gz 2>/dev/null | head -1 || true)
if [[ -z $sdist ]]; then
  python3 -m pip download -q --no-deps --no-binary :all: -d "$home" "$pin"
  sdist=$(ls "$home"/llama_cpp_python-*.tar.gz | head -1)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar xzf "$sdist" -C "$work"
echo "building llama-server and llama-bench with $args"
cmake -S "$work"/llama_cpp_python-*/vendor/llama.cpp -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF $args
cmake --build "$work/build" -j "${JOBS:-$(nproc)}" --target llama-server llama-bench
mkdir -p "$home/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-bench" "$home/bin/"
echo "llama-server and llama-bench in $home/bin"
