"""GFlowNetConfig's validation and objective mapping, and the TRL version gate."""

from __future__ import annotations

from dataclasses import fields

import pytest

pytest.importorskip("trl")

from raptb.core.gfn.objectives import objective_by_name
from raptb.core.schedules import LinearSchedule
from raptb.integrations.trl import GFlowNetConfig, versions

CPU = {"output_dir": "unused", "report_to": [], "bf16": False, "use_cpu": True}


@pytest.mark.parametrize(
    "found", ["1.17.0", "1.15.2", "1.17.0.dev0", "1.17.0rc1", "1.16.0.dev0", "1.16.0rc2"]
)
def test_an_untested_trl_version_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, found: str
) -> None:
    """Releases outside [1.16, 1.17) and development builds of them (1.17.0.dev0 is a TRL
    installed from its repository after 1.16; 1.16.0rc2 comes before the tested release)."""
    assert versions.check_trl_version().startswith("1.16")
    monkeypatch.setattr(versions, "version", lambda name: found)
    with pytest.raises(ImportError) as info:
        versions.check_trl_version()
    message = str(info.value)
    assert "\n" not in message and "trl>=1.16,<1.17" in message and found in message


@pytest.mark.parametrize("found", ["1.16.0", "1.16.3", "1.16.1.dev0", "1.16.0.post1"])
def test_a_tested_trl_version_is_accepted(monkeypatch: pytest.MonkeyPatch, found: str) -> None:
    monkeypatch.setattr(versions, "version", lambda name: found)
    assert versions.check_trl_version() == found


def test_the_overridden_grpo_methods_have_the_parameters_they_were_written_for() -> None:
    from trl import GRPOTrainer

    from raptb.integrations.trl import GFlowNetTrainer

    versions.check_trl_internals(GRPOTrainer)  # the installed TRL passes
    # every GRPOTrainer method GFlowNetTrainer defines again is listed, so none escapes the check
    own = {n for n, v in vars(GFlowNetTrainer).items() if callable(v) and hasattr(GRPOTrainer, n)}
    assert own - {"__init__"} <= set(versions.OVERRIDDEN_SIGNATURES)


@pytest.mark.parametrize("name", sorted(versions.OVERRIDDEN_SIGNATURES))
def test_a_changed_or_missing_grpo_method_is_refused_at_import_in_one_line(name: str) -> None:
    from trl import GRPOTrainer

    def changed(self, inputs, extra):  # a TRL release that added a parameter
        return None

    renamed = type("GRPOTrainer", (GRPOTrainer,), {name: changed})
    with pytest.raises(
        ImportError, match=rf"GRPOTrainer\.{name} is now {name}\(self, inp"
    ) as caught:
        versions.check_trl_internals(renamed)
    assert "\n" not in str(caught.value)
    gone = type(
        "GRPOTrainer",
        (),
        {n: getattr(GRPOTrainer, n) for n in versions.OVERRIDDEN_SIGNATURES if n != name},
    )
    with pytest.raises(ImportError, match=rf"GRPOTrainer\.{name} is gone"):
        versions.check_trl_internals(gone)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"beta": 0.04}, "beta"),
        ({"mask_truncated_completions": True}, "mask_truncated_completions"),
        ({"loss": "ppo"}, "loss"),
        ({"replay": "oracle"}, "replay"),
        ({"eta": -1.0}, "eta"),
        ({"replay_fraction": 1.5}, "replay_fraction"),
        ({"reward_temperature": 0.0}, "reward_temperature"),
    ],
)
def test_invalid_settings_fail_at_construction(overrides: dict, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        GFlowNetConfig(**CPU, **overrides)


def test_the_objective_is_the_core_one_with_the_configured_hyperparameters() -> None:
    args = GFlowNetConfig(
        **CPU, loss="raptb", soft_beta=5.0, rho=0.1, alpha=0.5, k_min=5, k_min_end=2, eta=0.3
    )
    want = objective_by_name(
        "raptb",
        beta=5.0,
        rho=0.1,
        alpha=0.5,
        eta=0.3,
        k_min=LinearSchedule(5, 2, 100, integer=True),
    )
    assert args.objective(100) == want
    subtb = GFlowNetConfig(**CPU, loss="subtb", subtb_normalization="batch")
    assert subtb.objective(10) == objective_by_name("subtb", normalization="batch")
    assert args.replay_fraction_at(0, 100) == 0.5
    assert args.replay_fraction_at(100, 100) == 0.25


def test_every_new_field_is_documented_once_in_the_class_docstring() -> None:
    doc = GFlowNetConfig.__doc__ or ""
    new = [f for f in fields(GFlowNetConfig) if f.name in GFlowNetConfig.__annotations__]
    assert len(new) > 20
    for f in new:
        assert doc.count(f"\n        {f.name} (`") == 1, f.name
        assert f.metadata["help"].split()[0] in doc


def test_every_buffer_fields_default_is_the_core_buffers_own() -> None:
    from raptb.core.replay import BUFFER_KINDS, buffer_class, option_default
    from raptb.integrations.trl.config import _BUFFER_FIELDS

    defaults = {f.name: f.default for f in fields(GFlowNetConfig)}
    checked = 0
    for name, option in _BUFFER_FIELDS.items():
        for kind in BUFFER_KINDS:
            if option in {o.name for o in buffer_class(kind).options}:
                core = option_default(kind, option)
                # None keeps the buffer's own default (subm_weights)
                assert defaults[name] in (core, None), (name, kind, defaults[name], core)
                checked += 1
    assert checked >= len(_BUFFER_FIELDS)


def test_the_replay_sections_defaults_are_the_core_buffers_own() -> None:
    from raptb.app.configuration.sections import ReplayConfig
    from raptb.core.replay import buffer_class, option_default

    section = ReplayConfig()
    for option in buffer_class("subm").options:
        if option.name in ReplayConfig.model_fields:
            mine = getattr(section, option.name)
            assert mine is None or mine == option_default("subm", option.name), option.name


def test_option_default_reads_the_constructor() -> None:
    from raptb.core.replay import option_default

    assert option_default("subm", "subm_weights") == [1.0, 1.0, 1.0, 1.0]
    assert option_default("prt", "prt_beta") == 0.2
    with pytest.raises(ValueError, match="has no option 'prt_alpha'"):
        option_default("rp", "prt_alpha")


def test_buffer_keywords_come_through_each_kinds_options_schema() -> None:
    """The buffer fields reach each kind's constructor keywords through its schema, only those
    it declares (hand-written expectations); replay_options add the rest by [replay] names."""
    base = {"replay_capacity": 50, "rp_tolerance": 0.5, "prt_alpha": 0.6, "prt_beta": 0.3}
    rp = GFlowNetConfig(**CPU, replay="rp", **base)
    assert rp.buffer_kwargs() == {"capacity": 50, "tolerance": 0.5}
    prt = GFlowNetConfig(**CPU, replay="prt", **base)
    assert prt.buffer_kwargs() == {"capacity": 50, "tolerance": 0.5, "alpha": 0.6, "beta": 0.3}
    subm = GFlowNetConfig(
        **CPU,
        replay="subm",
        subm_weights=[1.0, 0.5, 2.0, 0.0],
        subm_gating_ratio=0.25,
        replay_options={"bin_weight_power": 2.0, "capacity": 30},
    )
    assert subm.buffer_kwargs() == {
        "capacity": 30,  # replay_options override the fields
        "w_rew": 1.0,
        "w_val": 0.5,
        "w_div": 2.0,
        "w_len": 0.0,
        "gating_ratio": 0.25,
        "length_alpha_power": 2.0,
        "shingle_k": 2,
        "shingle_on": "text",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"replay": "rp", "replay_options": {"bin_weight_power": 1.0}}, "replay_options: .*rp"),
        ({"replay": "subm", "replay_options": {"capacity": 0}}, "^replay_options: capacity: "),
        ({"replay": "prt", "replay_options": {"prt_beta": 2.0}}, "^replay_options: prt_beta: "),
        # the field the user set, not the buffer's keyword
        ({"replay": "prt", "prt_alpha": 1.5}, r"^prt_alpha: must be in \[0, 1\], got 1.5$"),
        ({"replay": "subm", "replay_capacity": 0}, "^replay_capacity: must be >= 1, got 0$"),
        ({"replay": "rp", "rp_tolerance": -1.0}, "^rp_tolerance: must be >= 0"),
        ({"replay": "oracle"}, "^replay: 'oracle' is not available here, since its items come"),
        ({"replay": "nope"}, "replay: must be one of"),
    ],
)
def test_bad_replay_settings_fail_at_construction_in_one_line(overrides, message) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        GFlowNetConfig(**CPU, **overrides)
    assert "\n" not in str(caught.value)


@pytest.fixture
def plug_in_buffer(monkeypatch: pytest.MonkeyPatch):
    """A buffer kind registered as a plug-in does (raptb.register_buffer), removed afterwards."""
    from raptb.core.replay import BUFFERS, RewardPrioritizedBuffer, register_buffer
    from raptb.core.replay.options import BufferOption

    class Newest(RewardPrioritizedBuffer):
        """RP with one more option, the plug-in's own."""

        kind = "newest"
        options = (*RewardPrioritizedBuffer.options, BufferOption.of("newest_keep", "keep"))

        def __init__(self, capacity: int = 40, tolerance: float = 0.25, keep: int = 1) -> None:
            super().__init__(capacity=capacity, tolerance=tolerance)
            if keep < 1:
                raise ValueError(f"newest_keep: must be >= 1, got {keep}")
            self.keep = keep

    monkeypatch.setattr(BUFFERS, "_entries", dict(BUFFERS._entries))
    register_buffer(Newest)
    return Newest


def test_a_plug_in_buffer_is_reachable_with_its_own_options(plug_in_buffer) -> None:
    from raptb.core.replay import make_buffer

    args = GFlowNetConfig(
        **CPU, replay="newest", replay_capacity=40, replay_options={"newest_keep": 3}
    )
    assert args.buffer_kwargs() == {"capacity": 40, "tolerance": 0.25, "keep": 3}
    buffer = make_buffer(args.replay, **args.buffer_kwargs())
    assert isinstance(buffer, plug_in_buffer) and buffer.keep == 3
    with pytest.raises(ValueError, match="newest_keep: must be >= 1"):
        GFlowNetConfig(**CPU, replay="newest", replay_options={"newest_keep": 0})


def test_a_plug_in_buffers_own_capacity_holds_unless_the_config_sets_one(plug_in_buffer) -> None:
    """replay_capacity None (the default) leaves the kind's own capacity (the plug-in's 40, the
    built-in kinds' 200); a value set reaches the buffer."""
    from raptb.core.replay import make_buffer

    own = make_buffer("newest", **GFlowNetConfig(**CPU, replay="newest").buffer_kwargs())
    assert own.capacity == 40
    set_ = GFlowNetConfig(**CPU, replay="newest", replay_capacity=7)
    assert make_buffer("newest", **set_.buffer_kwargs()).capacity == 7
    for kind in ("rp", "prt", "subm"):
        built_in = make_buffer(kind, **GFlowNetConfig(**CPU, replay=kind).buffer_kwargs())
        assert built_in.capacity == 200, kind
