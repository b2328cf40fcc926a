#!/bin/bash
# Issue 29, seventh session (2026-11-28): PING ACKs with the next request (after it).
# before = e11a2ee (main at the last stop), after = this session's tree (pure Python),
# after-compiled = the same tree with its hot modules compiled (scripts/mypyc_build.py).
# Each a `git archive` in /tmp. Run through /work/bin/quiet-run.
set -u
cd /work/main
out=benchmarks/results/issue29/seventh
date -u +"start %H:%M:%S"
.venv/bin/python -m benchmarks.group_latency --rounds 2 --duration 10 \
  --roots before=/tmp/s7-before,after=/tmp/s7-after,after-compiled=/tmp/s7-compiled \
  --snapshot-every 1500 --json $out/latency.json > $out/latency.txt 2>&1
date -u +"end %H:%M:%S"
