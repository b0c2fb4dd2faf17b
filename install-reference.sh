#!/usr/bin/env bash
# llama.cpp as the speed reference: llama-cpp-python compiled from source for this CPU (minutes).
# Built for the instruction sets /proc/cpuinfo lists, but never AMX: on the VMs we run on the CPU
# reports AMX and arch_prctl grants the tile state, yet ggml's AMX kernels die on an illegal
# instruction at the first decode (seen 2026-12-01, Xeon). A build that already has AMX is rebuilt.
set -euo pipefail
cd "$(dirname "$0")"
if python3 -c "import llama_cpp, sys; sys.exit('AMX_INT8 = 1' in llama_cpp.llama_print_system_info().decode())" 2>/dev/null; then
  python3 -m pip install -q -e ".[reference]"  # already built without AMX: only the extra's metadata
  exit 0
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
            avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if [[ " $flags " == *" ${pair%%:*} "* ]]; then args="$args -DGGML_${pair##*:}=ON"; fi
done
echo "building llama-cpp-python with $args"
CMAKE_ARGS="$args" python3 -m pip install -q --no-cache-dir --force-reinstall --no-deps \
  "$(python3 -c 'import tomllib; print([d for d in tomllib.load(open("pyproject.toml","rb"))["project"]["optional-dependencies"]["reference"] if d.startswith("llama-cpp-python")][0])')"
python3 -m pip install -q -e ".[reference]"
