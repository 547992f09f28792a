"""The training loop: behaviour mix, replay, objective, optimizer, checkpoints, logging.

One optimizer step accumulates ``grad_accum`` micro-batches of ``batch_size`` trajectories. A
micro-batch is (replay.md "How replay enters training"):

- with probability p_replay(step), when the buffer holds items, drawn whole from the buffer;
- otherwise sampled on-policy at temperature 1, or with probability ``low_temp_prob`` at a
  temperature drawn uniformly from [T_lo(step), T_hi(step)], then added to the buffer; with Oracle
  replay, with probability p_oracle(step) a fraction ``oracle_fraction`` of its rows is replaced by
  oracle solutions (teacher-forced).

Every trajectory is re-scored by the current policy in one teacher-forced forward pass (with
gradients). Rewards: on-policy rows are scored with the task; replayed rows reuse the task-only
rewards u stored with them (the reward is not scheduled, so they are exact); when kappa > 0 the
reference term kappa log P_ref is recomputed from the frozen reference model for every batch.

logZ is a float32 scalar in its own AdamW parameter group with its own learning rate.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import AutoModelForCausalLM

from raptb.adapters.expr24 import enumerate_solutions
from raptb.adapters.lora import is_peft_model, load_adapter_weights
from raptb.adapters.policy import to_prefix_batch
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
from raptb.app.run_log import cut_log, log_path
from raptb.app.runtime import (
    PrefixScorer,
    ScoredRows,
    build_policy,
    build_task,
    is_success,
    pad_rows,
    reference_log_prob,
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
            name=config.custom.reward if config.task == "custom" else None,
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
        kind, capacity = self.cfg.replay.kind, self.cfg.replay.capacity
        if kind == "none":
            return None
        if kind == "oracle":
            return make_buffer("oracle", items=self._oracle_items())
        if kind == "subm":
            return make_buffer(
                "subm",
                task=self.cfg.task,
                capacity=capacity,
                diversity=self.cfg.replay.subm_diversity,
            )
        return make_buffer(kind, capacity=capacity)

    def _oracle_items(self) -> list[ReplayItem]:
        if self.cfg.task != "expr24":
            raise TrainingError(f"replay 'oracle' needs an enumerable task, not {self.cfg.task!r}")
        prompt = self.task.prompts()[0]
        encode = self.policy.tokenizer
        rows = [
            tuple(encode.encode(text, add_special_tokens=False))
            for text in enumerate_solutions(self.task.max_length)
        ]
        return self._make_items(prompt, rows)

    def _make_items(self, prompt: str, rows: list[tuple[int, ...]]) -> list[ReplayItem]:
        scored = self.scorer.score_rows(prompt, rows, self.task.max_length)
        return self._items(prompt, rows, scored, range(len(rows)))

    def _items(
        self,
        prompt: str,
        rows: list[tuple[int, ...]],
        scored: ScoredRows,
        indices: Iterable[int],
    ) -> list[ReplayItem]:
        """Replay items of ``rows[b]`` for b in ``indices``, with their task-only rewards as
        log-rewards (the caller adds the reference term when kappa > 0)."""
        items = []
        for b in indices:
            tokens = rows[b]
            text = self.scorer.texts(tokens)[-1]
            u = scored.u[b, : len(tokens) + 1]
            items.append(
                ReplayItem(
                    prompt=prompt,
                    tokens=tokens,
                    text=text,
                    log_r=u,
                    u=u,
                    valid=scored.scores[b].valid,
                    **self._item_extras(prompt, text),
                )
            )
        return items

    def _item_extras(self, prompt: str, text: str) -> dict[str, Any]:
        """Replay-item ``features`` and ``canonical`` from a task that defines ``item_features``
        (SMILES: the merged molecule's fingerprint and canonical SMILES); none otherwise."""
        describe = getattr(self.task, "item_features", None)
        if describe is None:
            return {}
        extras = describe(prompt, text)
        return {"features": extras.features, "canonical": extras.canonical}

    # --- one micro-batch -----------------------------------------------------------------------

    def _micro_batch(self, prompt: str) -> _MicroStats | None:
        cfg, step = self.cfg, self.step
        n, max_len = cfg.optim.batch_size, self.task.max_length
        replay = (
            self.buffer is not None
            and prompt in self.buffer.prompts()
            and self.rng.random() < self.p_replay(step)
        )
        temperature = 1.0
        new_items: list[ReplayItem] = []
        policy_rows: list[int] = []
        hits = 0
        if replay:
            assert self.buffer is not None
            items = self.buffer.sample(n, self.rng, prompt)
            rows = [it.tokens for it in items]
            u = np.zeros((n, max_len + 1))
            for b, it in enumerate(items):
                u[b, : it.length + 1] = it.u
        else:
            if self.rng.random() < cfg.sampling.low_temp_prob:
                temperature = float(self.rng.uniform(self.temp_lo(step), self.temp_hi(step)))
            rollout = self.policy.sample(
                prompt,
                n,
                min_length=self.task.min_length,
                max_length=max_len,
                temperature=temperature,
                generator=self.generator,
            )
            lengths = rollout.length.tolist()
            rows = [tuple(rollout.tokens[b, : lengths[b]].tolist()) for b in range(n)]
            policy_rows = list(range(n))
            if self.oracle is not None and self.rng.random() < self.p_oracle(step):
                swap = self.rng.choice(n, size=round(cfg.replay.oracle_fraction * n), replace=False)
                for b, it in zip(
                    swap, self.oracle.sample(len(swap), self.rng, prompt), strict=True
                ):
                    rows[int(b)] = it.tokens
                policy_rows = sorted(set(policy_rows) - {int(b) for b in swap})
            scored = self.scorer.score_rows(prompt, rows, max_len)
            u = scored.u
            for b in policy_rows:
                if is_success(self.task, scored.scores[b]):
                    hits += 1
                    self.correct_seen.add(self.scorer.texts(rows[b])[-1])
            if self.buffer is not None and self.oracle is None:
                new_items = self._items(prompt, rows, scored, policy_rows)

        device = self.policy.device
        tokens = pad_rows(rows, max_len, self.policy.pad_id).to(device)
        length = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
        u_t = torch.as_tensor(u, dtype=torch.float32, device=device)
        log_r = u_t
        if cfg.reward.kappa > 0:
            log_r = u_t + cfg.reward.kappa * reference_log_prob(self.policy, prompt, tokens, length)
        if new_items and cfg.reward.kappa > 0:
            log_r_np = log_r.double().cpu().numpy()
            new_items = [
                replace(it, log_r=log_r_np[b, : it.length + 1])
                for b, it in zip(policy_rows, new_items, strict=True)
            ]
        log_pf, log_pterm = self.policy.score(prompt, tokens, length)
        if not (torch.isfinite(log_pf).all() and torch.isfinite(log_pterm).all()):
            return None
        batch = to_prefix_batch(log_pf, log_pterm, log_r, u_t, length)
        loss, diagnostics = self.objective(batch, self.log_z, step)
        if not torch.isfinite(loss):
            return None
        (loss / cfg.optim.grad_accum).backward()
        if new_items:
            assert self.buffer is not None
            self.buffer.add(new_items)
        return _MicroStats(
            loss=float(loss.detach()),
            diagnostics=diagnostics,
            on_policy=0 if replay else len(policy_rows),
            hits=hits,
            replayed=replay,
            temperature=temperature,
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
