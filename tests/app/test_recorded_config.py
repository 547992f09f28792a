"""What config.toml records is what ran, for every component.

Every registered replay kind, loss and task, and a throwaway plug-in of each group (registered
for the test), is built from a run's config.toml as the run builds it (the buffer by
``build_buffer``, the objective by ``build_objective``, the task by its spec from the recorded
section), and each live object's own configuration equals the record. An option nothing sets
(no preset, file or flag) holds the class's own default: a plug-in buffer's ``capacity = 50``,
a plug-in RapTB's ``eta = 0.5``, a plug-in GRPO's ``epsilon = 0.05``, a plug-in task's
``max_length = 3``. An option the buffer kind does not read is refused in one line, exit 2.
"""

from __future__ import annotations

import inspect
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import Field
from typer.testing import CliRunner

from raptb.adapters.tasks.registry import TASKS, TaskOptions, TaskSpec, task_spec
from raptb.app.cli import app
from raptb.app.configuration.buffer_defaults import MIX_OPTIONS, declared
from raptb.app.configuration.config import (
    ConfigError,
    TrainConfig,
    build_config,
    task_presets,
)
from raptb.app.configuration.losses import (
    GFLOWNET_ALGORITHM,
    GRPO_ALGORITHM,
    LOSSES,
    ON_POLICY,
    Loss,
)
from raptb.app.run_dir.run_config import load_config, save_config
from raptb.app.training.gflownet.replay_setup import build_buffer
from raptb.core.gfn.objectives import RapTB
from raptb.core.metrics import sequence_metrics
from raptb.core.ports import Score
from raptb.core.replay import BUFFERS, BufferOption, ReplayBuffer, buffer_class, make_buffer
from raptb.core.rl.grpo import GRPO


class NewestBuffer(ReplayBuffer):
    """A plug-in's buffer: the newest ``capacity`` items per prompt, its own default 50."""

    kind = "newest_recorded"
    options = (BufferOption.of("capacity"),)

    def __init__(self, capacity: int = 50) -> None:
        super().__init__()
        self.capacity = capacity

    def config(self) -> dict[str, Any]:
        return {"capacity": self.capacity}

    def add_to_prompt(self, prompt: str, items: list[Any]) -> None:
        self._stores[prompt] = [*self._stores.get(prompt, []), *items][-self.capacity :]


class BareBuffer(NewestBuffer):
    """A plug-in's buffer that declares no options (it keeps 7)."""

    kind = "bare_recorded"
    options = ()

    def __init__(self) -> None:
        super().__init__(7)


@dataclass(frozen=True)
class EagerRapTB(RapTB):
    name: ClassVar[str] = "eager_recorded"
    eta: float = 0.5


@dataclass(frozen=True)
class TightGRPO(GRPO):
    name: ClassVar[str] = "tight_recorded"
    epsilon: float = 0.05


class ShortOptions(TaskOptions):
    max_length: int = Field(3, ge=1, description="Most generated tokens.")


@dataclass
class ShortTask:
    max_length: int
    name: str = "short_recorded"
    alphabet: str = "ab"
    grammar: None = None
    min_length: int = 1

    def prompts(self) -> list[str]:
        return ["s:"]

    def score(self, prompt: str, text: str) -> Score:
        return Score(text.count("a") / max(len(text), 1), bool(text))


SHORT_TASK = TaskSpec(
    name="short_recorded",
    options=ShortOptions,
    build=lambda options: ShortTask(max_length=options.max_length),
    metrics=lambda task, rows: sequence_metrics(rows, max_depth=task.max_length),
    headline=("acc",),
    subm={"similarity": "jaccard", "shingle_k": 1, "shingle_on": "text"},
)


@pytest.fixture
def plug_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """One throwaway plug-in per group, registered for this test only."""
    for registry, first in ((BUFFERS, "subm"), (LOSSES, "grpo"), (TASKS, "expr24")):
        registry.lookup(first)  # the built-in entries (and installed plug-ins) first
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    BUFFERS.register(NewestBuffer)
    BUFFERS.register(BareBuffer)
    LOSSES.register(Loss("eager_recorded", EagerRapTB, GFLOWNET_ALGORITHM))
    LOSSES.register(
        Loss("tight_recorded", TightGRPO, GRPO_ALGORITHM, "rl", replay=False, presets=ON_POLICY)
    )
    TASKS.register(SHORT_TASK)


def recorded_run(folder: Path, overrides: dict[str, Any]) -> tuple[dict[str, Any], TrainConfig]:
    """The run's config.toml as a mapping, and the configuration read back from it."""
    config = build_config(overrides=overrides)
    save_config(config, folder / "config.toml")
    loaded = load_config(folder / "config.toml")
    assert loaded.model_dump() == config.model_dump()
    return tomllib.loads((folder / "config.toml").read_text()), loaded


def plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def preset_replay(config: TrainConfig, overrides: dict[str, Any]) -> set[str]:
    """``[replay]`` options a preset or an override sets for ``config``'s run."""
    presets = dict(task_presets(config.task).get("replay", {}))
    presets.update(LOSSES.lookup(config.loss).presets.get("replay", {}))
    return set(presets) | {key.removeprefix("replay.") for key in overrides}


def buffer_kinds() -> list[str]:
    return list(BUFFERS)


def test_every_buffer_kind_is_built_as_its_config_toml_records(plug_ins: None, tmp_path: Path):
    kinds = buffer_kinds()
    assert {"rp", "prt", "subm", "oracle", "newest_recorded", "bare_recorded"} <= set(kinds)
    for kind in kinds:
        overrides = {"replay.kind": kind}
        record, config = recorded_run(tmp_path, overrides)
        replay = record["replay"]
        # recorded: the behaviour mix and options the kind reads, nothing it does not read
        assert set(replay) - set(MIX_OPTIONS) <= set(declared(kind)), kind
        cls = buffer_class(kind)
        if cls.oracle:  # its items come from the task (a policy's tokens); it takes no options
            assert make_buffer(kind).config() == {} and not declared(kind)
            continue
        live = build_buffer(config, None, None, None).config()  # type: ignore[arg-type]
        defaults = inspect.signature(cls.__init__).parameters
        chosen = preset_replay(config, overrides)
        for option in cls.options:
            value = replay.get(option.name)  # omitted: None
            want = option.kwargs(value) if value is not None else dict.fromkeys(option.arguments)
            for argument, recorded_value in want.items():
                assert plain(live[argument]) == plain(recorded_value), (kind, argument)
                if option.name not in chosen:  # nothing sets it: the class's own default
                    assert plain(live[argument]) == plain(defaults[argument].default), (
                        kind,
                        argument,
                    )
    newest, _ = recorded_run(tmp_path, {"replay.kind": "newest_recorded"})
    assert newest["replay"]["capacity"] == 50
    # a preset still sets it: CommonGen's capacity 100
    preset, _ = recorded_run(tmp_path, {"replay.kind": "newest_recorded", "task": "commongen"})
    assert preset["replay"]["capacity"] == 100


def own_loss_defaults(cls: type) -> dict[str, Any]:
    """The field defaults a plug-in objective class declares itself: those that differ from the
    nearest raptb class it derives from (raptb's own losses take their sections' defaults)."""
    if cls.__module__.startswith("raptb."):
        return {}
    base = next(b for b in cls.__mro__[1:] if b.__module__.startswith("raptb."))
    inherited = {f.name: f.default for f in fields(base)}
    return {f.name: f.default for f in fields(cls) if inherited.get(f.name) != f.default}


def test_every_loss_is_built_as_its_config_toml_records(plug_ins: None, tmp_path: Path):
    names = list(LOSSES)
    assert {"raptb", "tb", "grpo", "ppo", "eager_recorded", "tight_recorded"} <= set(names)
    for name in names:
        record, config = recorded_run(tmp_path, {"loss": name})
        loss = LOSSES.lookup(name)
        section = record[loss.section]
        objective = config.build_objective()
        for f in fields(objective):
            if f.name not in section:
                continue
            live = getattr(objective, f.name)
            if f.name == "k_min":  # a (start, end) schedule over the run
                live = [live(0), live(config.schedule_horizon)]
            assert plain(live) == plain(section[f.name]), (name, f.name)
        for field_name, own in own_loss_defaults(loss.objective).items():
            assert plain(getattr(objective, field_name)) == plain(own), (name, field_name)
    assert own_loss_defaults(EagerRapTB) == {"eta": 0.5}
    assert own_loss_defaults(TightGRPO) == {"epsilon": 0.05}
    assert recorded_run(tmp_path, {"loss": "eager_recorded"})[0]["objective"]["eta"] == 0.5
    assert recorded_run(tmp_path, {"loss": "tight_recorded"})[0]["rl"]["epsilon"] == 0.05


def test_every_task_is_built_as_its_config_toml_records(
    plug_ins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "recorded_reward.py").write_text("def count_a(prompt, text):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    required = {"custom": {"custom.reward": "recorded_reward:count_a"}}
    names = list(TASKS)
    assert {"expr24", "smiles", "short_recorded"} <= set(names)
    for name in names:
        record, config = recorded_run(tmp_path, {"task": name, **required.get(name, {})})
        options = task_spec(name).options
        if not options.model_fields:
            continue
        section = record[name]  # recorded, defaults included
        assert options(**section) == config.task_options()
        task = task_spec(name).build(config.task_options())
        for option, value in section.items():
            live = getattr(task, option, None)
            if live is not None and not callable(live):
                assert plain(live) == plain(value), (name, option)
    short, _ = recorded_run(tmp_path, {"task": "short_recorded"})
    assert short["short_recorded"] == {"max_length": 3}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"replay.kind": "bare_recorded", "replay.capacity": 1000},
            "invalid config: replay.capacity: replay kind 'bare_recorded' does not take it (its "
            "options: none); remove it from the file and the flags, or choose a kind that takes it",
        ),
        (
            {"replay.kind": "rp", "replay.shingle_k": 3, "replay.prt_alpha": 0.5},
            "invalid config: replay.prt_alpha, replay.shingle_k: replay kind 'rp' does not take "
            "them (its options: capacity, rp_tolerance); remove them from the file and the flags, "
            "or choose a kind that takes them",
        ),
    ],
)
def test_an_option_the_kind_does_not_read_is_refused(plug_ins: None, overrides, message):
    with pytest.raises(ConfigError) as refused:
        build_config(overrides=overrides)
    assert str(refused.value) == message


def test_the_cli_refuses_it_in_one_line_with_exit_2(plug_ins: None, tmp_path: Path):
    args = ["train", "--replay", "bare_recorded", "--replay.capacity", "1000", "--steps", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [
        "error: invalid config: replay.capacity: replay kind 'bare_recorded' does not take it "
        "(its options: none); remove it from the file and the flags, or choose a kind that "
        "takes it"
    ]
    assert not (tmp_path / "run").exists()


def test_a_recorded_config_toml_from_before_lists_every_kinds_options_and_still_loads(
    tmp_path: Path,
):
    """A run's config.toml written when every kind's options were recorded: read back, the
    options its kind did not read are dropped (they did not run), so eval and --resume work."""
    path = tmp_path / "config.toml"
    path.write_text('[replay]\nkind = "subm"\nrp_tolerance = 0.25\nprt_alpha = 0.7\n')
    assert load_config(path).replay.kind == "subm"
    with pytest.raises(ConfigError, match="replay kind 'subm' does not take them"):
        build_config(path)  # as a user's file: refused


@pytest.mark.parametrize(
    ("overrides", "present", "absent"),
    [
        # a GFlowNet run on the embedded model with a buffer: no [rl], no oracle mix
        (
            {"loss": "raptb", "replay.kind": "subm"},
            {"tiny", "replay.p_replay"},
            {"rl", "replay.p_oracle", "replay.oracle_fraction"},
        ),
        # Oracle replay reads the oracle mix
        (
            {"loss": "tb", "replay.kind": "oracle"},
            {"replay.p_replay", "replay.p_oracle", "replay.oracle_fraction"},
            {"rl"},
        ),
        # an RL loss replays nothing: [rl], and no replay share
        ({"loss": "grpo"}, {"rl", "tiny"}, {"replay.p_replay", "replay.p_oracle"}),
        # a pretrained model has no embedded shape
        ({"loss": "tb", "model": "smollm2-135m"}, {"optim"}, {"tiny", "rl"}),
    ],
)
def test_config_toml_records_only_what_the_run_reads(
    overrides: dict[str, Any], present: set[str], absent: set[str], tmp_path: Path
):
    config = build_config(overrides=overrides)
    path = tmp_path / "config.toml"
    save_config(config, path)
    data = tomllib.loads(path.read_text())

    def has(key: str) -> bool:
        section, _, name = key.partition(".")
        return section in data and (not name or name in data[section])

    assert {key for key in present if not has(key)} == set()
    assert {key for key in absent if has(key)} == set()
    # read back, it runs the same: every field a component reads is equal
    again = load_config(path)
    for section in ("objective", "optim", "sampling", "reward"):
        assert getattr(again, section) == getattr(config, section)
    assert again.replay.kind == config.replay.kind
    for key in [k.partition(".")[2] for k in present if k.startswith("replay.")]:
        assert getattr(again.replay, key) == getattr(config.replay, key)
    if config.loss_entry.section == "rl":
        assert again.rl == config.rl
    if config.model == "tiny":
        assert again.tiny == config.tiny
