"""DAPO's dynamic sampling in GRPO's algorithm (app.training.rl.dynamic_sampling): the
zero-variance groups are refilled in place by fresh groups of their prompt, round after round up
to the cap, every sampled row counted for Acc; and a short run logs it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from raptb.app.training.rl import dynamic_sampling
from raptb.app.training.rl.dynamic_sampling import (
    refill_zero_variance_groups,
    zero_variance_groups,
)
from raptb.app.training.rl.rollout import OnPolicyRows
from raptb.app.training.step import Trajectories
from raptb.app.training.train import Trainer
from tests.app.test_train import small_config

G = 2  # rows per group
# what the refill reads of the loop besides the two functions the tests script
LOOP = SimpleNamespace(
    cfg=SimpleNamespace(rl=SimpleNamespace(temperature=1.0)), policy=None, task=None, generator=None
)


def piece(prompt: str, tags: list[int]) -> Trajectories:
    """Rows of ``prompt`` whose one token is their tag (to follow them through the refill)."""
    n = len(tags)
    return Trajectories(
        prompt=prompt,
        tokens=torch.tensor(tags)[:, None],
        length=torch.ones(n, dtype=torch.long),
        rows=tuple((t,) for t in tags),
        texts=tuple(str(t) for t in tags),
        on_policy=tuple(range(n)),
        stored_u=None,
        temperature=1.0,
        timings=None,
    )


def test_zero_variance_groups_by_hand():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    assert zero_variance_groups(rewards, 2) == [0, 2, 3]
    assert zero_variance_groups(rewards, 4) == []


def scripted(monkeypatch, rounds: list[dict[str, list[float]]]) -> list[list[str]]:
    """Fresh groups per round: prompt -> rewards of its rows in order; tags count up from 100.
    Returns the prompts each round rolled out."""
    asked: list[list[str]] = []
    tag = iter(range(100, 1000))

    def collect_step(policy, task, plan, rows, *, generator):
        asked.append(list(plan.prompt))
        order = list(dict.fromkeys(plan.prompt))
        counts = {p: plan.prompt.count(p) for p in order}
        return SimpleNamespace(
            pieces=[piece(p, [next(tag) for _ in range(counts[p])]) for p in order]
        )

    def scored_rows(loop, pieces):
        script = rounds[len(asked) - 1]
        terminal = tuple(torch.tensor(script[p.prompt]) for p in pieces)
        correct = [
            t
            for p, r in zip(pieces, terminal, strict=True)
            for t, x in zip(p.texts, r.tolist(), strict=True)
            if x > 0
        ]
        return OnPolicyRows(tuple(pieces), terminal, correct)

    monkeypatch.setattr(dynamic_sampling, "collect_step", collect_step)
    monkeypatch.setattr(dynamic_sampling, "scored_rows", scored_rows)
    return asked


def test_refill_in_place_until_no_zero_variance_group(monkeypatch):
    # prompt a: groups [1, 1] (zero std), [0, 1]; prompt b: [0, 0] (zero std)
    rollout = OnPolicyRows(
        (piece("a", [1, 2, 3, 4]), piece("b", [5, 6])),
        (torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0])),
        ["1", "2", "4"],
    )
    asked = scripted(
        monkeypatch,
        [{"a": [0.0, 1.0], "b": [1.0, 1.0]}, {"b": [1.0, 0.0]}],  # round 2, round 3
    )
    out, refill = refill_zero_variance_groups(LOOP, rollout, G, max_num_gen_batches=5)
    assert asked == [["a", "a", "b", "b"], ["b", "b"]]
    assert out.pieces[0].rows == ((100,), (101,), (3,), (4,))  # group 0 of a replaced in place
    assert out.pieces[1].rows == ((104,), (105,))  # b refilled twice: the second group stays
    assert out.terminal[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert out.terminal[1].tolist() == [1.0, 0.0]
    assert (refill.rounds, refill.extra_rows, refill.zero_std_before, refill.zero_std_after) == (
        3,
        6,
        2,
        0,
    )
    # every sampled row counts for Acc: 6 + 6 rows, 3 + 4 correct
    assert out.on_policy == 12 and sorted(out.correct) == [
        "1",
        "101",
        "102",
        "103",
        "104",
        "2",
        "4",
    ]
    assert out.pieces[0].tokens[:, 0].tolist() == [100, 101, 3, 4]


def test_refill_stops_at_the_cap(monkeypatch):
    rollout = OnPolicyRows((piece("a", [1, 2]),), (torch.tensor([0.0, 0.0]),), [])
    asked = scripted(monkeypatch, [{"a": [0.0, 0.0]}] * 5)
    out, refill = refill_zero_variance_groups(LOOP, rollout, G, max_num_gen_batches=3)
    assert len(asked) == 2  # the first generation batch counts toward the cap
    assert (refill.rounds, refill.extra_rows, refill.zero_std_after) == (3, 4, 1)
    assert out.terminal[0].tolist() == [0.0, 0.0] and out.on_policy == 6
    assert refill.record(1)["frac_groups_zero_std_kept"] == 1.0
    out, refill = refill_zero_variance_groups(LOOP, rollout, G, max_num_gen_batches=1)
    assert out is not rollout and out.pieces == rollout.pieces and refill.rounds == 1


def test_a_run_logs_dynamic_sampling(tmp_path: Path):
    config = small_config(
        loss="grpo",
        steps=2,
        **{"rl.num_generations": 4, "rl.filter_groups": True, "rl.max_num_gen_batches": 2},
    )
    Trainer(config, tmp_path, progress=False).train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "num_gen_batches" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["num_gen_batches"] in (1, 2)
        assert r["frac_groups_zero_std_kept"] <= r["frac_groups_zero_std_sampled"]
        assert r["frac_reward_zero_std"] == r["frac_groups_zero_std_kept"]
