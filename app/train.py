"""The training loop: behaviour mix, replay, objective, optimizer, checkpoints, logging.

One optimizer step holds batch_size x grad_accum trajectories (app.step_batch): each row's
behaviour is drawn for the step (replay.md's mix, per row), the on-policy rows are rolled out
together in one call, the replayed rows come from the buffer as it stands at the step's start, and
all are scored. The loss and its backward then run over micro-batches of ``batch_size`` rows,
each weighted by its share of the step's rows, so the split is a memory knob only: the same seed
and rows per step give the same rollout, loss and update whatever ``grad_accum`` (VarGrad, whose
loss is a variance over the batch, holds the logZ estimate of all the step's rows fixed in every
micro-batch). The buffer is refreshed once per step, with the step's on-policy rows.

Every trajectory is re-scored by the current policy in one teacher-forced forward pass (with
gradients). Rewards (app.reward_schedule): on-policy rows are scored with the task; replayed rows
reuse the task-only rewards u stored with them unless lambda or the reward temperature is
scheduled (then they are scored again, through the cache); when kappa > 0 the reference term
kappa log P_ref is recomputed from the frozen reference model for every row.
The stages are those of ``raptb.app.step``; this module schedules them and owns the optimizer,
checkpoints and logging.

logZ is a float32 scalar in its own AdamW parameter group with its own learning rate.

Launched on several processes (``accelerate launch -m raptb train``), each rank trains on its
contiguous share of the step's rows (the behaviour plan is drawn from an RNG all ranks share);
app.distributed states the rules and supplies the hooks used here.
"""

from __future__ import annotations

import json
import random
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from rich.console import Console

from raptb.adapters.lora import is_peft_model
from raptb.adapters.policy import to_prefix_batch
from raptb.adapters.registry import task_spec
from raptb.app.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    newest_usable,
)
from raptb.app.config import RL_LOSSES, TrainConfig, save_config
from raptb.app.distributed import DistContext, per_rank_batch, sampling_seed
from raptb.app.micro_batch import MicroBatchTotals, combine_micro_batch
from raptb.app.mix_schedule import MixSchedule
from raptb.app.prefix_reward import PrefixScorer
from raptb.app.replay_items import new_items
from raptb.app.replay_setup import build_buffer
from raptb.app.resume import check_steps
from raptb.app.reward_calls import RewardCaller
from raptb.app.reward_schedule import RewardSchedule
from raptb.app.run_log import cut_log, log_path
from raptb.app.runtime import build_policy, build_task
from raptb.app.sharding import clip_grad_norm, shard_policy
from raptb.app.step import (
    LossResult,
    Rewards,
    Trajectories,
    correct_texts,
    loss_step,
    reward,
    row_prompts,
    with_prior,
)
from raptb.app.step_batch import (
    REPLAYED,
    SAMPLED,
    RowPlan,
    StepBatch,
    collect_step,
    micro_batches,
    plan_rows,
    step_prompts,
)
from raptb.app.stop_request import StopRequest
from raptb.app.trackers import Trackers
from raptb.app.train_progress import bar_fields, progress_bar
from raptb.app.train_state import load_model_weights, load_trainer_state, save_trainer_state
from raptb.core.objectives import VarGrad, objective_by_name


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many consecutive non-finite losses)."""


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    step: int
    interrupted: bool
    checkpoint: Path | None
    stop_signal: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the run early, if one did."""


def step_result(results: list[tuple[int, LossResult]]) -> LossResult:
    """A step's loss and diagnostics from its micro-batches' (rows, result): means weighted by
    rows, i.e. over the step's rows for a loss that is a mean over rows."""
    rows = sum(size for size, _ in results)
    keys = results[0][1].diagnostics
    return LossResult(
        sum(size * r.loss for size, r in results) / rows,
        {k: sum(size * r.diagnostics[k] for size, r in results) / rows for k in keys},
    )


class Trainer:
    """Trains one run described by a ``TrainConfig`` into ``run_dir``."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        progress: bool = True,
        console: Console | None = None,
        dist: DistContext | None = None,
    ) -> None:
        self.cfg = config
        self.dist = (
            DistContext.from_accelerate(config.distributed.timeout) if dist is None else dist
        )
        self.rank_batch = per_rank_batch(config.optim.batch_size, self.dist.world_size)
        self.run_dir = Path(run_dir)
        self.console = console or Console(stderr=True)
        self.show_progress = progress
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        # rank 0 verifies and chooses, so every rank loads the same checkpoint
        checkpoint = (
            self.dist.on_main(lambda: newest_usable(self.run_dir, self.warn)) if resume else None
        )
        if resume and checkpoint is None:
            raise TrainingError(f"--resume: no checkpoint in {self.run_dir / 'checkpoints'}")
        if checkpoint is not None:
            check_steps(config.steps, checkpoint_step(checkpoint))

        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.task = build_task(config)
        self.spec = task_spec(config.task)  # travels with the task: no lookups per step
        self.policy = build_policy(
            config.model,
            self.task,
            config.seed,
            lora=config.lora,
            device=self.dist.device,
            decode=config.sampling.decode,
            tiny=config.tiny,
        )
        self.rewards = RewardCaller(
            self.task,
            workers=config.reward.workers,
            name=getattr(config.task_options(), "reward", None),
            max_failed_steps=config.reward.max_failed_steps,
            warn=self.warn,
        )
        self.scorer = PrefixScorer(self.task, self.policy, config.reward.reward_scale, self.rewards)
        self.log_z = torch.nn.Parameter(torch.tensor(config.optim.log_z_init, dtype=torch.float32))
        self.objective = self._build_objective()
        # with LoRA the reference is the same weights with the adapter disabled: no copy
        if self._uses_reference() and not is_peft_model(self.policy.model):
            self.policy.freeze_reference()  # the base weights, before any update or resume
        if checkpoint is not None:
            load_model_weights(self.policy.model, checkpoint)  # before sharding, if any
        sharding = self.dist.sharding
        if config.optim.gradient_checkpointing or (sharding and sharding.activation_checkpointing):
            self.policy.enable_activation_checkpointing()  # before sharding, if any
        if self.dist.sharding is not None:
            blocks = shard_policy(self.policy, self.dist.sharding, self.dist.all_true)
            if self.dist.is_main:
                self.console.print(
                    f"FSDP: the policy is sharded over {self.dist.world_size} processes "
                    f"({blocks} blocks and the root as units)",
                    markup=False,
                    highlight=False,
                )
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            [
                {
                    "params": params,
                    "lr": config.optim.lr,
                    "weight_decay": config.optim.weight_decay,
                },
                {"params": [self.log_z], "lr": config.optim.log_z_lr, "weight_decay": 0.0},
                *self._extra_param_groups(),
            ]
        )
        horizon = config.schedule_horizon
        self.mix = MixSchedule(config, horizon)
        self.reward_schedule = RewardSchedule(config.reward, horizon)
        self.buffer = build_buffer(config, self.task, self.policy, self.scorer)
        self.oracle = self.buffer if config.replay.kind == "oracle" else None

        # shared by all ranks: the step's plan (behaviour mix, replay and oracle draws)
        self.rng = np.random.default_rng(config.seed)
        # per rank: rollouts and dropout; rank 0 keeps the single-process streams
        self.sampling_seed = sampling_seed(config.seed, self.dist.rank)
        if self.dist.rank:
            torch.manual_seed(self.sampling_seed)
        self.generator = torch.Generator(device=self.policy.device).manual_seed(self.sampling_seed)
        self.step = 0
        self.nonfinite_in_row = 0
        self.nonfinite_total = 0
        self.correct_seen: set[str] = set()
        self.stop = StopRequest(self.console)
        if checkpoint is not None:
            load_trainer_state(self, checkpoint)

    # --- construction --------------------------------------------------------------------------
    # _build_objective, _uses_reference, _extra_param_groups, extra_state, load_extra_state: what
    # a trainer of
    # another objective family (app.rl_train) replaces

    def _build_objective(self) -> Any:
        if self.cfg.loss in RL_LOSSES:
            raise TrainingError(
                f"loss {self.cfg.loss!r} is an RL baseline, which Trainer (GFlowNet objectives) "
                "does not train: use make_trainer(config, run_dir), which builds an RLTrainer"
            )
        return objective_by_name(self.cfg.loss, **self.cfg.objective_kwargs())

    def _uses_reference(self) -> bool:
        """Whether training reads the frozen reference model (here: the kappa log P_ref prior)."""
        return self.cfg.reward.kappa > 0

    def _extra_param_groups(self) -> list[dict[str, Any]]:
        return []

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        """Restore what ``extra_state`` saved into ``trainer.pt``."""

    # --- one optimizer step --------------------------------------------------------------------

    def _step_rows(self) -> tuple[range, list[str]]:
        """This rank's share of the step's rows (a contiguous range of the global rows) and the
        prompt of every global row (app.step_batch)."""
        cfg = self.cfg
        per_rank = self.rank_batch * cfg.optim.grad_accum
        prompts = step_prompts(
            self.task.prompts(),
            self.step,
            per_rank * self.dist.world_size,
            cfg.optim.rows_per_prompt,
        )
        return range(self.dist.rank * per_rank, (self.dist.rank + 1) * per_rank), prompts

    def _collect(self) -> StepBatch:
        """The step's rows on this rank: the shared plan, then one rollout of its sampled rows."""
        own, prompts = self._step_rows()
        plan = plan_rows(
            prompts, self.mix.at(self.step), buffer=self.buffer, oracle=self.oracle, rng=self.rng
        )
        return collect_step(self.policy, self.task, plan, own, generator=self.generator)

    def _optimizer_step(self) -> dict[str, Any] | None:
        """Collect and score the step's rows, backpropagate the loss over micro-batches of this
        rank's share of batch_size, refresh the buffer once; None (no update) when the loss is
        not finite on some rank."""
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step = self._collect()
        weights = self.reward_schedule.at(self.step)
        # task rewards piece by piece; the reference prior of all the step's rows in one forward
        scored = with_prior(
            self.policy,
            [
                (
                    piece,
                    reward(self.scorer, self.policy, piece, 0.0, weights.scale, weights.rescore),
                )
                for piece in step.pieces
            ],
            weights.kappa,
        )
        correct = [
            text
            for piece, rewards in scored
            for text in correct_texts(self.task, piece, rewards, self.spec)
        ]
        agree = self.dist.all_true if self.dist.sharding else None
        batches = [
            [(scored[i][0].take(rows), scored[i][1].take(rows)) for i, rows in parts]
            for parts in micro_batches([len(p.rows) for p in step.pieces], self.rank_batch)
        ]
        held = self._held_kwargs(batches)
        results: list[tuple[int, LossResult]] = []
        for parts in batches:
            size = sum(len(batch.rows) for batch, _ in parts)
            result = loss_step(
                self.policy,
                self.objective,
                self.log_z,
                parts,
                self.step,
                size / step.rows,
                agree=agree,
                **held,
            )
            if result is None:
                break
            results.append((size, result))
        finite = len(results) == len(batches)
        replays = self.buffer is not None and self.oracle is None
        items = [
            item
            for piece, rewards in scored
            if replays
            for item in new_items(self.task, piece, rewards, self.spec)
        ]
        on_policy = sum(len(piece.on_policy) for piece in step.pieces)
        totals = combine_micro_batch(
            self.dist, step_result(results) if finite else None, correct, on_policy, items
        )
        self.correct_seen.update(totals.correct)
        if not totals.finite:
            self.optimizer.zero_grad(set_to_none=True)
            return None  # every rank skips the step together
        if self.buffer is not None and totals.items:
            self.buffer.add(totals.items)
        self._apply_gradients()
        return self._step_record(totals, step.plan, time.perf_counter() - start)

    def _held_kwargs(self, batches: list[list[tuple[Trajectories, Rewards]]]) -> dict[str, Any]:
        """What the objective holds fixed over the step's micro-batches: VarGrad's logZ estimate
        from all of this rank's rows (a forward without gradients first), so that its batch is
        the step; nothing for the other objectives, whose loss is a mean over rows."""
        if not isinstance(self.objective, VarGrad) or len(batches) == 1:
            return {}
        partial = []
        with torch.no_grad():
            for parts in batches:  # one forward per micro-batch, as its loss takes
                length = torch.cat([batch.length for batch, _ in parts])
                log_pf, log_pterm = self.policy.score(
                    row_prompts(batch for batch, _ in parts),
                    torch.cat([batch.tokens for batch, _ in parts]),
                    length,
                )
                log_r = torch.cat([rewards.log_r for _, rewards in parts])
                u = torch.cat([rewards.u for _, rewards in parts])
                prefixes = to_prefix_batch(log_pf, log_pterm, log_r, u, length)
                partial.append(self.objective.partial_residuals(prefixes))
        return {"log_z_hat": -torch.cat(partial).mean()}

    def _apply_gradients(self) -> None:
        """The accumulated gradients averaged over ranks, clipped, and one optimizer step."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.dist.average_gradients(params)  # logZ's gradient too: it is in the param groups
        clip = self.cfg.optim.clip
        if clip is not None and self.dist.sharding is None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        elif clip is not None:
            clip_grad_norm(params, clip)  # one norm over the shards, logZ and any head
        self.optimizer.step()

    def _step_record(
        self, totals: MicroBatchTotals, plan: RowPlan, seconds: float
    ) -> dict[str, Any]:
        """The metrics.jsonl record of the optimizer step just taken: loss and diagnostics over
        its rows, acc over its on-policy rows, replay fraction and mean temperature over the
        whole plan (all ranks)."""
        sampled = plan.temperature[plan.kind == SAMPLED]
        return {
            "step": self.step + 1,
            "loss": totals.loss,
            "log_z": float(self.log_z.detach()),
            "acc": len(totals.correct) / totals.on_policy if totals.on_policy else None,
            "unique_correct": len(self.correct_seen),
            "tb_residual_mean": totals.diagnostics["tb_residual_mean"],
            "aux_loss": totals.diagnostics["aux_loss"],
            "replay_frac": float(np.mean(plan.kind == REPLAYED)),
            "temperature": float(np.mean(sampled)) if sampled.size else None,
            "buffer_size": 0 if self.buffer is None else len(self.buffer),
            "nonfinite_skipped": self.nonfinite_total,
            "seconds": seconds,
        }

    # --- the loop ------------------------------------------------------------------------------

    def train(self, stop_at: int | None = None) -> TrainResult:
        """Run until ``cfg.steps`` (or ``stop_at``) optimizer steps; checkpoint every
        ``checkpoint_every`` steps, at the end, and after the step in progress on Ctrl-C or
        SIGTERM (app.stop_request). The log is first cut back to the step the run starts from
        (app.run_log)."""
        cfg = self.cfg
        if self.dist.is_main:  # the other ranks create and delete nothing in the run directory
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / "config.toml")
            cut_log(self.run_dir, self.step)
        self.dist.barrier()
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        checkpoint = latest_checkpoint(self.run_dir) if self.step else None
        try:
            with self.stop.catching_signals():
                checkpoint = self._run_steps(end, checkpoint)
        finally:
            self.rewards.close()
            for line in self.rewards.summary_lines():
                self.warn(line)
        return TrainResult(
            self.run_dir, self.step, self.stop.requested, checkpoint, self.stop.signum
        )

    def _run_steps(self, end: int, checkpoint: Path | None) -> Path | None:
        """Optimizer steps up to ``end`` or a stop request; the latest checkpoint afterwards."""
        cfg = self.cfg
        with (
            progress_bar(self.console, self.show_progress and self.dist.is_main) as bar,
            self._log_file() as log,
            self._trackers() as trackers,
        ):
            task_id = bar.add_task("train", total=cfg.steps, completed=self.step, **bar_fields())
            while self.step < end and not self.dist.any_true(self.stop.requested):
                record = self._optimizer_step()
                reward_counts = self.dist.sum_counts(self.rewards.take_counts(self.step + 1))
                if record is None:
                    self.nonfinite_in_row += 1
                    self.nonfinite_total += 1
                    if self.nonfinite_in_row >= cfg.max_nonfinite:
                        raise TrainingError(
                            f"{self.nonfinite_in_row} consecutive steps had a non-finite loss "
                            f"(step {self.step + 1}); lower the learning rates or check the "
                            "reward (max_nonfinite sets this limit)"
                        )
                    continue
                self.nonfinite_in_row = 0
                self.step += 1
                record.update(reward_counts)
                if log is not None:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if trackers is not None:
                    trackers.log_train(record)
                bar.update(task_id, completed=self.step, **bar_fields(record))
                if self.step % cfg.checkpoint_every == 0 or self.step == end:
                    checkpoint = self.save_checkpoint()
        self.stop.requested = self.dist.any_true(self.stop.requested)
        if self.stop.requested and (checkpoint is None or self.step % cfg.checkpoint_every):
            checkpoint = self.save_checkpoint()
        return checkpoint

    def _log_file(self) -> AbstractContextManager[IO[str] | None]:
        """metrics.jsonl opened for appending on rank 0; nothing on the other ranks."""
        return log_path(self.run_dir).open("a") if self.dist.is_main else nullcontext()

    def _trackers(self) -> AbstractContextManager[Trackers | None]:
        """The experiment trackers of ``report_to`` on rank 0 (none elsewhere or when none are
        named); a resumed run's TensorBoard hides what was logged after its checkpoint."""
        if not self.dist.is_main or not self.cfg.trackers:
            return nullcontext()
        config = self.cfg.model_dump(mode="json", exclude_none=True)
        return Trackers.open(self.cfg.trackers, self.run_dir, config, first_step=self.step + 1)

    def warn(self, line: str) -> None:
        """One yellow warning line on the console."""
        self.console.print(
            f"warning: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True
        )

    # --- checkpoints (app.train_state) ---------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Checkpoint the current step (rank 0 writes, with every rank's RNG streams)."""
        return save_trainer_state(self)
