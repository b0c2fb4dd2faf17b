# Four editors alone, the build before (6ac1f11) and this one in turn: new, old, old, new. The old
# build runs from a worktree on PYTHONPATH (its server inherits it):
#   git worktree add --detach /tmp/wt_old 6ac1f11
S=/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages
for tag in new-1 old-1 old-2 new-2; do
  if [ "${tag%%-*}" = old ]; then export PYTHONPATH=/tmp/wt_old; else unset PYTHONPATH; fi
  dyncomplete bench-session --model qwen2.5-coder-0.5b --client llama-vim --pattern down --source $S/click/core.py $S/httpx/_client.py $S/rich/console.py $S/requests/models.py --lines 30 --concurrent 4 --keystroke-ms 200 --server dyncomplete '--dyncomplete-args=--parallel 4' --out runs/s70/nice-$tag.json
done
