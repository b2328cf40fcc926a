#!/bin/bash
# issue 30 sitting: fairness attacks and the throughput check, before (main) vs after, interleaved.
set -u
cd /work/wt/fair
OUT=/work/wt/fair/benchmarks/results/issue30
BEFORE=/tmp/fair-before
PY=.venv/bin/python
date -u +"start %F %T UTC" | tee $OUT/sitting.log
for layout in pinned unpinned; do
  pin=""; [ $layout = pinned ] && pin="--pin"
  for round in 1 2; do
    LOCKBENCH_SERVER_ROOT=$BEFORE $PY -m benchmarks.fairness $pin --json $OUT/fairness-before-$layout-$round.json >>$OUT/sitting.log 2>&1
    $PY -m benchmarks.fairness $pin --json $OUT/fairness-after-$layout-$round.json >>$OUT/sitting.log 2>&1
  done
done
date -u +"fairness done %F %T UTC" | tee -a $OUT/sitting.log
for round in 1 2 3; do
  $PY -m benchmarks.cload --pin --shape c64,pipelined --server-root $BEFORE --build pure --json $OUT/cload-before-$round.json >>$OUT/sitting.log 2>&1
  $PY -m benchmarks.cload --pin --shape c64,pipelined --build pure --json $OUT/cload-after-$round.json >>$OUT/sitting.log 2>&1
done
date -u +"end %F %T UTC" | tee -a $OUT/sitting.log
