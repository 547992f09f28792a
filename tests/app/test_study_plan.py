"""``raptb study``: study files, planning and validation, run-directory states, the shipped files.

(Ports the planning assertions of the former benchmarks/expr24_grid.py tests to the study of
the Expr24 main table.)
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.app.configuration.config import TrainConfig, build_config
from raptb.app.run_dir.run_config import save_config
from raptb.app.run_dir.run_lock import run_lock
from raptb.app.run_dir.run_log import read_log
from raptb.app.study.command import write_report
from raptb.app.study.plan import PlannedRun, plan_study, select_runs
from raptb.app.study.plots import curve_points, trailing_mean
from raptb.app.study.run import RunTask, StudyRunner, eval_args, train_args
from raptb.app.study.spec import StudyError, flatten, load_study
from raptb.app.study.state import PLANNED_CONFIG, run_state

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "studies"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def plan(path: Path):
    return plan_study(load_study(path), str(path))


def test_expr24_main_lists_the_grids_42_runs_in_the_papers_order():
    runs = plan(STUDIES / "expr24_main.toml")
    assert len(runs) == 42
    cells = list(dict.fromkeys((r.values["replay.kind"], r.values["loss"]) for r in runs))
    assert cells[:3] == [("prt", "tb"), ("prt", "subtb"), ("prt", "raptb")]
    assert cells[3:8] == [
        ("rp", "tb"),
        ("rp", "subtb"),
        ("rp", "raptb"),
        ("rp", "avg_prefix_tb"),
        ("rp", "root_subtb_logz"),
    ]
    assert cells[-1] == ("oracle", "raptb")
    assert [r.name for r in runs[:3]] == ["prt-tb-s0", "prt-tb-s1", "prt-tb-s2"]
    assert "rp-root_subtb_logz-s2" in {r.name for r in runs}
    assert {(r.config.steps, r.config.task) for r in runs} == {(800, "expr24")}
    assert runs[4].config.loss == "subtb" and runs[4].config.replay.kind == "prt"


def test_only_selects_cells_and_rejects_unknown():
    runs = plan(STUDIES / "expr24_main.toml")
    chosen = select_runs(runs, ["loss=raptb,replay.kind=subm", "loss=tb,replay.kind=rp,seed=0"])
    assert [r.name for r in chosen] == [
        "rp-tb-s0",
        "subm-raptb-s0",
        "subm-raptb-s1",
        "subm-raptb-s2",
    ]
    oracle = select_runs(runs, ["replay.kind=oracle,seed=0"])
    assert [r.values["loss"] for r in oracle] == ["tb", "subtb", "raptb"]
    for bad in ("loss=avg_prefix_tb,replay.kind=subm", "tb-rp", "seed=a"):
        with pytest.raises(StudyError, match="--only"):
            select_runs(runs, [bad])


def test_only_selects_a_row_whose_name_holds_commas():
    runs = plan(STUDIES / "horizon_5000_ips_flowrl.toml")
    chosen = select_runs(runs, ["row=FlowRL, 5,000 steps", "row=IPS-GRPO, 5,000 steps,seed=0"])
    assert [r.name for r in chosen if r.row.startswith("FlowRL")] == [
        r.name for r in runs if r.row == "FlowRL, 5,000 steps"
    ]
    assert len(chosen) == 6
    assert [r.seed for r in chosen if r.row.startswith("IPS")] == [0]


def test_rows_extra_cells_and_both_spellings_of_a_dotted_path(tmp_path):
    write(tmp_path / "base.toml", "steps = 3\n[optim]\nbatch_size = 4\n")
    path = write(
        tmp_path / "s.toml",
        'base_config = "base.toml"\nseeds = [1, 2]\n[base]\noptim.grad_accum = 1\n'
        '[axes]\nobjective.beta = [1.0, 5.0]\n"replay.kind" = ["rp"]\n'
        '[rows]\nplain = {}\n"no detach" = { objective = { detach_pterm = false } }\n'
        '[[extra_cells]]\n"objective.beta" = 2.0\n"replay.kind" = "rp"\n'
        '[table]\nrows = ["objective.beta", "row"]\ncolumns = ["replay.kind"]\n',
    )
    runs = plan(path)
    assert len(runs) == 3 * 2 * 2
    assert runs[0].name == "beta1.0-rp-plain-s1"
    assert [r.values["objective.beta"] for r in runs[::4]] == [1.0, 5.0, 2.0]
    detached = {r.row: r.config.objective.detach_pterm for r in runs}
    assert detached == {"plain": True, "no detach": False}
    assert {
        (r.config.steps, r.config.optim.batch_size, r.config.optim.grad_accum) for r in runs
    } == {(3, 4, 1)}
    assert [r.seed for r in runs[:2]] == [1, 2] and runs[1].config.seed == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '[axes]\n"objective.betta" = [1.0]\n',
            "s.toml: axes.objective.betta: invalid config: "
            "unknown key objective.betta (did you mean objective.beta?)",
        ),
        ('[axes]\nloss = ["tb", "nope"]\n', "s.toml: axes.loss: invalid config: loss:"),
        ('[rows]\nx = { "optim.lr" = -1.0 }\n', "s.toml: rows.x: invalid config: optim.lr:"),
        ("[base]\nsteps = 0\n", "s.toml: base: invalid config: steps:"),
        ('[axes]\nloss = ["tb"]\n[rows]\nx = { loss = "raptb" }\n', "rows.x: sets the axis loss"),
        ("[rows]\nx = { seed = 3 }\n", "rows.x: set seeds with 'seeds'"),
        ('[axes]\nloss = ["tb"]\n[table]\nrows = ["lss"]\n', "table: 'lss' is not an axis"),
        ("[axes]\nloss = []\n", "axes.loss: needs at least one value"),
        ("seeds = []\n", "seeds:"),
        ('[[extra_cells]]\nloss = "tb"\n', "extra_cells[0]: must set exactly the axes"),
        ('colour = "red"\n', "s.toml: colour: Extra inputs are not permitted"),
        ("seeds = [\n", "s.toml: not valid TOML"),
    ],
)
def test_bad_study_is_one_line_naming_file_and_field(tmp_path, body, message):
    path = write(tmp_path / "s.toml", body)
    with pytest.raises(StudyError) as caught:
        plan(path)
    text = str(caught.value)
    assert "\n" not in text and message in text and str(path) in text


def test_cli_bad_study_exits_2_with_one_line(tmp_path):
    path = write(tmp_path / "s.toml", '[axes]\n"replay.knd" = ["rp"]\n')
    result = CliRunner().invoke(app, ["study", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert "replay.knd" in result.output and str(path) in result.output.replace("\n", "")
    missing = CliRunner().invoke(app, ["study", str(tmp_path / "none.toml")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def fake_run_dir(path: Path, config: TrainConfig, *, checkpoint: int) -> None:
    path.mkdir(parents=True)
    save_config(config.model_copy(update={"threads": 1}), path / "config.toml")
    (path / "checkpoints" / f"step-{checkpoint:06d}" / "model").mkdir(parents=True)


def test_run_states_resume_eval_done_and_conflicts(tmp_path):
    config = build_config(None, {"loss": "tb", "replay.kind": "rp", "steps": 10})
    assert run_state(config, tmp_path / "none", 32, 0, resume=False).action == "train"

    fake_run_dir(tmp_path / "partial", config, checkpoint=4)
    state = run_state(config, tmp_path / "partial", 32, 0, resume=True)
    assert (state.action, state.step) == ("resume", 4)
    assert run_state(config, tmp_path / "partial", 32, 0, resume=False).action == "restart"
    task = RunTask(None, tmp_path / "partial", state, 32, 0)  # type: ignore[arg-type]
    command = train_args(task, 1)
    assert command[:4] == ["train", "--resume", "--out", str(tmp_path / "partial")]
    assert command[-3:] == ["--threads", "1", "--no-progress"]

    fake_run_dir(tmp_path / "trained", config, checkpoint=10)
    assert run_state(config, tmp_path / "trained", 32, 0, resume=False).action == "eval"
    (tmp_path / "trained" / "eval").mkdir()
    metrics = {"n_samples": 32, "eval": {"step": 10, "seed": 0}}
    (tmp_path / "trained" / "eval" / "metrics.json").write_text(json.dumps(metrics))
    assert run_state(config, tmp_path / "trained", 32, 0, resume=False).action == "done"
    # other N or eval seed: evaluate again without retraining; other config: refuse to touch it
    assert run_state(config, tmp_path / "trained", 64, 0, resume=False).action == "eval"
    assert run_state(config, tmp_path / "trained", 32, 1, resume=False).action == "eval"
    longer = config.model_copy(update={"steps": 20})
    conflict = run_state(longer, tmp_path / "trained", 32, 0, resume=False)
    assert conflict.action == "conflict" and "steps = 10, planned 20" in conflict.reason
    other = build_config(None, {"loss": "raptb", "replay.kind": "rp", "steps": 10})
    assert run_state(other, tmp_path / "trained", 32, 0, resume=False).action == "conflict"


def test_a_locked_run_is_never_cleared_and_an_interrupted_start_is_restarted(tmp_path):
    config = build_config(None, {"loss": "tb", "replay.kind": "rp", "steps": 10})
    fake_run_dir(tmp_path / "busy", config, checkpoint=4)
    with run_lock(tmp_path / "busy", print):  # a trainer of a killed study, still running
        state = run_state(config, tmp_path / "busy", 32, 0, resume=False)
        assert state.action == "conflict"
        assert f"is being written by pid {os.getpid()}" in state.reason
    assert run_state(config, tmp_path / "busy", 32, 0, resume=False).action == "restart"

    # checkpoints but no config.toml: the study wrote its planned config, the trainer was
    # stopped before writing config.toml
    fake_run_dir(tmp_path / "torn", config, checkpoint=4)
    (tmp_path / "torn" / "config.toml").unlink()
    assert run_state(config, tmp_path / "torn", 32, 0, resume=True).action == "conflict"
    save_config(config, tmp_path / "torn" / PLANNED_CONFIG)
    assert run_state(config, tmp_path / "torn", 32, 0, resume=True).action == "train"
    other = build_config(None, {"loss": "raptb", "replay.kind": "rp", "steps": 10})
    assert run_state(other, tmp_path / "torn", 32, 0, resume=True).action == "conflict"


def _config_paths(study: Path) -> set[str]:
    data = tomllib.loads(study.read_text(encoding="utf-8"))
    paths = set(flatten(data.get("base", {}))) | set(flatten(data.get("axes", {})))
    for overrides in data.get("rows", {}).values():
        paths |= set(flatten(overrides))
    return paths


def _known(path: str) -> bool:
    model: type = TrainConfig
    for part in path.split("."):
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return False
        model = field.annotation
    return True


@pytest.mark.parametrize("study", sorted(STUDIES.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_studies_plan(study):
    assert {p for p in _config_paths(study) if not _known(p)} == set()
    runs = plan(study)
    spec = load_study(study)
    # one row over two seeds: the bfloat16 row beside pretrained_smiles.toml's float32 one, the
    # mode bonus's unseen seeds
    least = 2 if study.name in ("pretrained_smiles_bf16.toml", "mode_bonus_unseen.toml") else 3
    assert len(runs) >= least and len({r.name for r in runs}) == len(runs)
    # the paper's tables over three seeds; the default-model choice and the logZ starts over five;
    # the quickstart one; the screens over the two seeds they were run with; the replay share over
    # five, five more seeds (5-9) of the default and a larger share, a larger buffer over five;
    # the RL methods' knob screen over two, their comparison over five, two unseen seeds and
    # G²RPO's 5-9, IPS-GRPO's and FlowRL's screen over two and comparison over five; the paper's
    # horizon over five, its settings' screens over two, a larger buffer and G²RPO, IPS-GRPO and
    # FlowRL there over five; the pretrained model's comparison over two; the mode bonus's screens
    # over two, three more seeds of its chosen weight (2-4) and two unseen ones
    want = {
        "quickstart.toml": {0},
        "default_model.toml": {0, 1, 2, 3, 4},
        "default_replay.toml": {0, 1, 2, 3, 4},
        "log_z_regimes.toml": {0, 1, 2, 3, 4},
        "default_screen.toml": {0, 1},
        "default_seeds.toml": {5, 6, 7, 8, 9},
        "default_capacity.toml": {0, 1},
        "default_capacity_replay.toml": {0, 1, 2, 3, 4},
        "diversity_zoo_screen.toml": {0, 1},
        "diversity_zoo.toml": {0, 1, 2, 3, 4},
        "diversity_zoo_unseen.toml": {13, 14},
        "diversity_zoo_g2rpo.toml": {5, 6, 7, 8, 9},
        "diversity_zoo_passk.toml": {5, 6, 7, 8, 9},
        "diversity_zoo_ips_flowrl_screen.toml": {0, 1},
        "diversity_zoo_ips_flowrl.toml": {0, 1, 2, 3, 4},
        "horizon_5000.toml": {0, 1, 2, 3, 4},
        "horizon_5000_frontier.toml": {0, 1},
        "horizon_5000_capacity.toml": {0, 1, 2, 3, 4},
        "horizon_frontier_more.toml": {0, 1},
        "horizon_5000_g2rpo.toml": {0, 1, 2, 3, 4},
        "horizon_5000_ips_flowrl.toml": {0, 1, 2, 3, 4},
        "horizon_10000_capacity.toml": {0, 1, 2, 3, 4},
        "pretrained_smiles.toml": {0, 1},
        "pretrained_smiles_bf16.toml": {0, 1},
        "mode_bonus_screen.toml": {0, 1},
        "mode_bonus_5000.toml": {0, 1},
        "mode_bonus_schedule.toml": {0, 1},
        "mode_bonus_seeds.toml": {2, 3, 4},
        "mode_bonus_unseen.toml": {13, 14},
    }.get(study.name)
    assert {r.seed for r in runs} == set(spec.seeds) == (want or {0, 1, 2})
    result = CliRunner().invoke(app, ["study", str(study), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"{len(runs)} runs" in result.output


@pytest.mark.parametrize(
    ("study", "task", "steps"),
    [
        ("commongen_main.toml", "commongen", {"TB": 2500, "SubTB": 2500, "RapTB": 2500}),
        ("amp_main.toml", "amp", {"TB": 10000, "SubTB": 10000, "RapTB": 5000}),
    ],
)
def test_text_task_main_tables_plan_the_papers_rows(study, task, steps):
    runs = plan(STUDIES / study)
    assert len(runs) == 12
    rows = list(dict.fromkeys(r.row for r in runs))
    assert rows == ["TB", "SubTB", "RapTB", "RapTB+SubM"]
    by_row = {r.row: r.config for r in runs if r.seed == 0}
    assert {r.config.task for r in runs} == {task}
    for row, config in by_row.items():
        want_loss = {"TB": "tb", "SubTB": "subtb"}.get(row, "raptb")
        assert config.loss == want_loss
        assert config.replay.kind == ("subm" if row == "RapTB+SubM" else "rp")
        assert config.steps == steps.get(row, 3000 if task == "amp" else 2500)
    # the task's preset (the paper's column) reaches every run
    assert {r.config.reward.kappa for r in runs} == {1.0}


def test_exact_evaluation_is_part_of_done_when_the_study_asks_for_it(tmp_path):
    config = build_config(None, {"loss": "tb", "replay.kind": "rp", "steps": 10})
    fake_run_dir(tmp_path / "run", config, checkpoint=10)
    (tmp_path / "run" / "eval").mkdir()
    metrics = {"n_samples": 32, "eval": {"step": 10, "seed": 0}}
    (tmp_path / "run" / "eval" / "metrics.json").write_text(json.dumps(metrics))
    assert run_state(config, tmp_path / "run", 32, 0, resume=False).action == "done"
    assert run_state(config, tmp_path / "run", 32, 0, resume=False, exact=True).action == "eval"
    exact = tmp_path / "run" / "eval" / "exact.json"
    exact.write_text(json.dumps({"acc": 0.5, "eval": {"step": 4}}))  # an older checkpoint's
    assert run_state(config, tmp_path / "run", 32, 0, resume=False, exact=True).action == "eval"
    exact.write_text(json.dumps({"acc": 0.5, "eval": {"step": 10}}))
    assert run_state(config, tmp_path / "run", 32, 0, resume=False, exact=True).action == "done"


def test_the_runner_runs_the_exact_evaluation_after_the_sampled_one(tmp_path):
    config = build_config(None, {"loss": "tb", "replay.kind": "rp", "steps": 10})
    fake_run_dir(tmp_path / "run", config, checkpoint=10)
    calls: list[list[str]] = []

    def child(task, phase, args):  # stands for the raptb children: records, writes their files
        calls.append(args)
        (task.run_dir / "eval").mkdir(exist_ok=True)
        name = "exact.json" if "--exact" in args else "metrics.json"
        (task.run_dir / "eval" / name).write_text("{}")
        return 0, 1.0

    runner = StudyRunner(1, Console(), progress=False)
    runner._child = child  # type: ignore[method-assign]
    state = run_state(config, tmp_path / "run", 32, 0, resume=False, exact=True)
    task = RunTask(None, tmp_path / "run", state, 32, 0, exact=True)  # type: ignore[arg-type]
    assert runner.execute_one(task) is None
    assert calls == [eval_args(task), ["eval", str(tmp_path / "run"), "--exact", "--json"]]
    calls.clear()
    (tmp_path / "run" / "eval" / "exact.json").unlink()
    assert runner.execute_one(replace(task, exact=False)) is None
    assert calls == [eval_args(task)]


def _finished_run(runs: Path, name: str, acc: float, distinct: float, records: list[dict]) -> None:
    (runs / name / "eval").mkdir(parents=True)
    metrics = {"acc": acc, "n_samples": 64, "eval": {"step": 3}}
    (runs / name / "eval" / "metrics.json").write_text(json.dumps(metrics))
    exact = {"acc": acc + 0.01, "expected_distinct": {"64": distinct}, "eval": {"step": 3}}
    (runs / name / "eval" / "exact.json").write_text(json.dumps(exact))
    lines = "".join(json.dumps(r) + "\n" for r in records) + "torn {\n"
    (runs / name / "metrics.jsonl").write_text(lines)


def test_report_reads_exact_metrics_and_draws_training_curves(tmp_path):
    path = write(
        tmp_path / "s.toml",
        """
[axes]
loss = ["tb", "raptb"]
[eval]
exact = true
[table]
metrics = [
    { key = "acc", name = "Acc" },
    { key = "exact.acc", name = "exact Acc", decimals = 2 },
    { key = "exact.expected_distinct.64", name = "E distinct", decimals = 1 },
]
plots = ["exact.acc"]
curves = [{ x = "unique_correct", y = "acc", window = 2 }]
""",
    )
    spec = load_study(path)
    runs = plan_study(spec, str(path))
    out = tmp_path / "out"
    records = [{"step": s, "acc": a, "unique_correct": u} for s, a, u in [(1, 0.0, 0), (2, 1.0, 3)]]
    _finished_run(out / "runs", "tb-s0", 0.9, 12.5, records)
    _finished_run(out / "runs", "raptb-s0", 0.4, 40.25, records)
    assert write_report(spec, runs, out, "raptb study s.toml") == (2, 0)
    table = (out / "table.md").read_text()
    assert "| exact Acc | E distinct |" in table
    assert "| 0.91 | 12.5 |" in table and "| 0.41 | 40.2 |" in table
    assert "![acc against unique_correct](curve_acc_unique_correct.png)" in table
    assert (out / "curve_acc_unique_correct.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "exact_acc.png").is_file()
    # the curve: y's trailing mean over 2 records against x, the torn line skipped
    points = curve_points(read_log(out / "runs" / "tb-s0" / "metrics.jsonl"), spec.table.curves[0])
    assert points[0].tolist() == [0.0, 3.0] and points[1].tolist() == [0.0, 0.5]
    with pytest.raises(StudyError, match="needs exact = true"):
        load_study(write(tmp_path / "t.toml", '[table]\nmetrics = [{ key = "exact.acc" }]\n'))


@given(st.lists(st.floats(-1e3, 1e3), max_size=30), st.integers(1, 8))
def test_trailing_mean_matches_a_direct_loop(values, window):
    expected = [
        sum(values[max(0, i + 1 - window) : i + 1]) / len(values[max(0, i + 1 - window) : i + 1])
        for i in range(len(values))
    ]
    assert trailing_mean(values, window) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    ("configured", "share", "expected"),
    [(None, 2, 2), (None, 1, 1), (1, 2, 1), (4, 2, 2), (2, 8, 2), (3, 1, 1)],
)
def test_run_threads_is_the_share_or_the_runs_own_when_fewer(configured, share, expected):
    from raptb.app.study.run import run_threads

    assert run_threads(configured, share) == expected


def test_a_tiny_model_run_keeps_its_one_thread_when_the_study_could_give_it_more(tmp_path):
    tiny = build_config(None, {"loss": "tb", "replay.kind": "rp", "steps": 10})
    assert tiny.threads == 1  # the embedded model's preset
    runner = StudyRunner(1, Console(), progress=False)
    runner.threads = 2  # one worker on two cores
    state = run_state(tiny, tmp_path / "run", 32, 0, resume=False)

    def task(config: TrainConfig) -> RunTask:
        run = PlannedRun("run", {}, None, 0, config, {})
        return RunTask(run, tmp_path / "run", state, 32, 0)

    assert runner.threads_of(task(tiny)) == 1
    assert train_args(task(tiny), 1)[-3:] == ["--threads", "1", "--no-progress"]
    assert runner.threads_of(task(tiny.model_copy(update={"threads": None}))) == 2
