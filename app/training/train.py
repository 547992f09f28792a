"""The training loop, neutral to the algorithm: steps, checkpoints, the metrics log, stop
signals, non-finite handling, gradient application and distribution.

``Trainer`` builds what every run shares (task, policy, reward calls, prefix scorer, reward
schedule, RNG streams), then the algorithm the ``loss``'s registry entry names
(app.configuration.losses), whose parameter groups join the policy's in one AdamW optimizer; each
logged step is the algorithm's ``optimizer_step`` (app.training.algorithm declares the
interface). The stages an algorithm schedules are those of ``raptb.app.training.step``.

Launched on several processes (``accelerate launch -m raptb train``), each rank trains on its
contiguous share of the step's rows (the behaviour plan is drawn from an RNG all ranks share);
app.distribution.distributed states the rules and supplies the hooks used here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import IO, Any

import numpy as np
import torch
from rich.console import Console

from raptb.adapters.lm.heap import NOT_GLIBC, keep_freed_memory
from raptb.adapters.lm.lanes import Lanes, lane_count
from raptb.adapters.lm.lora import is_peft_model
from raptb.adapters.lm.precision import dtype_name
from raptb.adapters.lm.threads import use_threads
from raptb.adapters.tasks.registry import task_spec
from raptb.app.configuration.config import TrainConfig
from raptb.app.distribution.distributed import DistContext, per_rank_batch, sampling_seed
from raptb.app.distribution.sharding import clip_grad_norm, shard_policy
from raptb.app.reward.calls import RewardCaller
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.reward.schedule import RewardSchedule
from raptb.app.run_dir.checkpoint import checkpoint_step, latest_checkpoint, newest_usable
from raptb.app.run_dir.resume import check_steps
from raptb.app.run_dir.run_config import CONFIG_FILE, save_config
from raptb.app.run_dir.run_log import cut_log, log_path
from raptb.app.run_dir.trackers import Trackers
from raptb.app.task_and_policy import build_policy, build_task
from raptb.app.training.algorithm import Algorithm
from raptb.app.training.micro_batch import (
    MicroBatch,
    MicroBatchLoss,
    MicroBatchTotals,
    combine_micro_batch,
    run_micro_batches,
    step_result,
)
from raptb.app.training.step_batch import step_prompts
from raptb.app.training.stop_request import StopRequest
from raptb.app.training.train_progress import StepPace, bar_fields, progress_bar
from raptb.app.training.train_state import (
    load_model_weights,
    load_trainer_state,
    save_trainer_state,
)
from raptb.app.training.training_error import TrainingError
from raptb.core.replay import ReplayItem

__all__ = ["TrainResult", "Trainer", "TrainingError"]


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    step: int
    interrupted: bool
    checkpoint: Path | None
    stop_signal: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the run early, if one did."""
    stop_reason: str | None = None
    """Why the run stopped early: the signal's name, "time limit" (``time_limit``), or None."""


class Trainer:
    """Trains one run described by a ``TrainConfig`` into ``run_dir``, for any ``loss``.

    Example (the embedded model; a few seconds on a laptop CPU)::

        import raptb

        config = raptb.build_config(overrides={"steps": 2, "optim.batch_size": 8, "threads": 1})
        result = raptb.Trainer(config, "runs/example", progress=False).train()
        print(result.step, result.checkpoint)  # 2 runs/example/checkpoints/step-000002
    """

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
        """The composition root of a run: every part is built here, once, in this order, and the
        loop and the algorithm read them as attributes (app.training.algorithm.Loop lists them).

        1. the process group (``dist``) and this rank's share of the batch;
        2. the checkpoint to resume from (rank 0 chooses, every rank loads the same one);
        3. the task and its constrained policy (model, tokenizer, grammar, LoRA), from the seed;
        4. the reward: the task's score behind a caller, the prefix scorer, the reward schedule;
        5. the shared RNG of the step plans, the step and run counters;
        6. the algorithm the loss's registry entry names, built on this trainer (its objective,
           logZ or value head, replay buffer), and the frozen reference when it needs one;
        7. weights from the checkpoint, activation checkpointing, FSDP sharding, in that order;
        8. AdamW over the policy's trainable parameters and the algorithm's own groups;
        9. per-rank sampling streams, the stop request, the checkpoint's trainer state.
        """
        self.started = monotonic()  # the start of ``time_limit``
        self.cfg = config
        self.dist = (
            DistContext.from_accelerate(config.distributed.timeout) if dist is None else dist
        )
        self.rank_batch = per_rank_batch(config.optim.batch_size, self.dist.world_size)
        self.run_dir = Path(run_dir)
        self.console = console or Console(stderr=True)
        self.show_progress = progress
        if config.threads is not None:
            use_threads(config.threads)
        keep = config.keep_freed_memory
        kept = (self.dist.device.type == "cpu" if keep is None else keep) and keep_freed_memory()
        if keep and not kept:
            self.warn(NOT_GLIBC)
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
            dtype=config.model_dtype,
        )
        # config.toml records the dtype that runs, whether freed memory was kept and the lanes
        # ("auto" and None resolved on this device); a CPU's rollout lanes are processes
        ran = dtype_name(self.policy.model.get_input_embeddings().weight.dtype)
        lean = self.policy.uses_lean_gpt2(self.policy.model)
        lanes = lane_count(config.lanes, self.dist.device, lean, self.dist.sharding, self.warn)
        self.policy.lanes = Lanes(lanes, processes=self.dist.device.type == "cpu")
        self.cfg = config = config.model_copy(
            update={"model_dtype": ran, "keep_freed_memory": kept, "lanes": lanes}
        )
        self.rewards = RewardCaller(
            self.task,
            workers=config.reward.workers,
            name=getattr(config.task_options(), "reward", None),
            max_failed_steps=config.reward.max_failed_steps,
            warn=self.warn,
        )
        self.scorer = PrefixScorer(self.task, self.policy, config.reward.reward_scale, self.rewards)
        self.reward_schedule = RewardSchedule(config.reward, config.schedule_horizon)
        # shared by all ranks: the step's plan (behaviour mix, replay and oracle draws)
        self.rng = np.random.default_rng(config.seed)
        self.step = 0
        self.nonfinite_in_row = 0
        self.nonfinite_total = 0
        self.correct_seen: set[str] = set()
        self.algorithm: Algorithm = config.loss_entry.algorithm_class()(self)
        # with LoRA the reference is the same weights with the adapter disabled: no copy
        if self.algorithm.uses_reference() and not is_peft_model(self.policy.model):
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
        # torch takes the multi-tensor (foreach) update on a GPU by default, one tensor at a time
        # on a CPU; on a CPU the foreach update is the same arithmetic (bit for bit) in fewer
        # operations, which on a small model is most of its time, and the fused one (one C++
        # loop; not over a sharded model's parameters) the same update up to float rounding in
        # fewer still (benchmarks/step_speed.md)
        on_cpu = self.policy.device.type == "cpu"
        self.foreach = True if on_cpu else None
        fused = on_cpu and sharding is None
        self.optimizer = torch.optim.AdamW(
            [
                {
                    "params": params,
                    "lr": config.optim.lr,
                    "weight_decay": config.optim.weight_decay,
                },
                *self.algorithm.param_groups(),
            ],
            foreach=None if fused else self.foreach,
            fused=fused or None,
        )
        # per rank: rollouts and dropout; rank 0 keeps the single-process streams
        self.sampling_seed = sampling_seed(config.seed, self.dist.rank)
        if self.dist.rank:
            torch.manual_seed(self.sampling_seed)
        self.generator = torch.Generator(device=self.policy.device).manual_seed(self.sampling_seed)
        self.stop = StopRequest(
            self.console, config.time_limit, self.started, speaks=self.dist.is_main
        )
        if checkpoint is not None:
            load_trainer_state(self, checkpoint)

    # --- one optimizer step --------------------------------------------------------------------

    def step_rows(self) -> tuple[range, list[str]]:
        """This rank's share of the step's rows (a contiguous range of the global rows) and the
        prompt of every global row (app.training.step_batch)."""
        cfg = self.cfg
        per_rank = self.rank_batch * cfg.optim.grad_accum
        prompts = step_prompts(
            self.task.prompts(),
            self.step,
            per_rank * self.dist.world_size,
            cfg.optim.rows_per_prompt,
        )
        return range(self.dist.rank * per_rank, (self.dist.rank + 1) * per_rank), prompts

    def _optimizer_step(self) -> dict[str, Any] | None:
        """One logged step: the algorithm's (None when it skipped the update)."""
        return self.algorithm.optimizer_step()

    def accumulate(
        self,
        batches: Sequence[MicroBatch],
        loss: MicroBatchLoss,
        *,
        correct: Sequence[str],
        on_policy: int,
        items: Sequence[ReplayItem] = (),
        rewards: Sequence[float] = (),
        in_lanes: bool = False,
    ) -> MicroBatchTotals | None:
        """The skeleton of an optimizer step over micro-batches, which the algorithms share.

        ``loss(parts, rows)`` backpropagates micro-batch ``parts`` (pieces of rows with what the
        algorithm scored them by; this rank's rows ``rows`` of the step) with its weight in the
        step and returns its LossResult, or None when it is not finite (the micro-batches after
        it are skipped). Every rank's outcome is combined (loss and diagnostics weighted by rows,
        ``correct`` texts, ``on_policy`` rows, new replay ``items``, ``rewards``;
        app.training.micro_batch) and the successful texts counted; then the gradients are
        applied and the totals returned, or, when a loss was not finite on some rank, dropped:
        None, every rank skipping the step together. ``in_lanes``: in the policy's lanes
        (``run_micro_batches``: the loss backpropagates by ``lanes.backward``, shares no state)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        lanes = self.policy.lanes if in_lanes else None
        results = run_micro_batches(batches, loss, lanes, [p for p in params if p.requires_grad])
        finite = len(results) == len(batches)
        totals = combine_micro_batch(
            self.dist,
            step_result(results) if finite else None,
            correct,
            on_policy,
            items,
            rewards,
        )
        self.correct_seen.update(totals.correct)
        if not totals.finite:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.apply_gradients()
        return totals

    def apply_gradients(self) -> None:
        """The accumulated gradients averaged over ranks, clipped, and one optimizer step."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.dist.average_gradients(params)  # logZ's gradient too: it is in the param groups
        clip = self.cfg.optim.clip
        if clip is not None and self.dist.sharding is None:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=self.foreach)
        elif clip is not None:
            clip_grad_norm(params, clip)  # one norm over the shards, logZ and any head
        self.optimizer.step()

    # --- the loop ------------------------------------------------------------------------------

    def train(self, stop_at: int | None = None) -> TrainResult:
        """Run until ``cfg.steps`` (or ``stop_at``) optimizer steps; checkpoint every
        ``checkpoint_every`` steps, at the end, and after the step in progress on Ctrl-C or
        SIGTERM (app.training.stop_request) or once ``time_limit`` minutes have passed since the
        trainer was built. The log is first cut back to the step the run starts from
        (app.run_dir.run_log)."""
        cfg = self.cfg
        if self.dist.is_main:  # the other ranks create and delete nothing in the run directory
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / CONFIG_FILE)
            cut_log(self.run_dir, self.step)
        self.dist.barrier()
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        checkpoint = latest_checkpoint(self.run_dir) if self.step else None
        try:
            with self.stop.catching_signals():
                checkpoint = self._run_steps(end, checkpoint)
        finally:
            self.rewards.close()
            self.policy.lanes.close()
            for line in self.rewards.summary_lines():
                self.warn(line)
        return TrainResult(
            self.run_dir,
            self.step,
            self.stop.requested,
            checkpoint,
            self.stop.signum,
            self.stop.reason,
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
            pace = StepPace(cfg.steps)
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
                if (said := pace.step(self.step)) and self.show_progress and self.dist.is_main:
                    bar.console.print(said)
                if self.step % cfg.checkpoint_every == 0 or self.step == end:
                    checkpoint = self.save_checkpoint()
                if self.step < end:
                    self.stop.stop_at_time_limit(self.step)
        self.stop.agree(self.dist.all_gather_object)
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

    # --- checkpoints (app.training.train_state)
    # ---------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Checkpoint the current step (rank 0 writes, with every rank's RNG streams)."""
        return save_trainer_state(self)
