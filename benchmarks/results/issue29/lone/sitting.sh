#!/bin/bash
# Issue 29, sixth session (2026-11-28): a lone acquire applied from its put's answer, and the
# commit poll. before = 8a08d7f (main at the session's start), after = the branch `lone`
# (pure Python), after-compiled = the same tree with its hot modules compiled
# (scripts/mypyc_build.py, as a non-editable `pip install .` does). Each a `git archive` in
# /tmp. Run through /work/bin/quiet-run.
set -u
cd /work/main
out=benchmarks/results/issue29/lone
date -u +"start %H:%M:%S"
.venv/bin/python -m benchmarks.group_latency --rounds 2 --duration 10 \
  --roots before=/tmp/s6-before,after=/tmp/s6-after,after-compiled=/tmp/s6-compiled \
  --snapshot-every 1500 --json $out/latency.json > $out/latency.txt 2>&1
date -u +"end %H:%M:%S"
