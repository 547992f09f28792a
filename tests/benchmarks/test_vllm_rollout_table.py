"""benchmarks/vllm_rollout.py --table: the two paths' medians side by side, eager's over vLLM's."""

from __future__ import annotations

from tests.benchmarks import load_script


def test_the_table_pairs_the_paths_of_one_setting():
    script = load_script("vllm_rollout")
    records = [
        {"task": "expr24", "rows": 32, "threads": 1, "decode": "eager", "ms_per_rollout": 2500.0},
        {"task": "expr24", "rows": 32, "threads": 1, "decode": "vllm", "ms_per_rollout": 2000.0},
        {"task": "expr24", "rows": 32, "threads": 2, "decode": "eager", "ms_per_rollout": 1800.0},
        {
            "task": "smiles",
            "rows": 32,
            "threads": 1,
            "dtype": "bfloat16",
            "decode": "eager",
            "ms_per_rollout": 3000.0,
        },
    ]
    lines = script.table(records).splitlines()
    assert lines[2] == "| expr24 | 32 | 1 | float32 | 2,500 | 2,000 | 1.25 |"
    assert len(lines) == 3  # a setting with one path only has no row
