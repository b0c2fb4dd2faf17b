#!/bin/bash
# A decode step at 480-512 cached tokens (zen4-step/overhead.py: three medians of 256 steps a
# process), git revision BEFORE against AFTER, alternating, ROUNDS rounds, both from worktrees.
# bash docs/results/native-tail/ab.sh BEFORE AFTER ROUNDS MODEL >> steps.txt
set -e
cd "$(dirname "$0")/../../.."
here=$(pwd) before=$(mktemp -d) after=$(mktemp -d)
git worktree add --detach "$before" "$1" > /dev/null
git worktree add --detach "$after" "$2" > /dev/null
trap 'git worktree remove --force "$before"; git worktree remove --force "$after"' EXIT
for round in $(seq 1 "$3"); do
  for build in before after; do
    dir=${!build}
    (cd "$dir" && PYTHONPATH="$dir" python "$here/docs/results/zen4-step/overhead.py" "$4" 2>/dev/null | sed "s/^/$build $round /")
  done
done
