"""``GFlowNetTrainer``: TRL's ``GRPOTrainer`` with raptb's GFlowNet objective and replay.

Generation, reward functions, vLLM, chat templates, multi-GPU, logging and checkpoints stay TRL's.
What changes (``versions.OVERRIDDEN_TRL_INTERNALS`` lists the TRL methods involved):

- after TRL has generated and scored a generation batch, a fraction of its rows is replaced by
  replay items with their prompts (``replay``; of any stored prompt, or of the row's own with
  ``replay_scope="per_prompt"``), and every row gets raptb's prefix layout: tau, the task rewards
  u_k = reward_scale * S_k / T_R (S_tau the summed TRL reward of the completion, S_k for k < tau
  from the optional ``prefix_reward_func``, else 0) and the log-rewards
  log_r_k = kappa log P_ref(prefix_k + stop) / T_R + u_k, log P_ref from the reference model TRL
  keeps (the initial weights; the adapter disabled with PEFT);
- the loss is the configured core objective on (log_pf, log_pterm) of one forward pass of the
  policy (``prefix_log_probs``) and a learned float32 logZ in its own optimizer group;
- checkpoints also hold logZ, the replay buffer and the replay sampler's state, and a saved model
  holds logZ, where a trainer on its folder starts (``checkpoint_state``);
- every optimizer parameter's gradient, logZ's included, is cleared after each optimizer step
  (``gradients``: transformers clears the model's only).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.trainer.utils import use_adapter

from raptb.adapters.lm.decode_mode import vllm_cpu_build
from raptb.core.gfn.batch import PrefixBatch
from raptb.core.gfn.objectives import Objective
from raptb.core.replay import ReplayBuffer, make_buffer
from raptb.integrations.trl.accumulation import rows_per_micro_batch
from raptb.integrations.trl.checkpoint_state import (
    initial_log_z,
    load_gflownet_state,
    model_folder,
    save_gflownet_state,
    save_log_z,
)
from raptb.integrations.trl.completions_table import log_completions, record_trained_rows
from raptb.integrations.trl.config import GFlowNetConfig
from raptb.integrations.trl.gradients import ClearGradients
from raptb.integrations.trl.model_card import card_paper, method_name
from raptb.integrations.trl.prefix_log_probs import (
    prefix_log_probs,
    stop_log_prob,
    trajectory_lengths,
)
from raptb.integrations.trl.prefix_rewards import (
    PrefixLogs,
    PrefixRewardFunc,
    flush_prefix_logs,
    prefix_scores,
)
from raptb.integrations.trl.replay import (
    CallableSimilarity,
    ReplayDraw,
    SimilarityFunc,
    draw_replay,
    replay_items,
    replay_never_fires,
    splice_completions,
    splice_prompts,
    stored_u,
)
from raptb.integrations.trl.rewards import check_finite_rewards, summed_rewards

COLOCATE_ON_CPU = (
    "GFlowNetTrainer: use_vllm with vllm_mode='colocate' does not train on vLLM's CPU build "
    "(vllm-cpu): TRL's weight sync calls the model's load_weights, which fails on the layers the "
    "CPU build repacks; on a CPU sample with vLLM through `raptb train --sampling.decode vllm`, "
    "or use vllm on a GPU"
)
"""Why the colocated engine is refused on vLLM's CPU build (TRL 1.16,
``trl/generation/vllm_generation.py``, ``VLLMGeneration.sync_weights``)."""


class GFlowNetTrainer(GRPOTrainer):
    """A ``GRPOTrainer`` whose loss is a raptb GFlowNet objective (module docstring).

    Takes ``GRPOTrainer``'s arguments with ``args`` a :class:`GFlowNetConfig`, plus

    prefix_reward_func: task reward S_k of every prefix of a completion (TRL's reward-function
        signature, called on (prompt, prefix) pairs); None: u_k = 0 before the stop.
    replay_similarity: SubM's similarity of two lists of completion texts; None: Jaccard on
        ``args.subm_shingles`` shingles.

    Example (``MODEL`` a Hugging Face model name or folder; tests/test_docstring_examples.py
    runs it on a tiny local model)::

        from datasets import Dataset
        from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer

        def a_share(completions, **kwargs):  # TRL's reward-function signature
            return [c.count("a") / max(len(c), 1) for c in completions]

        args = GFlowNetConfig(output_dir="out", loss="raptb", replay="subm", max_steps=2,
                              per_device_train_batch_size=4, num_generations=4,
                              max_completion_length=16, report_to=[],
                              use_cpu=True)  # on a laptop; leave it out on a GPU
        prompts = Dataset.from_dict({"prompt": ["Say a word:", "Another:"] * 4})
        trainer = GFlowNetTrainer(model=MODEL, reward_funcs=a_share, args=args,
                                  train_dataset=prompts)
        trainer.train()
    """

    _tag_names: ClassVar[list[str]] = ["trl", "raptb", "gflownet"]
    _name = "GFlowNet"

    def __init__(
        self,
        *args: Any,
        prefix_reward_func: PrefixRewardFunc | None = None,
        replay_similarity: SimilarityFunc | None = None,
        **kwargs: Any,
    ) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, GFlowNetConfig):
            raise TypeError("GFlowNetTrainer: args must be a GFlowNetConfig")
        if kwargs.get("optimizers", (None, None))[0] is not None:
            raise ValueError(
                "GFlowNetTrainer: optimizers cannot be passed; the trainer builds TRL's optimizer "
                "with logZ in a group of its own (lr args.log_z_lr)"
            )
        if kwargs.get("tools") or kwargs.get("environment_factory"):
            raise ValueError(
                "GFlowNetTrainer: tools and environments are not supported (tool outputs inside a "
                "completion are not the policy's actions)"
            )
        if config.use_vllm and config.vllm_mode == "colocate" and vllm_cpu_build():
            raise ValueError(COLOCATE_ON_CPU)
        # TRL keeps a reference model (or the PEFT base) only when its KL weight is non-zero;
        # here the reference enters the log-reward through kappa, and the KL term is never used.
        config.beta = 1.0 if config.kappa > 0 else 0.0
        try:
            super().__init__(*args, **kwargs)
        finally:
            config.beta = 0.0
        self.beta = 0.0  # TRL's own reference pass and KL metrics are skipped
        if self._is_vlm:
            raise ValueError("GFlowNetTrainer: vision-language models are not supported")
        self.gfn_args = config
        # what TRL's model card credits and cites
        self._name = method_name(config.loss, config.replay)
        self._paper = card_paper(config.loss, config.replay)
        self.stop_ids = list(dict.fromkeys(int(i) for i in self.eos_token_ids))
        self.prefix_reward_func = prefix_reward_func
        # log_z_init, or the logZ save_model wrote beside the model (checkpoint_state)
        log_z = initial_log_z(config, model_folder(kwargs.get("model", args[0] if args else None)))
        self.log_z = torch.nn.Parameter(
            torch.tensor(log_z, dtype=torch.float32, device=self.accelerator.device)
        )
        if self.accelerator.num_processes > 1:
            # logZ lives outside the wrapped model, so its gradient is averaged here
            self.log_z.register_post_accumulate_grad_hook(_average_over_processes)
        # and cleared here: transformers' model.zero_grad() does not reach it (gradients module)
        self.add_callback(ClearGradients)
        self.buffer = self._build_buffer(replay_similarity)
        # the prompt token ids each stored prompt was generated with (its replay key is its text)
        self.replay_prompt_ids: dict[str, tuple[int, ...]] = {}
        self._warn_if_replay_never_fires()
        self.replay_rng = np.random.default_rng([config.seed, self.accelerator.process_index])
        self._objective: tuple[int, Objective] | None = None
        self._completion_rewards: torch.Tensor | None = None

    # --- construction ------------------------------------------------------------------------

    def _build_buffer(self, similarity: SimilarityFunc | None) -> ReplayBuffer | None:
        kind = self.gfn_args.replay
        if kind == "none":
            return None
        kwargs = self.gfn_args.buffer_kwargs()
        if kind == "subm" and similarity is not None:
            kwargs["similarity"] = CallableSimilarity(similarity)
            kwargs["shingle_on"] = "text"
        return make_buffer(kind, **kwargs)

    def _warn_if_replay_never_fires(self) -> None:
        if self.buffer is None:
            return
        reason = replay_never_fires(
            self.gfn_args, self.train_dataset, self.num_generations, self.num_iterations
        )
        if reason is not None:
            replay = self.gfn_args.replay
            warnings.warn(f"GFlowNetTrainer: replay={replay!r} {reason}", stacklevel=3)

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        optimizer = super().create_optimizer(model)
        if not any(p is self.log_z for g in optimizer.param_groups for p in g["params"]):
            optimizer.add_param_group(
                {"params": [self.log_z], "lr": self.gfn_args.log_z_lr, "weight_decay": 0.0}
            )
        return optimizer

    def objective(self) -> Objective:
        """The core objective, its schedules over this run's ``max_steps``."""
        horizon = max(int(self.state.max_steps), 0)
        if self._objective is None or self._objective[0] != horizon:
            self._objective = (horizon, self.gfn_args.objective(horizon))
        return self._objective[1]

    # --- generation batch -> prefix layout -----------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        # TRL's sum (NaN: unscorable, rewards module); every process checks the whole batch
        summed = summed_rewards(rewards_per_func, self.reward_weights)
        start = self.accelerator.process_index * len(prompts)
        local = slice(start, start + len(prompts))
        check_finite_rewards(
            rewards_per_func, summed, self.reward_func_names, local, prompts, completions
        )
        self._completion_rewards = summed[local]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self._completion_rewards is None:
            raise RuntimeError("GFlowNetTrainer: TRL did not score the completions")
        rewards = self._completion_rewards.double().cpu().numpy()
        self._completion_rewards = None
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        keys = self._tokenizer.batch_decode(
            [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
        )
        training = self.model.training
        draw = ReplayDraw((), ())
        if training and self.buffer is not None:
            fraction = self.gfn_args.replay_fraction_at(
                self.state.global_step, self.state.max_steps
            )
            draw = draw_replay(
                self.buffer, keys, fraction, self.replay_rng, self.gfn_args.replay_scope
            )
            prompt_ids, prompt_mask = splice_prompts(
                prompt_ids,
                prompt_mask,
                draw,
                [self._stored_prompt_ids(item.prompt) for item in draw.items],
                pad_id=self._tokenizer.pad_token_id,
            )
        completion_ids, completion_mask = splice_completions(
            output["completion_ids"],
            output["completion_mask"],
            draw,
            stop_id=self.stop_ids[0],
            pad_id=self._tokenizer.pad_token_id,
            max_completion_length=self.max_completion_length,
        )
        length = trajectory_lengths(completion_ids, completion_mask, self.stop_ids)
        rows = [
            tuple(ids[:n].tolist()) for ids, n in zip(completion_ids, length.tolist(), strict=True)
        ]
        texts = self._tokenizer.batch_decode(rows, skip_special_tokens=True)
        width = completion_ids.shape[1] + 1
        replayed = set(draw.rows)
        unscorable = np.isnan(rewards)
        scored = [b for b in range(len(rows)) if b not in replayed and not unscorable[b]]
        u = stored_u(draw, self._task_rewards(inputs, rows, rewards, width, scored))
        log_r = torch.as_tensor(u, dtype=torch.float32, device=completion_ids.device)
        if self.gfn_args.kappa > 0:
            prior = self._reference_log_prob(
                prompt_ids, prompt_mask, completion_ids, completion_mask, length
            )
            log_r = log_r + self.gfn_args.kappa * prior / self.gfn_args.reward_temperature
        if self.log_completions:
            batch = (prompt_ids, prompt_mask, completion_ids, completion_mask, length)
            self._record_trained_rows(draw, keys, texts, rewards, log_r, batch)
        mode_metrics = self._metrics["train" if training else "eval"]
        mode_metrics["gflownet/unscorable_fraction"].append(float(unscorable.mean()))
        if training and self.buffer is not None:
            kept = scored  # generated, kept and scorable: an unscorable row is never stored
            for b in kept:
                ids = prompt_ids[b][prompt_mask[b].bool()]
                self.replay_prompt_ids[keys[b]] = tuple(ids.tolist())
            threshold = self.gfn_args.replay_valid_min_reward
            generated = (keys, rows, texts, rewards)
            self.buffer.add(replay_items(kept, generated, u, log_r, threshold))
            mode_metrics["gflownet/replayed_fraction"].append(len(draw.rows) / len(rows))
            mode_metrics["gflownet/buffer_size"].append(float(len(self.buffer)))
        kept_rows = torch.as_tensor(
            [b in replayed or not unscorable[b] for b in range(len(rows))],
            device=completion_ids.device,
        )
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "gfn_length": length,
            "gfn_u": torch.as_tensor(u, dtype=torch.float32, device=completion_ids.device),
            "gfn_log_r": log_r,
            # the rows the loss trains on: replayed, or generated and scorable
            "gfn_scorable": kept_rows,
            # and how many there are in the whole generation batch, on every process (0-d: TRL's
            # split_tensor_dict gives it whole to each micro-batch, as its num_items_in_batch)
            "gfn_num_kept": self.accelerator.gather(kept_rows.sum().float()).sum(),
        }

    @torch.no_grad()
    def _record_trained_rows(
        self,
        draw: ReplayDraw,
        keys: list[str],
        texts: list[str],
        rewards: np.ndarray,
        log_r: torch.Tensor,
        batch: tuple[torch.Tensor, ...],
    ) -> None:
        """The completions table's rows (completions_table): what the loss trains on."""
        at_stop = batch[-1][:, None]
        log_pi = stop_log_prob(*prefix_log_probs(self.model, *batch, self.stop_ids), batch[-1])
        record_trained_rows(
            self._logs,
            self.args.generation_batch_size,
            draw,
            (keys, texts, rewards),
            log_r.gather(1, at_stop)[:, 0].tolist(),
            log_pi.gather(1, at_stop)[:, 0].tolist(),
        )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        wanted = self.log_completions
        self.log_completions = False  # TRL's table would show GRPO's advantage
        try:
            super().log(logs, start_time)
        finally:
            self.log_completions = wanted
        if wanted and self.accelerator.is_main_process:
            log_completions(self)

    def _stored_prompt_ids(self, key: str) -> tuple[int, ...]:
        """The token ids of stored prompt ``key``; a buffer restored from a checkpoint written
        before they were kept re-tokenises its text."""
        ids = self.replay_prompt_ids.get(key)
        if ids is None:
            ids = tuple(self._tokenizer.encode(key, add_special_tokens=False))
        return ids

    def _task_rewards(
        self,
        inputs: list[dict[str, Any]],
        rows: list[tuple[int, ...]],
        rewards: np.ndarray,
        width: int,
        scored: list[int],
    ) -> np.ndarray:
        """u [B, width] (float64): reward_scale * S_k / T_R at every prefix k <= tau of the
        ``scored`` rows, 0 elsewhere (replayed rows take their stored u, unscorable ones none)."""
        scores = np.zeros((len(rows), width))
        scores[scored, [len(rows[b]) for b in scored]] = rewards[scored]
        if self.prefix_reward_func is not None:
            logs = PrefixLogs()
            pairs, prefix = prefix_scores(
                self.prefix_reward_func, self._tokenizer, inputs, rows, scored, self.state, logs
            )
            flush_prefix_logs(self, logs, pairs, len(rows))
            if pairs:
                scores[tuple(np.array(pairs).T)] = prefix
        return self.gfn_args.reward_scale * scores / self.gfn_args.reward_temperature

    @torch.no_grad()
    def _reference_log_prob(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        length: torch.Tensor,
    ) -> torch.Tensor:
        """log P_ref(prefix_k + stop) [B, C+1] under the model TRL keeps as the reference."""
        batch = (prompt_ids, prompt_mask, completion_ids, completion_mask, length, self.stop_ids)
        if self.ref_model is not None:
            ref_pf, ref_pterm = prefix_log_probs(self.ref_model, *batch)
        else:
            model = self.accelerator.unwrap_model(self.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                ref_pf, ref_pterm = prefix_log_probs(self.model, *batch)
        return stop_log_prob(ref_pf, ref_pterm, length)

    # --- loss ----------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        length = inputs["gfn_length"]
        with self.accelerator.autocast():
            log_pf, log_pterm = prefix_log_probs(
                model,
                inputs["prompt_ids"],
                inputs["prompt_mask"],
                inputs["completion_ids"],
                inputs["completion_mask"],
                length,
                self.stop_ids,
            )
        keep = inputs["gfn_scorable"]
        if not bool(keep.any()):
            # nothing to train on (every row unscorable): a zero that keeps the graph whole
            return (log_pf.sum() + log_pterm.sum() + self.log_z) * 0.0
        fields = (log_pf, log_pterm, inputs["gfn_log_r"], inputs["gfn_u"], length)
        if not bool(keep.all()):
            fields = tuple(f[keep] for f in fields)
        batch = PrefixBatch(*fields)
        loss, diagnostics = self.objective()(batch, self.log_z, self.state.global_step)
        mode = "train" if self.model.training else "eval"
        objective = self.objective()
        if not objective.learns_log_z:
            # the learned logZ is idle (SubTB's cancels); VarGrad's is the batch's estimate
            idle = diagnostics.pop("log_z")
            if objective.name == "vargrad":
                diagnostics["log_z_estimate"] = idle
        for key, value in diagnostics.items():
            self._metrics[mode][f"gflownet/{key}"].append(value)
        if mode == "train":  # the step's mean over its kept rows (accumulation module)
            loss = loss * len(batch.length) / rows_per_micro_batch(self, inputs["gfn_num_kept"])
        return loss

    # --- checkpoints ---------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        save_gflownet_state(self, folder)

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:  # the main process, as the weights
            save_log_z(self, output_dir if output_dir is not None else self.args.output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            load_gflownet_state(self, checkpoint)


def _average_over_processes(param: torch.Tensor) -> None:
    torch.distributed.all_reduce(param.grad, op=torch.distributed.ReduceOp.AVG)
