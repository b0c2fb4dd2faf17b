#!/bin/bash
# Two-node local Ray cluster (1 CPU each), Qwen2.5-Coder-0.5B, 4 editors replaying llama.vim on 4
# third-party files: a fixed replica, autoscaling from 1 to 2 on ongoing requests, two fixed replicas.
set -x
cd "$(dirname "$0")"
SP=/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages
SRC="$SP/click/core.py $SP/httpx/_client.py $SP/rich/console.py $SP/starlette/routing.py"
export RAY_USAGE_STATS_ENABLED=0
ray stop >/dev/null 2>&1
ray start --head --num-cpus 1 --port 6399 --include-dashboard false --object-store-memory 300000000 >/dev/null 2>&1
ray start --address 127.0.0.1:6399 --num-cpus 1 --object-store-memory 300000000 >/dev/null 2>&1
run() {  # $1: out name, $2: replicas, $3: max replicas
  dyncomplete serve --ray 127.0.0.1:6399 --replicas $2 --max-replicas $3 --port 8200 > serve-$1.log 2>&1 &
  SERVE=$!
  until curl -s localhost:8200/health | grep -q "\"RUNNING\":$2"; do sleep 2; done
  ( start=$(date +%s); while true; do echo "$(( $(date +%s) - start )) $(curl -s localhost:8200/health)"; sleep 2; done ) > health-$1.log 2>&1 &
  POLL=$!
  dyncomplete bench-session --model qwen2.5-coder-0.5b --url http://127.0.0.1:8200 --client llama-vim --pattern down \
    --lines 10 --source $SRC --concurrent 4 --out $1.json > $1.txt 2>&1
  kill $POLL
  kill $SERVE; wait $SERVE
}
run c4-fixed-1 1 1
run c4-autoscale-1-2 1 2
run c4-fixed-2 2 2
ray stop >/dev/null 2>&1
