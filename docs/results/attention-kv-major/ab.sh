#!/bin/bash
# decode.c of git revision BEFORE against the working tree's, alternating, ROUNDS rounds:
# passes.py (one sequence's passes by cached tokens) and team-keystrokes/steps.py (batched calls).
# bash docs/results/attention-kv-major/ab.sh BEFORE ROUNDS MODEL
set -e
cd "$(dirname "$0")/../../.."
SRC=dyncomplete/models/native/decode.c
cp $SRC /tmp/decode.after.c
git show "$1:$SRC" > /tmp/decode.before.c
trap 'cp /tmp/decode.after.c $SRC' EXIT
for round in $(seq 1 "$2"); do
  for v in before after; do
    cp /tmp/decode.$v.c $SRC
    echo "$v passes $(python docs/results/attention-kv-major/passes.py "$3" 256,1024,2048,4096 2>/dev/null)"
    echo "$v steps $(python docs/results/team-keystrokes/steps.py 2>/dev/null)"
  done
done
