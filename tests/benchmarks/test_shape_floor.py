"""benchmarks/shape_floor.py: under ProductFloor each product adds its own shape's seconds alone
(timed once per distinct shape and layout) and its FLOPs, the FLOPs torch's counter gives for
the same products; a FlopCounterMode inside it does not count the timing's own products."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.benchmarks import load_script


def _work(weight: torch.Tensor, x: torch.Tensor) -> None:
    y = (x @ weight.t()).relu()
    z = torch.bmm(y.view(4, 8, 24), y.view(4, 8, 24).transpose(1, 2))
    (z.sum() + (y @ weight).sum()).backward()


def test_each_product_adds_its_shapes_seconds_and_the_counters_flops() -> None:
    floor = load_script("shape_floor")
    torch.manual_seed(0)
    weight = torch.randn(24, 16, requires_grad=True)
    x = torch.randn(32, 16, requires_grad=True)
    with FlopCounterMode(display=False) as alone:
        _work(weight, x)
    with floor.ProductFloor() as products, FlopCounterMode(display=False) as inside:
        _work(weight, x)
        first, shapes = products.seconds, dict(products.shapes)
        _work(weight, x)  # the same products again: no new timing, the same seconds added
    assert inside.get_total_flops() == 2 * alone.get_total_flops()  # the timing is not counted
    assert products.flops == inside.get_total_flops()  # products only here: all counted FLOPs
    assert products.shapes == shapes and all(s > 0 for s in shapes.values())
    assert abs(products.seconds - 2 * first) <= 1e-9 * first
    assert first >= max(shapes.values())
    assert {key[2] for key in shapes} | {key[4] for key in shapes} >= {"c", "t"}


def test_from_memory_each_call_reads_a_new_place_of_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    floor = load_script("shape_floor")
    for layout in ("c", "t"):
        views = [floor._in_pool((64, 48), layout, torch.float32, place) for place in range(3)]
        assert all(tuple(v.shape) == (64, 48) and floor._layout(v) == layout for v in views)
        assert len({v.data_ptr() for v in views}) == 3  # three places, 12 KiB apart
        assert views[1].data_ptr() - views[0].data_ptr() == 64 * 48 * 4
    pool = floor._pools[torch.float32]
    slots = pool.numel() // (64 * 48)
    again = floor._in_pool((64, 48), "c", torch.float32, slots)  # the slots cycle
    assert again.data_ptr() == pool.data_ptr()
    drawn: list[int] = []
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: drawn.append(1) or randn(*a, **k))
    floor._in_pool((64, 48), "t", torch.float32, 5)
    assert drawn == [] and floor._pools[torch.float32] is pool  # one pool, drawn once
    monkeypatch.undo()
    too_big = floor._in_pool((pool.numel() + 1,), "c", torch.float32, 0)
    assert too_big.numel() == pool.numel() + 1  # an operand of its own where it does not fit
    weight = torch.randn(24, 16, requires_grad=True)
    x = torch.randn(32, 16, requires_grad=True)
    with floor.ProductFloor(from_memory=True) as products:
        _work(weight, x)
    with floor.ProductFloor() as cached:
        _work(weight, x)
    assert products.flops == cached.flops and products.seconds > 0
