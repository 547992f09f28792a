"""Each buffer kind's options schema (core.replay.options) is the one list of its options: the
``[replay]`` section holds exactly the schemas' options and the behaviour mix's, a task preset
and the TRL config are checked against it, and ``replay_kwargs`` refuses what a kind does not
take, naming it."""

from __future__ import annotations

import pytest

from raptb.core.replay import (
    BUFFERS,
    NO_REPLAY,
    OracleBuffer,
    SubmodularBuffer,
    buffer_class,
    make_buffer,
    replay_kinds,
    replay_kwargs,
)

MIX_OPTIONS = {"kind", "p_replay", "p_oracle", "oracle_fraction"}
"""[replay] fields that are the run's behaviour mix, not a buffer's options."""


def test_the_replay_section_holds_exactly_the_schemas_options():
    from raptb.app.configuration.sections import ReplayConfig

    declared = {option.name for cls in BUFFERS.values() for option in cls.options}
    assert set(ReplayConfig.model_fields) == declared | MIX_OPTIONS


def test_options_become_the_constructor_keywords_in_one_direction():
    options = {"capacity": 9, "subm_weights": (1.0, 0.5, 2.0, 0.0), "bin_weight_power": 1.5}
    kwargs = replay_kwargs("subm", {**options, "shingle_k": None})
    assert kwargs == {
        "capacity": 9,
        "w_rew": 1.0,
        "w_val": 0.5,
        "w_div": 2.0,
        "w_len": 0.0,
        "length_alpha_power": 1.5,
    }
    buffer = make_buffer("subm", **kwargs)
    assert isinstance(buffer, SubmodularBuffer) and buffer.config()["w_div"] == 2.0
    assert replay_kwargs("prt", {"rp_tolerance": 0.1, "prt_beta": 0.5}) == {
        "tolerance": 0.1,
        "beta": 0.5,
    }
    # a config holding every kind's options (the TRL config) passes them all, not strictly
    every = {"capacity": 5, "rp_tolerance": 0.1, "shingle_k": 3}
    assert replay_kwargs("rp", every, strict=False) == {"capacity": 5, "tolerance": 0.1}
    with pytest.raises(ValueError, match="does not take shingle_k"):
        replay_kwargs("rp", every)


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("rp", {"subm_weights": (1, 1, 1, 1)}, r"replay 'rp' does not take subm_weights; its"),
        ("subm", {"subm_weights": (1.0, 1.0)}, r"subm_weights: must be a list of 4 values"),
        ("subm", {"gating_ratio": 2.0}, r"gating_ratio must be in \[0, 1\]"),
        ("prt", {"prt_beta": 0.0}, r"beta must be in \(0, 1\]"),
        ("oracle", {"capacity": 3}, r"replay 'oracle' takes no options"),
        ("fifo", {}, r"unknown replay kind 'fifo'; valid choices: rp, prt, subm, oracle"),
    ],
)
def test_options_a_kind_refuses_are_one_line_naming_them(kind, options, message):
    with pytest.raises(ValueError, match=message):
        replay_kwargs(kind, options)


def test_kinds_declare_what_the_run_asks_of_them():
    assert replay_kinds() == (NO_REPLAY, *BUFFERS)
    assert [kind for kind, cls in BUFFERS.items() if cls.oracle] == ["oracle"]
    assert buffer_class("oracle") is OracleBuffer and OracleBuffer.options == ()


def test_a_task_preset_that_subm_does_not_take_is_refused_at_registration():
    from dataclasses import replace

    from raptb.adapters.tasks.registry import register_task, task_spec

    bad = replace(task_spec("expr24"), name="bad_preset", subm={"w_rew": 1.0})
    with pytest.raises(ValueError, match=r"task 'bad_preset': SubM preset: .* does not take w_rew"):
        register_task(bad)


def test_the_replay_section_checks_a_plug_in_kinds_values_with_the_kind(monkeypatch):
    from raptb.app.configuration.config import ConfigError, build_config
    from raptb.core.replay import BufferOption, RewardPrioritizedBuffer

    class Small(RewardPrioritizedBuffer):
        kind = "small"
        options = (BufferOption.of("capacity"),)

        def __init__(self, capacity: int = 4) -> None:
            if capacity > 10:
                raise ValueError(f"capacity must be <= 10, got {capacity}")
            super().__init__(capacity)

    monkeypatch.setitem(BUFFERS._entries, "small", Small)  # registered for this test only
    assert build_config(overrides={"replay.kind": "small", "replay.capacity": 8}).replay.capacity
    # its own default, not the section's (SubM's 200), when nothing sets it
    assert build_config(overrides={"replay.kind": "small"}).replay.capacity == 4
    with pytest.raises(ConfigError, match=r"replay: .*capacity must be <= 10, got 11"):
        build_config(overrides={"replay.kind": "small", "replay.capacity": 11})


def test_a_plug_in_kinds_option_the_replay_section_does_not_hold_is_refused(monkeypatch):
    from raptb.app.configuration.config import ConfigError, build_config
    from raptb.core.replay import BufferOption, RewardPrioritizedBuffer

    class Windowed(RewardPrioritizedBuffer):
        kind = "windowed"
        options = (BufferOption.of("capacity"), BufferOption.of("window"))

        def __init__(self, capacity: int = 4, window: int = 2) -> None:
            super().__init__(capacity)

    monkeypatch.setitem(BUFFERS._entries, "windowed", Windowed)
    with pytest.raises(ConfigError, match=r"replay kind 'windowed' declares window, which \[rep"):
        build_config(overrides={"replay.kind": "windowed"})
