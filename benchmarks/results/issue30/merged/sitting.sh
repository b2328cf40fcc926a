#!/bin/sh
# issue 30/32 hot-path check: main before this stop's merges vs the merged tree, pure, pinned
cd /work/wt/integ2
for r in 1 2; do
  for side in before after; do
    .venv/bin/python -m benchmarks.cload --pin --shape c64,pipelined --build pure --duration 6 --server-root /tmp/sit-$side --json /tmp/sit32-$side-$r.json 2>&1 | tail -4
  done
done
