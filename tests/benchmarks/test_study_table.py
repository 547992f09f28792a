"""benchmarks/study_table.py: a study's report from runs.csv files written at different times."""

from __future__ import annotations

import csv
import math
import statistics

from scipy import stats

from tests.benchmarks import load_script

STUDY = """title = "t"
seeds = [0, 1, 2]
[base]
task = "expr24"
steps = 3
[rows]
"A" = { loss = "tb" }
"B, with a comma" = { loss = "raptb" }
[eval]
samples = 8
[table]
rows = ["row"]
metrics = [{ key = "acc", name = "Acc", decimals = 3 }]
"""


def write(path, rows):
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["row", "seed", "steps", "acc", "wall_seconds"])
        writer.writerows(rows)
    return path


def test_runs_from_several_files_later_wins_missing_named(tmp_path):
    script = load_script("study_table")
    study = tmp_path / "s.toml"
    study.write_text(STUDY)
    old = write(
        tmp_path / "old.csv", [["A", 0, 3, 0.1, 5], ["A", 1, 3, 0.2, 5], ["A", 2, 3, 0.9, 5]]
    )
    new = write(
        tmp_path / "new.csv",
        [["A", 2, 3, 0.3, 6], ["B, with a comma", 0, 3, 0.5, 6], ["Z", 0, 3, 1.0, 1]],
    )
    results, missing = script.merged_results(study, [old, new])
    got = {(r.run.row, r.run.seed): r.values["acc"] for r in results}
    assert got == {("A", 0): 0.1, ("A", 1): 0.2, ("A", 2): 0.3, ("B, with a comma", 0): 0.5}
    assert len(missing) == 2 and all(name.endswith(("-s1", "-s2")) for name in missing)
    # the table's cell: mean ± t-interval of A's three runs, computed here independently
    values = [0.1, 0.2, 0.3]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(values) / math.sqrt(3)
    out = tmp_path / "out"
    import sys

    argv = sys.argv
    sys.argv = ["study_table.py", str(study), "--runs", str(old), str(new), "--out", str(out)]
    try:
        script.main()
    finally:
        sys.argv = argv
    table = (out / "table.md").read_text()
    assert f"| A | 3 | {statistics.mean(values):.3f} ± {half:.3f} |" in table
    assert "2 missing" in table
    assert len(list(csv.DictReader((out / "runs.csv").open()))) == 4
