#!/bin/bash
# engine sitting (issue 32, item 4: the wait queue's bookkeeping behind engine methods).
# What changed is only reached while something is parked (WaitQueue.process's early exit, per
# request), so this measures that path in process: door acquire+release pairs while 1,000
# transactions wait on a variable the pairs never touch (benchmarks.engine_micro
# parked_rounds), and the door's plain acquire/release beside it (door_rounds: no waiter, a
# control). before = integ, after = branch engine, pure builds (the compiled half was not
# measured: no time left in this session); trees made with git archive; every run pinned to CPU 0 (taskset -c 0), nothing else on
# CPU 1; sides interleaved, the order alternating per round.
PY=/work/wt/engine/.venv/bin/python
BP=/tmp/engine-before-pure; AP=/tmp/engine-after-pure
run() { # tree label
  (cd $1 && PYTHONPATH=$1 taskset -c 0 $PY -c "
import lockserver, statistics as st
from benchmarks import engine_micro as m
assert lockserver.__file__.startswith('$1'), lockserver.__file__
from lockserver.engine import _waiting
build = 'compiled' if _waiting.__file__.endswith('.so') else 'pure'
pairs = m.parked_rounds(10_000, 5, 1_000)
acq, rel = m.door_rounds(40_000, 3)
print(f'$2 {build:8} parked-1000 pairs/s median {st.median(pairs):9,.0f} (min {min(pairs):,.0f} max {max(pairs):,.0f})'
      f' | door acquire {st.median(acq):9,.0f}/s release {st.median(rel):9,.0f}/s', flush=True)
")
}
echo "=== sitting start $(date -u +%FT%TZ), load: $(cat /proc/loadavg)"
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="B A"; else order="A B"; fi
  for side in $order; do
    if [ $side = B ]; then run $BP before; else run $AP after; fi
  done
done
echo "=== sitting end $(date -u +%FT%TZ), load: $(cat /proc/loadavg)"
