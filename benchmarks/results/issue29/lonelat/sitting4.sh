#!/bin/bash
# Issue 29, helper lonelat's fourth sitting: the third's with the order of the sides reversed
# (this branch measured first in each round, main second): is the first side favoured (etcd's
# history grows through a round)? Both etcd+grpc://, unpinned.
set -euo pipefail
out=benchmarks/results/issue29/lonelat
date -u +"start %H:%M:%S UTC"
.venv/bin/python -m benchmarks.group_latency --rounds 2 --duration 8 \
    --roots lonelat=/work/wt/lonelat,main=/tmp/lonelat-main --grpc main,lonelat \
    --json "$out/sitting4.json" 2>&1 | tee "$out/sitting4.log"
date -u +"end %H:%M:%S UTC"
