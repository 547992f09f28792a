#!/usr/bin/env bash
# The README's two commands as a new user runs them: a fresh clone and a new venv, each part of
# the command timed, one row appended to benchmarks/results/fresh_clone/main_job.csv or suite.csv
# of this repository, then the pages written anew from the results (benchmarks/pages.py).
#
#   bash benchmarks/fresh_clone.sh main-job [REV]   # install, train, eval; then eval --exact
#   bash benchmarks/fresh_clone.sh suite [REV]      # CI=true bash .ci/run
#
# REV defaults to HEAD. Run it with nothing else on the machine: the minutes are the point.
set -euo pipefail
what=${1:?usage: fresh_clone.sh main-job|suite [REV]}
rev=${2:-HEAD}
repo=$(cd "$(dirname "$0")/.." && pwd)
results="$repo/benchmarks/results/fresh_clone"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT # the clone and its venv: ~7.6 GB a run
git clone -q "$repo" "$work/raptb"
cd "$work/raptb"
git checkout -q "$rev"
commit=$(git rev-parse --short=7 HEAD)
machine="$(nproc)-core $(lscpu | sed -n 's/^Model name: *//p')"
day=$(date -u +%F)
python -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"

seconds() { # run "$@" in bash, print its wall seconds (integer) to stdout, its output to stderr
  local start end
  start=$(date +%s)
  bash -c "$1" >&2
  end=$(date +%s)
  echo $((end - start))
}

case $what in
main-job)
  command=$(sed -n '/^## Quickstart/,/^## /p' README.md | grep -m1 '^pip install torch')
  total=0
  train=0
  IFS=$'\n' read -r -d '' -a parts < <(echo "$command" | sed 's/ && /\n/g' && printf '\0')
  for part in "${parts[@]}"; do
    took=$(seconds "$part")
    total=$((total + took))
    case $part in raptb\ train*) train=$took ;; esac
  done
  run_dir=$(echo "$command" | sed -n 's/.*raptb eval \([^ ]*\).*/\1/p')
  raptb eval "$run_dir" --exact --json >/dev/null
  read -r acc distinct < <(python - "$run_dir/eval/exact.json" <<'EOF'
import json, sys
metrics = json.load(open(sys.argv[1]))
metrics = metrics.get("metrics", metrics)
print(metrics["acc"], metrics["expected_distinct"]["6400"])
EOF
)
  echo "$day,$commit,\"$machine\",$total,$train,$(printf '%.4f' "$acc"),$(printf '%.1f' "$distinct")" \
    >>"$results/main_job.csv"
  ;;
suite)
  start=$(date +%s)
  status=0
  CI=true bash .ci/run 2>&1 | tee "$work/suite.log" || status=$? # a failed suite is a row too
  total=$(($(date +%s) - start))
  # the suite's summary: the first (the vLLM tests' follows it)
  summary=$(grep -E '^[0-9]+ passed|^=+ .*passed' "$work/suite.log" | head -1)
  passed=$(echo "$summary" | sed -n 's/.*\b\([0-9]\+\) passed.*/\1/p')
  skipped=$(echo "$summary" | sed -n 's/.*\b\([0-9]\+\) skipped.*/\1/p')
  failed=$(echo "$summary" | sed -n 's/.*\b\([0-9]\+\) failed.*/\1/p')
  pytest_s=$(echo "$summary" | sed -n 's/.* in \([0-9.]\+\)s.*/\1/p')
  echo "$day,$commit,\"$machine\",${passed:-0},${skipped:-0},${failed:-0},$(python -c "print(round($total/60, 1))"),$(python -c "print(round(${pytest_s:-0}/60, 1))")" \
    >>"$results/suite.csv"
  ;;
*)
  echo "fresh_clone.sh: unknown '$what'; use main-job or suite" >&2
  exit 2
  ;;
esac
cd "$repo" && python benchmarks/pages.py
echo "appended to $results; the pages are written anew (git diff shows them)"
exit "${status:-0}"
