#!/bin/bash
# A decode step's time, git revision BEFORE against the working tree, alternating, ROUNDS rounds
# (zen4-step/overhead.py: three medians of 256 steps at 480-512 cached tokens a process). The two
# builds pack their weights differently, so each gets its own snapshot folder: BEFORE runs from a
# worktree with the usual cache, the working tree with a cache whose packed/ is its own.
# bash docs/results/records-zen4/ab.sh BEFORE ROUNDS MODEL >> steps.txt
set -e
cd "$(dirname "$0")/../../.."
here=$(pwd) cache=${DYNCOMPLETE_CACHE:-$HOME/.cache/dyncomplete}
before=$(mktemp -d) after_cache=$(mktemp -d)
git worktree add --detach "$before" "$1" > /dev/null
trap 'git worktree remove --force "$before"; rm -rf "$after_cache"' EXIT
for d in gguf llama.cpp models native tmp; do ln -s "$cache/$d" "$after_cache/$d"; done
for round in $(seq 1 "$2"); do
  (cd "$before" && PYTHONPATH="$before" python "$here/docs/results/zen4-step/overhead.py" "$3" 2>/dev/null | sed "s/^/before $round /")
  (PYTHONPATH="$here" DYNCOMPLETE_CACHE="$after_cache" python docs/results/zen4-step/overhead.py "$3" 2>/dev/null | sed "s/^/after $round /")
done
