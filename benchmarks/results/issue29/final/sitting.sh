#!/bin/bash
# The last sitting of issue 29 (2026-11-28, fifth session): the merged tree against main at
# the session's start (0c44dc0, a git archive in /tmp/s5-before), then the group with and
# without a group secret. Run through /work/bin/quiet-run. (A first run also measured
# 0c44dc0 given etcd+grpc://: its replica 0 was gone once snapshots began, as the 1 MB
# chunk's FlowControlError that stall saw; fixed by grpcall; that root was dropped.)
set -u
cd /work/main
out=benchmarks/results/issue29/final
date -u +"start %H:%M:%S"
.venv/bin/python -m benchmarks.group_latency --rounds 2 --duration 10 \
  --roots before=/tmp/s5-before,after=. \
  --snapshot-every 1500 --json $out/latency.json > $out/latency.txt 2>&1
date -u +"latency done %H:%M:%S"
for i in 0 1 2; do
  for s in plain secret secret plain; do
    [ $s = secret ] && f=--secret || f=
    .venv/bin/python -m benchmarks.replication_bench --systems group --rounds 1 --duration 6 \
      --shapes pipelined,c64 $f --json $out/secret-$i-$s-$RANDOM.json >> $out/secret.txt 2>&1
  done
done
date -u +"end %H:%M:%S"
