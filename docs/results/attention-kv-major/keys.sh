#!/bin/bash
# #33's keystroke replay on decode.c of git revision BEFORE and on the working tree's, in the order
# before, after, after, before: bash docs/results/attention-kv-major/keys.sh BEFORE
cd "$(dirname "$0")/../../.."
SRC=dyncomplete/models/native/decode.c
SP=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')  # the third-party files replayed
cp $SRC /tmp/decode.after.c
git show "$1:$SRC" > /tmp/decode.before.c
trap 'cp /tmp/decode.after.c $SRC' EXIT
mkdir -p runs/kv-major
run() {
  cp /tmp/decode.$1.c $SRC
  echo "$(date +%T) start $1 $2"
  dyncomplete bench-session --model qwen2.5-coder-0.5b --client llama-vim --pattern down --source $SP/click/core.py $SP/httpx/_client.py $SP/rich/console.py $SP/requests/models.py --lines 30 --concurrent $2 --keystroke-ms 200 --server dyncomplete '--dyncomplete-args=--parallel 4' --out runs/kv-major/keys200-$1-$3.json > runs/kv-major/keys200-$1-$3.log 2>&1
  echo "$(date +%T) done $1 $2 rc $?"
}
run before "4 1" a
run after "4 1" a
run after "1 4" b
run before "1 4" b
