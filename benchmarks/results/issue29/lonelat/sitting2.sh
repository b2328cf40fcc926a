#!/bin/bash
# Issue 29, helper lonelat's second sitting: which change cost pipelined and c64 throughput
# in the first? main (0c44dc0), this branch, and two variants of it (git archive of the
# branch, one line changed): "nogather" (an idle replica never pauses its watch) and
# "deflate" (STORED_BELOW = 0: every entry deflated), all with etcd+grpc://, unpinned.
set -euo pipefail
out=benchmarks/results/issue29/lonelat
date -u +"start %H:%M:%S UTC"
.venv/bin/python -m benchmarks.group_latency --rounds 2 --duration 8 \
    --roots main=/tmp/lonelat-main,lonelat=/work/wt/lonelat,nogather=/tmp/lonelat-nogather,deflate=/tmp/lonelat-deflate \
    --grpc main,lonelat,nogather,deflate --json "$out/sitting2.json" 2>&1 | tee "$out/sitting2.log"
date -u +"end %H:%M:%S UTC"
