#!/bin/bash
# lists sitting (issue 30, item 5): listing pages with many one-variable tables, before = main,
# after = branch lists; then the hot path's server CPU per transaction. Pure builds; trees made
# with git archive. The script of the after tree measures both (PYTHONPATH + its own cwd pick
# the tree for the door and for the server subprocess).
PY=$PWD/.venv/bin/python  # run from the checkout (its venv); trees: git archive main | tar -x -C $B, HEAD -> $A
B=/tmp/lists-before; A=/tmp/lists-after
S=$A/benchmarks/inspect_paging.py
run() { # side args...
  local side=$1; shift; local T=$B; [ $side = after ] && T=$A
  (cd $T && PYTHONPATH=$T $PY $S "$@")
}
echo "=== sitting start $(date -u +%FT%TZ), before=$(cat $B/.rev) after=$(cat $A/.rev), load: $(cat /proc/loadavg)"
i=0
for n in 1000 20000 300000; do
  for limit in 100 1000; do
    if [ $((i % 2)) = 0 ]; then order="before after"; else order="after before"; fi; i=$((i+1))
    for side in $order; do run $side --entries $n --shape tables --limit $limit --label "$side n=$n" --skip-server; done
  done
done
for cfg in "1000 100 --pin" "300000 100 --pin" "300000 1000 --pin" "300000 100" "300000 1000"; do
  set -- $cfg
  if [ $((i % 2)) = 0 ]; then order="before after"; else order="after before"; fi; i=$((i+1))
  for side in $order; do run $side --entries $1 --shape tables --limit $2 --label "$side n=$1" --skip-door $3; done
done
echo "=== cpu_ab $(date -u +%FT%TZ), load: $(cat /proc/loadavg)"
($PY -m benchmarks.cpu_ab --rounds 3 --duration 6 before=$B after=$A)
echo "=== sitting end $(date -u +%FT%TZ), load: $(cat /proc/loadavg)"
