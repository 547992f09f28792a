#!/bin/bash
# The main job's optimizer step as four micro-batches of 32 rows (the split before 2026-11-26)
# against one of 128 (the embedded model's default since): the same rows and update, timed side
# by side in alternating rounds, 80 steps each at 1 thread, median of the per-step `seconds` of
# metrics.jsonl after 10 warm-up steps. Usage: bash benchmarks/split_speed.sh [OUT_DIR]
out_root=${1:-runs/split_speed}
mkdir -p "$out_root"
for r in 1 2; do
for split in "32 4" "128 1"; do
  set -- $split
  out=$out_root/${1}x${2}_r$r; rm -rf $out
  raptb train --task expr24 --loss raptb --replay subm --steps 80 --threads 1 --seed 0 --optim.batch_size $1 --optim.grad_accum $2 --out $out --no-progress > /dev/null 2>&1
  python -c "
import json,statistics
s=[json.loads(l)['seconds'] for l in open('$out/metrics.jsonl')][10:]
print('$1x$2 round $r: median step', round(statistics.median(s)*1000,1),'ms, mean', round(statistics.fmean(s)*1000,1))"
done; done
