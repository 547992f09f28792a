#!/bin/bash
# usage: [RAPTB=path/to/raptb] [OUT=dir] [EXTRA="--threads 2"] bash benchmarks/shared_cores.sh
# two main jobs (default settings, 300 steps, seeds 13 and 14): one after the other, then together
R=${OUT:-/tmp/raptb-shared-cores}; rm -rf $R; mkdir -p $R
job() { ${RAPTB:-raptb} train --task expr24 --loss raptb --replay subm --steps 300 --seed $1 --out $R/$2-s$1 --no-progress $EXTRA > $R/$2-s$1.log 2>&1; }
t0=$(date +%s.%N); job 13 seq; job 14 seq; t1=$(date +%s.%N)
job 13 par & job 14 par & wait; t2=$(date +%s.%N)
python3 -c "
import json
seq=$t1-$t0; par=$t2-$t1
def steps(d): return sum(json.loads(l)['seconds'] for l in open('$R/'+d+'/metrics.jsonl'))
print(f'one after the other: {seq:.1f} s wall (step seconds {steps(\"seq-s13\"):.1f} + {steps(\"seq-s14\"):.1f}); together: {par:.1f} s wall (step seconds {steps(\"par-s13\"):.1f}, {steps(\"par-s14\"):.1f}); ratio together/sequential {par/seq:.2f}')
"
