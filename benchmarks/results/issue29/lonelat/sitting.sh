#!/bin/bash
# Issue 29, helper lonelat's sitting: main (0c44dc0, git archive in /tmp/lonelat-main) against
# this branch, both with etcd+grpc://, unpinned; then the probe of each (1 and 3
# replicas). Run from the branch's worktree through /work/bin/quiet-run.
set -euo pipefail
out=benchmarks/results/issue29/lonelat
date -u +"start %H:%M:%S UTC"
.venv/bin/python -m benchmarks.group_latency --rounds 2 --duration 8 \
    --roots main=/tmp/lonelat-main,lonelat=/work/wt/lonelat --grpc main,lonelat \
    --json "$out/sitting.json" 2>&1 | tee "$out/sitting.log"
# The probe (benchmarks/group_probe.py, copied into the main archive: it only wraps, so the
# serving replica of each side runs that side's code), main then this branch.
LOCKBENCH_SERVER_ROOT=/tmp/lonelat-main .venv/bin/python -m benchmarks.group_probe \
    --replicas 1,3 --duration 6 --grpc --json "$out/probe-main.json" 2>&1 | tee "$out/probe-main.log"
.venv/bin/python -m benchmarks.group_probe --replicas 1,3 --duration 6 --grpc \
    --json "$out/probe-lonelat.json" 2>&1 | tee "$out/probe-lonelat.log"
date -u +"end %H:%M:%S UTC"
