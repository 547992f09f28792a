"""GPU staging (benchmarks/gpu/staging.py): every plan's uploads fit one device call each, from
the lock's sizes (no network); a lock behind the installed versions is a warning (a new release
on the registry must not fail CI); the packing is checked on random sizes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def staging(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    monkeypatch.chdir(ROOT)
    import staging

    return staging


def test_every_plan_stages_in_uploads_that_fit(staging):
    lock = json.loads(staging.LOCK.read_text())
    assert {w["name"] for w in lock["wheels"]} == {
        name for names in staging.PLAN_PACKAGES.values() for name in names
    }
    tree = staging.tree_bytes()
    problems = staging.check(lock, tree)
    assert [p for p in problems if "MiB" in p] == []  # every upload fits
    stale = [p for p in problems if "MiB" not in p]
    if stale:  # a newer release installed here: the lock wants refreshing, CI need not fail
        warnings.warn(
            "benchmarks/gpu/staging.lock.json is behind the installed versions ("
            + "; ".join(stale)
            + "): run python benchmarks/gpu/staging.py lock",
            stacklevel=1,
        )
    counts = {plan: len(staging.uploads(lock, plan, tree)) for plan in staging.PLAN_PACKAGES}
    # the random-weight plans without TRL stage in one call
    assert counts["smiles"] == counts["scales"] == 1
    assert counts["first"] == 2  # SmolLM2's 88.6 MiB wheel needs a second
    # a wheel too big, or a version that is not the installed one, is reported
    big = dict(lock, wheels=[{**w, "size": 70 * 2**20} if w["name"] == "rdkit" else w
                             for w in lock["wheels"]])  # fmt: skip
    with pytest.raises(SystemExit, match="rdkit"):
        staging.check(big, tree)
    # a lock behind this environment, or naming a package not installed here, is reported
    # (versions injected: CI's environment need not hold every plan's wheels)
    pinned = {w["name"]: w["version"] for w in lock["wheels"]}
    assert staging.check(lock, tree, installed=pinned.get) == []
    first = lock["wheels"][0]["name"]
    newer = pinned | {first: "99.0"}
    assert staging.check(lock, tree, installed=newer.get) == [
        f"{first}: lock {pinned[first]}, installed 99.0"
    ]
    missing = {k: v for k, v in pinned.items() if k != "tzdata"}
    assert staging.check(lock, tree, installed=missing.get) == [
        f"tzdata: lock {pinned['tzdata']}, not installed here"
    ]


@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    model=st.integers(0, 400),
    room=st.integers(50, 120),
)
def test_pack_places_everything_once_within_the_room(sizes, model, room):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import staging

    items = {f"w{i}": size for i, size in enumerate(sizes)} | {staging.MODEL: model}
    loads = staging.pack(items, room)
    assert all(sum(size for _, _, size in load) <= room for load in loads)
    whole = sorted(name for load in loads for name, _, _ in load if name != staging.MODEL)
    assert whole == sorted(f"w{i}" for i in range(len(sizes)))
    slices = [
        (offset, size) for load in loads for name, offset, size in load if name == staging.MODEL
    ]
    assert sum(size for _, size in slices) == model
    assert [offset for offset, _ in slices] == [
        sum(s for _, s in slices[:k]) for k in range(len(slices))
    ]
    assert all(size > 0 for _, size in slices)
