#!/bin/bash
# A decode step at 512 and 4,096 cached tokens (zen4-limits/depth.py: 3 rounds of 32 steps a depth),
# git revision BEFORE against the working tree, alternating, ROUNDS rounds, one process each.
# bash docs/results/values-one-pass/ab.sh BEFORE ROUNDS MODEL >> steps.txt
set -e
cd "$(dirname "$0")/../../.."
here=$(pwd) before=$(mktemp -d)
git worktree add --detach "$before" "$1" > /dev/null
trap 'git worktree remove --force "$before"' EXIT
for round in $(seq 1 "$2"); do
  (cd "$before" && PYTHONPATH="$before" python "$here/docs/results/zen4-limits/depth.py" "$3" 512,4096 2>/dev/null | sed "s/^/before $round /")
  (PYTHONPATH="$here" python docs/results/zen4-limits/depth.py "$3" 512,4096 2>/dev/null | sed "s/^/after $round /")
done
