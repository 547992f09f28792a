"""The training loop: behaviour mix, replay, objective, optimizer, checkpoints, logging.

One optimizer step accumulates ``grad_accum`` micro-batches of ``batch_size`` trajectories. A
micro-batch is (replay.md "How replay enters training"):

- with probability p_replay(step), when the buffer holds items, drawn whole from the buffer;
- otherwise sampled on-policy at temperature 1, or with probability ``low_temp_prob`` at a
  temperature drawn uniformly from [T_lo(step), T_hi(step)], then added to the buffer; with Oracle
  replay, with probability p_oracle(step) a fraction ``oracle_fraction`` of its rows is replaced by
  oracle solutions (teacher-forced).

Every trajectory is re-scored by the current policy in one teacher-forced forward pass (with
gradients). Rewards (app.reward_schedule): on-policy rows are scored with the task; replayed rows
reuse the task-only rewards u stored with them unless lambda or the reward temperature is
scheduled (then they are scored again, through the cache); when kappa > 0 the reference term
kappa log P_ref is recomputed from the frozen reference model for every batch.
The micro-batch itself is the four stages of ``raptb.app.step`` (collect, reward, loss, buffer
update); this module schedules them and owns the optimizer, checkpoints and logging.

logZ is a float32 scalar in its own AdamW parameter group with its own learning rate.
"""

from __future__ import annotations

import json
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import AutoModelForCausalLM

from raptb.adapters.lora import is_peft_model, load_adapter_weights
from raptb.adapters.registry import task_spec
from raptb.app.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    newest_usable,
    read_state,
    save_atomically,
    write_state,
)
from raptb.app.config import TrainConfig, save_config
from raptb.app.resume import check_steps
from raptb.app.reward_calls import RewardCaller
from raptb.app.reward_schedule import RewardSchedule
from raptb.app.run_log import cut_log, log_path
from raptb.app.runtime import PrefixScorer, build_policy, build_task
from raptb.app.step import (
    Mix,
    collect,
    correct_texts,
    loss_step,
    new_items,
    replay_items,
    reward,
)
from raptb.core.objectives import objective_by_name
from raptb.core.replay import ReplayBuffer, ReplayItem, make_buffer
from raptb.core.schedules import LinearSchedule


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


@dataclass
class _MicroStats:
    loss: float
    diagnostics: dict[str, float]
    on_policy: int
    hits: int
    replayed: bool
    temperature: float


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
    ) -> None:
        self.cfg = config
        self.run_dir = Path(run_dir)
        self.console = console or Console(stderr=True)
        self.show_progress = progress
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        checkpoint = newest_usable(self.run_dir, self._warn) if resume else None
        if resume and checkpoint is None:
            raise TrainingError(f"--resume: no checkpoint in {self.run_dir / 'checkpoints'}")
        if checkpoint is not None:
            check_steps(config.steps, checkpoint_step(checkpoint))

        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.task = build_task(config)
        self.policy = build_policy(config.model, self.task, config.seed, lora=config.lora)
        # with LoRA the reference is the same weights with the adapter disabled: no copy
        if config.reward.kappa > 0 and not is_peft_model(self.policy.model):
            self.policy.freeze_reference()  # the base weights, before any update or resume
        self.rewards = RewardCaller(
            self.task,
            workers=config.reward.workers,
            name=getattr(config.task_options(), "reward", None),
            max_failed_steps=config.reward.max_failed_steps,
            warn=self._warn,
        )
        self.scorer = PrefixScorer(self.task, self.policy, config.reward.reward_scale, self.rewards)
        self.log_z = torch.nn.Parameter(torch.tensor(config.optim.log_z_init, dtype=torch.float32))
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            [
                {
                    "params": params,
                    "lr": config.optim.lr,
                    "weight_decay": config.optim.weight_decay,
                },
                {"params": [self.log_z], "lr": config.optim.log_z_lr, "weight_decay": 0.0},
            ]
        )
        self.objective = objective_by_name(config.loss, **config.objective_kwargs())
        horizon = config.schedule_horizon
        self.p_replay = LinearSchedule(*config.replay.p_replay, horizon)
        self.p_oracle = LinearSchedule(*config.replay.p_oracle, horizon)
        self.temp_lo = LinearSchedule(*config.sampling.temp_lo, horizon)
        self.temp_hi = LinearSchedule(*config.sampling.temp_hi, horizon)
        self.reward_schedule = RewardSchedule(config.reward, horizon)
        self.buffer = self._build_buffer()
        self.oracle = self.buffer if config.replay.kind == "oracle" else None

        self.rng = np.random.default_rng(config.seed)
        self.generator = torch.Generator(device=self.policy.device).manual_seed(config.seed)
        self.step = 0
        self.nonfinite_in_row = 0
        self.nonfinite_total = 0
        self.correct_seen: set[str] = set()
        self._stop_requested = False
        self._stop_signal: int | None = None
        if checkpoint is not None:
            self._load_checkpoint(checkpoint)

    # --- construction --------------------------------------------------------------------------

    def _build_buffer(self) -> ReplayBuffer | None:
        kind = self.cfg.replay.kind
        if kind == "none":
            return None
        if kind == "oracle":
            return make_buffer("oracle", items=self._oracle_items())
        return make_buffer(kind, **self.cfg.replay.buffer_kwargs())

    def _oracle_items(self) -> list[ReplayItem]:
        solutions = task_spec(self.cfg.task).solutions
        if solutions is None:
            raise TrainingError(f"replay 'oracle' needs an enumerable task, not {self.cfg.task!r}")
        prompt = self.task.prompts()[0]
        encode = self.policy.tokenizer
        rows = [
            tuple(encode.encode(text, add_special_tokens=False)) for text in solutions(self.task)
        ]
        texts = [self.scorer.texts(tokens)[-1] for tokens in rows]
        scored = self.scorer.score_rows(prompt, rows, self.task.max_length, texts)
        return replay_items(self.task, prompt, rows, texts, scored, range(len(rows)), scored.u)

    # --- one micro-batch -----------------------------------------------------------------------

    def _mix(self) -> Mix:
        """The behaviour mix at the current step."""
        cfg, step = self.cfg, self.step
        return Mix(
            p_replay=self.p_replay(step),
            low_temp_prob=cfg.sampling.low_temp_prob,
            temp_lo=self.temp_lo(step),
            temp_hi=self.temp_hi(step),
            p_oracle=self.p_oracle(step),
            oracle_fraction=cfg.replay.oracle_fraction,
        )

    def _micro_batch(self, prompt: str) -> _MicroStats | None:
        """The four stages of app.step on one micro-batch; None when its loss is not finite."""
        cfg = self.cfg
        batch = collect(
            self.policy,
            self.task,
            prompt,
            cfg.optim.batch_size,
            self._mix(),
            buffer=self.buffer,
            oracle=self.oracle,
            rng=self.rng,
            generator=self.generator,
        )
        weights = self.reward_schedule.at(self.step)
        rewards = reward(
            self.scorer, self.policy, batch, weights.kappa, weights.scale, weights.rescore
        )
        correct = correct_texts(self.task, batch, rewards)
        self.correct_seen.update(correct)
        result = loss_step(
            self.policy, self.objective, self.log_z, batch, rewards, self.step, cfg.optim.grad_accum
        )
        if result is None:
            return None
        if self.buffer is not None and self.oracle is None:
            items = new_items(self.task, batch, rewards)
            if items:
                self.buffer.add(items)
        return _MicroStats(
            loss=result.loss,
            diagnostics=result.diagnostics,
            on_policy=len(batch.on_policy),
            hits=len(correct),
            replayed=batch.replayed,
            temperature=batch.temperature,
        )

    # --- one optimizer step --------------------------------------------------------------------

    def _optimizer_step(self) -> dict[str, Any] | None:
        cfg = self.cfg
        prompts = self.task.prompts()
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        stats: list[_MicroStats] = []
        start = time.perf_counter()
        for micro in range(cfg.optim.grad_accum):
            prompt = prompts[(self.step * cfg.optim.grad_accum + micro) % len(prompts)]
            result = self._micro_batch(prompt)
            if result is None:
                self.optimizer.zero_grad(set_to_none=True)
                return None
            stats.append(result)
        if cfg.optim.clip is not None:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip)
        self.optimizer.step()
        on_policy = sum(s.on_policy for s in stats)
        sampled = [s.temperature for s in stats if not s.replayed]
        return {
            "step": self.step + 1,
            "loss": float(np.mean([s.loss for s in stats])),
            "log_z": float(self.log_z.detach()),
            "acc": sum(s.hits for s in stats) / on_policy if on_policy else None,
            "unique_correct": len(self.correct_seen),
            "tb_residual_mean": float(np.mean([s.diagnostics["tb_residual_mean"] for s in stats])),
            "aux_loss": float(np.mean([s.diagnostics["aux_loss"] for s in stats])),
            "replay_frac": float(np.mean([s.replayed for s in stats])),
            "temperature": float(np.mean(sampled)) if sampled else None,
            "buffer_size": 0 if self.buffer is None else len(self.buffer),
            "nonfinite_skipped": self.nonfinite_total,
            "seconds": time.perf_counter() - start,
        }

    # --- the loop ------------------------------------------------------------------------------

    def train(self, stop_at: int | None = None) -> TrainResult:
        """Run until ``cfg.steps`` (or ``stop_at``) optimizer steps; checkpoint every
        ``checkpoint_every`` steps, at the end, and after the step in progress on Ctrl-C or
        SIGTERM. The log is first cut back to the step the run starts from (app.run_log)."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.toml")
        cut_log(self.run_dir, self.step)
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        # only signals nobody else handles: an embedding application keeps its own handlers
        previous = {
            signum: handler
            for signum, handler in (
                (signal.SIGINT, signal.getsignal(signal.SIGINT)),
                (signal.SIGTERM, signal.getsignal(signal.SIGTERM)),
            )
            if handler in (signal.default_int_handler, signal.SIG_DFL)
        }
        for signum in previous:
            signal.signal(signum, self._on_interrupt)
        checkpoint = latest_checkpoint(self.run_dir) if self.step else None
        try:
            with self._progress() as bar, log_path(self.run_dir).open("a") as log:
                task_id = bar.add_task("train", total=cfg.steps, completed=self.step, **_fields())
                while self.step < end and not self._stop_requested:
                    record = self._optimizer_step()
                    reward_counts = self.rewards.take_counts(self.step + 1)
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
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    bar.update(task_id, completed=self.step, **_fields(record))
                    if self.step % cfg.checkpoint_every == 0 or self.step == end:
                        checkpoint = self.save_checkpoint()
            if self._stop_requested and (checkpoint is None or self.step % cfg.checkpoint_every):
                checkpoint = self.save_checkpoint()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.rewards.close()
            for line in self.rewards.summary_lines():
                self._warn(line)
        return TrainResult(
            self.run_dir, self.step, self._stop_requested, checkpoint, self._stop_signal
        )

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        # First Ctrl-C or SIGTERM (preemption, docker stop): finish the step in progress,
        # checkpoint, stop. A second one aborts, with the signal's default action.
        self._stop_requested = True
        self._stop_signal = signum
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, default)
        name = signal.Signals(signum).name
        self.console.print(f"[yellow]{name}: finishing this step and checkpointing...[/]")

    def _warn(self, line: str) -> None:
        self.console.print(
            f"warning: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True
        )

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("[bold]step[/] {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn(
                "loss {task.fields[loss]} logZ {task.fields[log_z]} acc {task.fields[acc]} "
                "correct {task.fields[unique_correct]}"
            ),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.show_progress,
            transient=False,
        )

    # --- checkpoints ---------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        def write(folder: Path) -> None:
            model_dir = folder / "model"
            self.policy.model.save_pretrained(model_dir, safe_serialization=True)
            self.policy.tokenizer.save_pretrained(model_dir)
            torch.save(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "log_z": self.log_z.detach().clone(),
                    "torch_rng": torch.get_rng_state(),
                    "generator": self.generator.get_state(),
                },
                folder / "trainer.pt",
            )
            py_state = random.getstate()
            write_state(
                folder,
                {
                    "step": self.step,
                    "nonfinite_in_row": self.nonfinite_in_row,
                    "nonfinite_total": self.nonfinite_total,
                    "correct_seen": sorted(self.correct_seen),
                    "numpy_rng": self.rng.bit_generator.state,
                    "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
                    "buffer": None if self.buffer is None else self.buffer.state_dict(),
                },
            )

        return save_atomically(self.run_dir, self.step, write, self.cfg.keep_checkpoints)

    def _load_checkpoint(self, folder: Path) -> None:
        if is_peft_model(self.policy.model):
            load_adapter_weights(self.policy.model, folder / "model")
        else:
            trained = AutoModelForCausalLM.from_pretrained(folder / "model")
            self.policy.model.load_state_dict(trained.state_dict())
        saved = torch.load(folder / "trainer.pt", weights_only=True)
        with torch.no_grad():
            self.log_z.copy_(saved["log_z"])
        self.optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        self.generator.set_state(saved["generator"])
        state = read_state(folder)
        self.step = int(state["step"])
        self.nonfinite_in_row = int(state["nonfinite_in_row"])
        self.nonfinite_total = int(state["nonfinite_total"])
        self.correct_seen = set(state["correct_seen"])
        self.rng.bit_generator.state = state["numpy_rng"]
        version, internal, gauss = state["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        if self.buffer is not None and self.oracle is None and state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])


def _fields(record: dict[str, Any] | None = None) -> dict[str, str]:
    record = record or {}

    def fmt(key: str, spec: str) -> str:
        value = record.get(key)
        return "-" if value is None else format(value, spec)

    return {
        "loss": fmt("loss", ".3g"),
        "log_z": fmt("log_z", ".2f"),
        "acc": fmt("acc", ".2f"),
        "unique_correct": fmt("unique_correct", "d"),
    }
