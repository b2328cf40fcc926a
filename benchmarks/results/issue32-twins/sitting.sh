#!/bin/bash
# twins sitting (issue 32, item 3: Engine.clear_changes, the wait queue's pass clears the
# changed variables in place instead of taking a new set). The pass runs once per request while
# something is parked, so this measures that path in process: door acquire+release pairs while
# 1,000 transactions wait on a variable the pairs never touch (benchmarks.engine_micro
# parked_rounds), and the door's plain acquire/release beside it (door_rounds: no waiter, a
# control). before = 41e956e (the branch before the change), after = e77fc50, pure builds,
# trees made with git archive. Each round runs both sides pinned to CPU 0 (taskset -c 0,
# nothing else of ours on CPU 1) and then both unpinned; the sides interleaved, the order
# alternating per round. Run through /work/bin/quiet-run.
PY=/work/wt/twins/.venv/bin/python
BP=/tmp/twins-before; AP=/tmp/twins-after
run() { # tree label layout
  if [ "$3" = pinned ]; then pin="taskset -c 0"; else pin=""; fi
  (cd $1 && PYTHONPATH=$1 $pin $PY -c "
import lockserver, statistics as st
from benchmarks import engine_micro as m
assert lockserver.__file__.startswith('$1'), lockserver.__file__
from lockserver.engine import _waiting
build = 'compiled' if _waiting.__file__.endswith('.so') else 'pure'
pairs = m.parked_rounds(10_000, 5, 1_000)
acq, rel = m.door_rounds(40_000, 3)
print(f'$2 {build} $3 parked-1000 pairs/s median {st.median(pairs):9,.0f} (min {min(pairs):,.0f} max {max(pairs):,.0f})'
      f' | door acquire {st.median(acq):9,.0f}/s release {st.median(rel):9,.0f}/s', flush=True)
")
}
echo "=== sitting start $(date -u +%FT%TZ), load: $(cat /proc/loadavg)"
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="B A"; else order="A B"; fi
  for layout in pinned unpinned; do
    for side in $order; do
      if [ $side = B ]; then run $BP before $layout; else run $AP after $layout; fi
    done
  done
done
echo "=== sitting end $(date -u +%FT%TZ), load: $(cat /proc/loadavg)"
