"""The one-line errors of ``raptb train`` for inputs a user mistypes: each says what to do, exits
2, and is held to its exact first line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from raptb.app.cli import app
from raptb.core.did_you_mean import close_match, unknown_choice
from raptb.core.registry import Registry

LOSSES = "tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad, grpo, ppo, dapo, passk, "
LOSSES += "ucpo, g2rpo, ips_grpo, rover, flowrl"


def first_line(*args: str) -> str:
    """The first line ``raptb train ARGS`` prints, which must exit 2."""
    result = CliRunner().invoke(app, ["train", *args, "--no-progress"])
    assert result.exit_code == 2, result.output
    return result.stderr.splitlines()[0]


def config_file_line(tmp_path: Path, text: str) -> str:
    """The first line of ``raptb train --config FILE`` with ``text`` in FILE."""
    config = tmp_path / "run.toml"
    config.write_text(text)
    return first_line("--config", str(config), "--out", str(tmp_path / "run"))


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_out_naming_a_file(tmp_path: Path, resume: list[str]) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    assert first_line("--out", str(file), *resume) == (
        f"error: --out: {file} is a file, not a directory; name a run directory (new or existing)"
    )
    assert file.read_text() == "mine\n"


def test_every_unknown_key_of_a_config_file_with_the_key_meant(tmp_path: Path) -> None:
    text = "sed = 3\n[optim]\nbatchsize = 3\nwhatever = 1\n[replay]\ncapacty = 9\n"
    assert config_file_line(tmp_path, text) == (
        "error: invalid config: unknown keys optim.batchsize (did you mean optim.batch_size?), "
        "optim.whatever, replay.capacty (did you mean replay.capacity?), sed (did you mean "
        "seed?); rename or remove them (raptb config prints every key)"
    )
    assert not (tmp_path / "run").exists()


def test_one_unknown_key_beside_another_error(tmp_path: Path) -> None:
    assert config_file_line(tmp_path, "steps = 0\n[optm]\nlr = 1e-3\n") == (
        "error: invalid config: unknown key optm (did you mean optim?); rename or remove it "
        "(raptb config prints every key) (and 1 other error)"
    )


@pytest.mark.parametrize(
    ("flag", "value", "line"),
    [
        (
            "--loss",
            "grop",
            f"loss: unknown loss 'grop'; did you mean 'grpo'? valid choices: {LOSSES}",
        ),
        ("--loss", "zzz", f"loss: unknown loss 'zzz'; valid choices: {LOSSES}"),
        (
            "--task",
            "expr42",
            "task: unknown task 'expr42'; did you mean 'expr24'? valid choices: amp, commongen, "
            "custom, expr24, smiles",
        ),
        (
            "--replay",
            "sbm",
            "replay.kind: unknown replay kind 'sbm'; did you mean 'subm'? valid choices: none, "
            "rp, prt, subm, oracle",
        ),
    ],
)
def test_a_mistyped_choice_gets_the_one_meant(tmp_path, flag, value, line) -> None:
    out = str(tmp_path / "run")
    got, want = first_line(flag, value, "--out", out), f"error: invalid config: {line}"
    # a plug-in that another test registered in this process is listed after the shipped names
    assert got == want or got.startswith(f"{want}, "), got


def test_resume_of_a_folder_without_a_run_says_to_drop_resume(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert first_line("--resume", "--out", str(empty)) == (
        f"error: --resume: {empty} holds no run to continue ({empty / 'config.toml'} does not "
        "exist); drop --resume to start a new run there"
    )


def test_every_registry_suggests_the_close_name() -> None:
    widgets = Registry("widget", str, ["alpha", "beta"])
    with pytest.raises(ValueError, match=r"^unknown widget 'alpah'; did you mean 'alpha'\? valid"):
        widgets.lookup("alpah")
    assert close_match("gamma", ["alpha", "beta"]) is None
    assert unknown_choice("widget", 3, ["alpha"]) == "unknown widget 3; valid choices: alpha"
