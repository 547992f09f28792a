"""The GFlowNet objectives (tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad and the
plug-ins'): behaviour mix, replay buffer, logZ, and one optimizer step over micro-batches.

One optimizer step holds batch_size x grad_accum trajectories (app.training.step_batch): each row's
behaviour is drawn for the step (replay.md's mix, per row), the on-policy rows are rolled out
together in one call, the replayed rows come from the buffer as it stands at the step's start, and
all are scored. The loss and its backward then run over micro-batches of ``batch_size`` rows,
each weighted by its share of the step's rows, so the split is a memory knob only: the same seed
and rows per step give the same rollout, loss and update whatever ``grad_accum`` (VarGrad, whose
loss is a variance over the batch, holds the logZ estimate of all the step's rows fixed in every
micro-batch). The buffer is refreshed once per step, with the step's on-policy rows.

Every trajectory is re-scored by the current policy in one teacher-forced forward pass (with
gradients), over the micro-batch's distinct rows: a row that repeats another (a replayed text drawn
twice, a sample the buffer holds) takes the first copy's values and adds its gradient to it
(adapters.lm.distinct_rows; the same loss and update, up to float rounding). Rewards
(app.reward.schedule): on-policy rows are scored with the task; replayed rows reuse the task-only
rewards u stored with them unless lambda or the reward temperature is scheduled (then they are
scored again, through the cache); when kappa > 0 the reference term kappa log P_ref is recomputed
from the frozen reference model for every row.

logZ is a float32 scalar in its own AdamW parameter group with its own learning rate.

Reading one optimizer step, in call order (``GFlowNetAlgorithm.optimizer_step`` below)::

    train.py           Trainer.train -> _optimizer_step -> algorithm.optimizer_step
    gflownet/          _collect: Trainer.step_rows (this rank's rows, every row's prompt)
      row_plan.py        plan_rows(prompts, mix_schedule.MixSchedule.at(step), buffer, oracle)
    step_batch.py        collect_step: one policy.sample of the sampled rows, stored rows
                         (step_batch.stored_rows) for the replayed and oracle ones
    step.py            reward (task scores u, through the cache) and with_prior (kappa log P_ref)
                       of each piece; correct_texts for the log
    step_batch.py      micro_batches: this rank's rows in micro-batches of batch_size
    gflownet/
      replay_items.py  new_items: the on-policy rows as replay items
    train.py           Trainer.accumulate: per micro-batch the loss below, then
      step.py            loss_step: teacher-forced forward (adapters.lm.policy), the objective
                         (core.gfn.objectives) on the PrefixBatch, backward
      micro_batch.py   combine_micro_batch: losses, texts, items over ranks
    train.py           Trainer.apply_gradients: average over ranks, clip, AdamW step
    gflownet/          buffer.add(items) (core.replay), then _step_record: the metrics line
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from raptb.adapters.lm.policy import to_prefix_batch
from raptb.app.training.algorithm import Loop
from raptb.app.training.gflownet.mix_schedule import MixSchedule
from raptb.app.training.gflownet.replay_items import new_items
from raptb.app.training.gflownet.replay_setup import build_buffer
from raptb.app.training.gflownet.row_plan import plan_rows
from raptb.app.training.micro_batch import MicroBatchTotals
from raptb.app.training.step import (
    LossResult,
    Rewards,
    Trajectories,
    correct_texts,
    loss_step,
    reward,
    row_prompts,
    with_prior,
)
from raptb.app.training.step_batch import (
    REPLAYED,
    SAMPLED,
    RowPlan,
    StepBatch,
    collect_step,
    micro_batches,
)
from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.mode_bonus import mode_bonus_term
from raptb.core.gfn.objectives import Objective, partial_residuals
from raptb.core.schedules import LinearSchedule


def _pair(value: float | tuple[float, float]) -> tuple[float, float]:
    """A constant or a (start, end) schedule as (start, end)."""
    return (value, value) if isinstance(value, int | float) else value


class GFlowNetAlgorithm:
    """Trains a GFlowNet objective (app.training.algorithm's shape)."""

    objective: Objective

    def __init__(self, loop: Loop) -> None:
        cfg = loop.cfg
        self.loop = loop
        self.log_z = torch.nn.Parameter(torch.tensor(cfg.optim.log_z_init, dtype=torch.float32))
        self.objective = cfg.build_objective()
        self.mix = MixSchedule(cfg, cfg.schedule_horizon)
        self.buffer = build_buffer(cfg, loop.task, loop.policy, loop.scorer)
        self.oracle = self.buffer if self.buffer is not None and self.buffer.oracle else None
        # set at the first step of a new run (a resumed one keeps its saved logZ: load_extra_state)
        self.start_from_batch = cfg.optim.log_z_start == "batch"
        start, end = _pair(cfg.objective.mode_bonus)
        self.mode_bonus = LinearSchedule(start, end, cfg.schedule_horizon)
        self.mode_bonus_cap = cfg.objective.mode_bonus_cap

    # --- what the loop reads -------------------------------------------------------------------

    def param_groups(self) -> list[dict[str, Any]]:
        return [{"params": [self.log_z], "lr": self.loop.cfg.optim.log_z_lr, "weight_decay": 0.0}]

    def uses_reference(self) -> bool:
        """The frozen reference is read by the kappa log P_ref prior only."""
        return self.loop.cfg.reward.kappa > 0

    def extra_state(self) -> dict[str, Any]:
        return {"log_z": self.log_z.detach().clone()}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        with torch.no_grad():
            self.log_z.copy_(saved["log_z"])
        self.start_from_batch = False

    def run_state(self) -> dict[str, Any]:
        return {"buffer": None if self.buffer is None else self.buffer.state_dict()}

    def load_run_state(self, state: dict[str, Any]) -> None:
        if self.buffer is not None and self.oracle is None and state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])

    # --- one optimizer step --------------------------------------------------------------------

    def _collect(self) -> StepBatch:
        """The step's rows on this rank: the shared plan, then one rollout of its sampled rows."""
        loop = self.loop
        own, prompts = loop.step_rows()
        plan = plan_rows(
            prompts, self.mix.at(loop.step), buffer=self.buffer, oracle=self.oracle, rng=loop.rng
        )
        return collect_step(loop.policy, loop.task, plan, own, generator=loop.generator)

    def optimizer_step(self) -> dict[str, Any] | None:
        """Collect and score the step's rows, backpropagate the loss over micro-batches of this
        rank's share of batch_size, refresh the buffer once; None (no update) when the loss is
        not finite on some rank."""
        loop = self.loop
        loop.policy.model.train()
        loop.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step = self._collect()
        weights = loop.reward_schedule.at(loop.step)
        # task rewards piece by piece; the reference prior of all the step's rows in one forward
        scored = with_prior(
            loop.policy,
            [
                (
                    piece,
                    reward(loop.scorer, loop.policy, piece, 0.0, weights.scale, weights.rescore),
                )
                for piece in step.pieces
            ],
            weights.kappa,
        )
        correct = [
            text
            for piece, rewards in scored
            for text in correct_texts(loop.task, piece, rewards, loop.spec)
        ]
        agree = loop.dist.all_true if loop.dist.sharding else None
        batches = [
            [(scored[i][0].take(rows), scored[i][1].take(rows)) for i, rows in parts]
            for parts in micro_batches([len(p.rows) for p in step.pieces], loop.rank_batch)
        ]
        if self.start_from_batch:
            self._start_log_z(batches)
        held = self._held_kwargs(batches)
        drawn = Counter()  # on-policy rows of each prompt in the step: the mode bonus's n
        for piece in step.pieces:
            drawn[piece.prompt] += len(piece.on_policy)

        def loss(parts: list[tuple[Trajectories, Rewards]], rows: slice) -> LossResult | None:
            weight = (rows.stop - rows.start) / step.rows  # its share of the step's rows
            bonus = self._bonus_term(parts, drawn)
            return loss_step(
                loop.policy,
                self.objective,
                self.log_z,
                parts,
                loop.step,
                weight,
                agree,
                bonus,
                **held,
            )

        replays = self.buffer is not None and self.oracle is None
        items = [
            item
            for piece, rewards in scored
            if replays
            for item in new_items(loop.task, piece, rewards, loop.spec)
        ]
        on_policy = sum(len(piece.on_policy) for piece in step.pieces)
        totals = loop.accumulate(
            batches, loss, correct=correct, on_policy=on_policy, items=items, in_lanes=True
        )
        if totals is None:
            return None  # every rank skips the step together
        if self.buffer is not None and totals.items:
            self.buffer.add(totals.items)
        return self._step_record(totals, step.plan, time.perf_counter() - start)

    def _bonus_term(
        self, parts: list[tuple[Trajectories, Rewards]], drawn: Counter[str]
    ) -> Callable[[PrefixBatch], torch.Tensor] | None:
        """The micro-batch's mode-bonus term (core.gfn.mode_bonus), None at mode_bonus 0: its
        correct on-policy rows are eligible, each with its prompt's on-policy rows in the step."""
        weight = self.mode_bonus(self.loop.step)
        if weight == 0:
            return None
        is_correct = self.loop.spec.is_correct
        eligible, group = [], []
        for batch, rewards in parts:
            drawn_here, scores = set(batch.on_policy), rewards.scores
            for b in range(len(batch.rows)):
                eligible.append(b in drawn_here and scores is not None and is_correct(scores[b]))
                group.append(drawn[batch.prompt])
        device = parts[0][0].length.device
        mask = torch.tensor(eligible, dtype=torch.bool, device=device)
        size = torch.tensor(group, dtype=torch.float32, device=device)
        return lambda prefixes: mode_bonus_term(
            prefixes, mask, size.to(prefixes.log_pf.dtype), weight, self.mode_bonus_cap
        )

    def _held_kwargs(self, batches: list[list[tuple[Trajectories, Rewards]]]) -> dict[str, Any]:
        """What the objective holds fixed over the step's micro-batches: for one that declares
        ``holds_log_z`` (VarGrad), the logZ estimate from all of this rank's rows (a forward
        without gradients first), so that its batch is the step; nothing for the others, whose
        loss is a mean over rows."""
        if not self.objective.holds_log_z or len(batches) == 1:
            return {}
        return {"log_z_hat": -self._partial_residuals(batches).mean()}

    def _start_log_z(self, batches: list[list[tuple[Trajectories, Rewards]]]) -> None:
        """``optim.log_z_start = "batch"``: set logZ to the batch estimate of the run's first
        step, minus the mean partial residual over every rank's rows, before its loss."""
        self.start_from_batch = False
        partial = self._partial_residuals(batches)
        sums = self.loop.dist.all_gather_object((float(partial.sum()), int(partial.numel())))
        total, count = map(sum, zip(*sums, strict=True))
        with torch.no_grad():
            self.log_z.fill_(-total / count)

    def _partial_residuals(self, batches: list[list[tuple[Trajectories, Rewards]]]) -> torch.Tensor:
        """log P_F(x) - log R(x) of every row of this rank's step under the current policy, [B]
        (one forward without gradients per micro-batch, as its loss takes)."""
        partial = []
        policy = self.loop.policy
        with torch.no_grad():
            for parts in batches:  # one forward per micro-batch, as its loss takes
                length = torch.cat([batch.length for batch, _ in parts])
                log_pf, log_pterm = policy.score(
                    row_prompts(batch for batch, _ in parts),
                    torch.cat([batch.tokens for batch, _ in parts]),
                    length,
                )
                log_r = torch.cat([rewards.log_r for _, rewards in parts])
                u = torch.cat([rewards.u for _, rewards in parts])
                prefixes = to_prefix_batch(log_pf, log_pterm, log_r, u, length)
                partial.append(partial_residuals(prefixes))
        return torch.cat(partial)

    def _step_record(
        self, totals: MicroBatchTotals, plan: RowPlan, seconds: float
    ) -> dict[str, Any]:
        """The metrics.jsonl record of the optimizer step just taken: loss and diagnostics over
        its rows, acc over its on-policy rows, replay fraction and mean temperature over the
        whole plan (all ranks)."""
        loop = self.loop
        sampled = plan.temperature[plan.kind == SAMPLED]
        return {
            "step": loop.step + 1,
            "loss": totals.loss,
            "log_z": float(self.log_z.detach()),
            "acc": len(totals.correct) / totals.on_policy if totals.on_policy else None,
            "unique_correct": len(loop.correct_seen),
            "tb_residual_mean": totals.diagnostics["tb_residual_mean"],
            "aux_loss": totals.diagnostics["aux_loss"],
            "replay_frac": float(np.mean(plan.kind == REPLAYED)),
            "temperature": float(np.mean(sampled)) if sampled.size else None,
            "buffer_size": 0 if self.buffer is None else len(self.buffer),
            "nonfinite_skipped": loop.nonfinite_total,
            "seconds": seconds,
        }
