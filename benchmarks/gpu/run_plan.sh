#!/usr/bin/env bash
# ON the GPU machine, from the repository root: install what this call carried, then run PLAN
# within the command's 10 minutes (benchmarks/gpu.md):
#     bash benchmarks/gpu/run_plan.sh first [DEADLINE_S]
# Results (plan_PLAN.json, the record files, logs.tar.gz) go to $OUT, the device tool's return folder.
set -uo pipefail
plan=${1:?usage: run_plan.sh PLAN [DEADLINE_S]}
begin=$SECONDS
bash benchmarks/gpu/install.sh || exit 1
STASH=${GPU_STASH:-/root/stash}
export PYTHONPATH=${GPU_SITE:-/root/site} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAPTB_TOKENIZER=$STASH/tok RAPTB_COMMIT=$(cat "$STASH/tok/COMMIT" 2>/dev/null)
deadline=${2:-$((580 - (SECONDS - begin)))}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benchmarks/gpu/driver.py --plan "$plan" --deadline "$deadline" --out "${OUT:?}" \
  --work /root/work
