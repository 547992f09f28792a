"""PrefixBatch validation and linear schedules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from raptb.core.gfn.batch import PrefixBatch
from raptb.core.schedules import LinearSchedule, schedule_value


def fields(b=3, t=4, **over):
    d = {
        "log_pf": np.zeros((b, t)),
        "log_pterm": np.zeros((b, t + 1)),
        "log_r": np.zeros((b, t + 1)),
        "u": np.zeros((b, t + 1)),
        "length": np.array([0, 2, 4][:b]),
    }
    d.update(over)
    return d


def test_masks():
    batch = PrefixBatch(**fields())
    assert batch.token_mask.tolist() == [
        [False] * 4,
        [True, True, False, False],
        [True] * 4,
    ]
    assert batch.prefix_mask.sum(axis=1).tolist() == [1, 3, 5]
    assert (batch.batch_size, batch.max_length) == (3, 4)


def test_torch_batch():
    d = {k: torch.as_tensor(v) for k, v in fields().items()}
    assert PrefixBatch(**d).prefix_mask.dtype == torch.bool


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"log_pf": np.zeros(4)}, "log_pf: expected shape"),
        ({"log_pterm": np.zeros((3, 4))}, "log_pterm: expected shape"),
        ({"u": np.zeros((2, 5))}, "u: expected shape"),
        ({"length": np.array([0, 1])}, "length: expected shape"),
        ({"length": np.array([0.0, 1.0, 2.0])}, "length: expected an integer dtype"),
        ({"length": np.array([0, 1, 5])}, r"length: values must lie in \[0, T=4\]"),
        ({"length": np.array([-1, 1, 2])}, "length: values must lie"),
        ({"log_r": np.zeros((3, 5), dtype=np.float32)}, "log_r: dtype"),
        ({"log_pf": np.zeros((3, 4), dtype=np.int64)}, "log_pf: expected a real floating"),
        ({"log_pterm": np.full((3, 5), np.nan)}, "log_pterm: non-finite"),
        ({"length": torch.tensor([0, 1, 2])}, "one namespace"),
    ],
)
def test_bad_batches_name_the_field(over, message):
    with pytest.raises(ValueError, match=message):
        PrefixBatch(**fields(**over))


def test_non_finite_after_stop_is_allowed():
    log_pterm = np.zeros((3, 5))
    log_pterm[0, 1:] = -np.inf
    PrefixBatch(**fields(log_pterm=log_pterm))


def test_linear_schedule_hand_values():
    s = LinearSchedule(0.5, 0.25, 5000)
    assert s(0) == 0.5 and s(2500) == pytest.approx(0.375) and s(5000) == 0.25 and s(9999) == 0.25
    k = LinearSchedule(7, 3, 5000, integer=True)
    assert [k(x) for x in (0, 1, 1250, 1251, 5000)] == [7.0, 6.0, 6.0, 5.0, 3.0]
    assert LinearSchedule.constant(4.0)(123) == 4.0
    assert schedule_value(2.5, 10) == 2.5 and schedule_value(s, 5000) == 0.25


@given(st.floats(-10, 10), st.floats(-10, 10), st.integers(1, 10_000), st.integers(0, 20_000))
def test_linear_schedule_stays_between_endpoints(a, b, horizon, step):
    v = LinearSchedule(a, b, horizon)(step)
    assert min(a, b) - 1e-9 <= v <= max(a, b) + 1e-9


def test_schedule_errors():
    with pytest.raises(ValueError, match="horizon"):
        LinearSchedule(1, 2, -1)
    with pytest.raises(ValueError, match="step"):
        LinearSchedule(1, 2, 3)(-1)
