"""``report_to``: TensorBoard event files and W&B offline runs read back and compared with
metrics.jsonl and eval/metrics.json, a resumed run logging each step once, one writer on two
ranks, and a missing package as a one-line error naming the extra."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raptb.app.configuration.config import ConfigError, build_config
from tests.app.distributed_worker import cli, run_ranks
from tests.app.test_crash_safety import run_main

FAST = ["--batch-size", "8", "--grad-accum", "1", "--threads", "1", "--no-progress"]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_train(run: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value for every number of every metrics.jsonl line."""
    out: dict[str, dict[int, float]] = {}
    for record in jsonl(run / "metrics.jsonl"):
        for key, value in record.items():
            if key != "step" and value is not None:
                out.setdefault(f"train/{key}", {})[record["step"]] = float(value)
    return out


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard shows them (purged steps hidden)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_tensorboard_holds_every_logged_number_once_after_a_resume_and_the_eval(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    train = ["train", "--report-to", "tensorboard", "--checkpoint-every", "2", *FAST]
    cli(*train, "--steps", "3", "--out", str(run))
    # killed after step 3 was logged but before its checkpoint: the resume redoes step 3
    shutil.rmtree(run / "checkpoints" / "step-000003")
    cli(*train, "--steps", "4", "--out", str(run), "--resume")
    cli("eval", str(run), "--samples", "8", "--json")

    shown = tensorboard_scalars(run)
    expected = expected_train(run)
    assert set(expected) <= set(shown)
    for tag, by_step in expected.items():
        steps = [step for step, _ in shown[tag]]
        assert steps == sorted(by_step), tag  # each logged step once, a null step left out
        for step, value in shown[tag]:
            assert value == np.float32(by_step[step]), (tag, step)  # TensorBoard keeps float32
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    assert {"acc", "n_samples", "entropy"} <= set(numbers)
    for key, value in numbers.items():
        assert shown[f"eval/{key}"] == [(4, np.float32(value))], key
    for length, value in metrics["count_by_length"].items():
        assert shown[f"eval/count_by_length/{length}"] == [(4, np.float32(value))]


def wandb_history(path: Path) -> list[dict[str, Any]]:
    """The history rows of a W&B run file (a LevelDB-style log of protobuf records: a 7-byte
    header, then 32 KiB blocks of chunks, each with a 7-byte header: crc, length, kind)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:
            pos += left  # a block's tail too short for a header is padding
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (2, 3):  # first, middle
            pending += chunk
            continue
        if kind not in (1, 4):  # full, last
            break
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending + chunk)
        pending = b""
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def test_wandb_runs_offline_in_the_run_directory_and_resume_continues_its_run(
    tmp_path, monkeypatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    train = ["train", "--report-to", "wandb", "--checkpoint-every", "1", *FAST, "--out", str(run)]
    cli(*train, "--steps", "2")
    cli(*train, "--steps", "3", "--resume")
    cli("eval", str(run), "--samples", "8", "--json")

    run_id = (run / "wandb" / "run-id").read_text().strip()
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert [p.name.rsplit("-", 1)[1] for p in offline] == [run_id] * 3  # train, resume, eval
    rows = [row for p in offline for row in wandb_history(p / f"run-{run_id}.wandb")]
    logged: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if not key.startswith("_") and value is not None:
                logged.setdefault(key, {})[row["_step"]] = value
    train_tags = {k: v for k, v in logged.items() if k.startswith("train/")}
    assert train_tags == expected_train(run)
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert logged["eval/acc"] == {3: metrics["acc"]}
    assert logged["eval/n_samples"] == {3: metrics["n_samples"]}


def _two_rank_train(out: str) -> None:
    cli("train", "--report-to", "tensorboard", "--steps", "2", "--batch-size", "4", *FAST[2:],
        "--grad-accum", "1", "--out", out)  # fmt: skip


def test_on_two_ranks_one_process_writes_the_events(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    run_ranks(_two_rank_train, str(run))
    assert len(list((run / "tensorboard").iterdir())) == 1
    shown = tensorboard_scalars(run)
    expected = expected_train(run)
    assert {tag: [step for step, _ in shown[tag]] for tag in expected} == {
        tag: [1, 2] for tag in expected
    }


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_tracker_package_is_a_one_line_error_naming_the_extra(
    tmp_path, monkeypatch, capsys, name: str
) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    code, err = run_main(["train", "--report-to", name, "--out", str(tmp_path / "r")], capsys)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("error: invalid config: report_to:")
    assert f"pip install 'raptb[{name}]'" in line
    assert not (tmp_path / "r").exists()


def test_report_to_takes_none_a_name_or_a_list(tmp_path) -> None:
    assert build_config().trackers == ()
    pytest.importorskip("tensorboard")
    file = tmp_path / "c.toml"
    file.write_text('report_to = ["tensorboard", "tensorboard"]\n')
    assert build_config(file).trackers == ("tensorboard",)
    with pytest.raises(ConfigError, match=r"report_to: unknown tracker 'mlflow'"):
        build_config(overrides={"report_to": "mlflow"})
    with pytest.raises(ConfigError, match=r"report_to: unknown tracker 'none'"):
        build_config(overrides={"report_to": ["none", "tensorboard"]})
