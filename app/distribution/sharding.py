"""Fully sharded data parallelism of the policy (FSDP2, torch's ``fully_shard``) for models that do
not fit one device, under ``accelerate launch`` with an FSDP config.

accelerate starts the processes and carries the settings (``distributed_type: FSDP`` and the
``fsdp_config`` of the config file, read here through accelerate's own
``FullyShardedDataParallelPlugin``); the trainer shards the policy itself, with the same call
accelerate's FSDP2 path makes, instead of handing the model to ``Accelerator.prepare``: sampling,
the reference pass and logZ live outside a wrapped forward, so the trainer keeps the model's own
interface and the rules of ``app.distribution.distributed`` (batch split, seeds, replay, rank-0
checkpoints)
unchanged. What sharding adds:

- **Wrapping.** Each transformer block (``fsdp_transformer_layer_cls_to_wrap``, default the
  model's ``_no_split_modules``) is one FSDP unit and the root (embeddings, head) another; every
  parameter, frozen or trainable, is split across ranks. LoRA-aware: the adapters sit inside the
  blocks and are sharded with them; only trainable parameters get gradients and optimizer states,
  so an optimizer step touches the adapters' shards only.
- **Gradients.** FSDP reduce-scatters the model's gradients in backward, averaged over ranks (its
  default); logZ and any head outside the model are all-reduced by
  ``DistContext.average_gradients`` as before. Clipping computes one global norm over both kinds
  (:func:`clip_grad_norm`).
- **Lock step.** Every forward of a sharded model all-gathers parameters, so every rank must run
  the same number of forwards: rollouts go on until every rank's rows have stopped (the policy's
  ``step_together`` hook), and a non-finite loss is agreed on by all ranks before anyone calls
  backward, so all skip together.
- **Checkpoints.** The full (unsharded) weights and optimizer states are gathered on every rank
  and written by rank 0 in the format of an unsharded run, so a checkpoint resumes under FSDP,
  DDP or one process alike. On resume, weights are loaded before sharding and the optimizer
  states are split into this rank's shards (:func:`load_optimizer_state`).
- **Precision.** The model keeps the dtype it was loaded in (bf16 on CUDA); gradients are reduced
  in float32; logZ stays a float32 parameter outside the model.
- **Activation checkpointing** (``fsdp_activation_checkpointing: true``, or ``[optim]
  gradient_checkpointing``): transformers' per-block checkpointing of the rescoring pass
  (adapters.lm.policy), enabled before sharding; it checkpoints a block's ``forward`` inside the
  FSDP unit's hooks, so a recomputed block finds its parameters gathered by FSDP's pre-backward
  hook and gathers nothing twice.
- **Evaluation** (``raptb eval`` under the same launch) does not shard: each rank holds the whole
  model and samples its chunks, as under DDP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from raptb.adapters.lm.policy import HFPolicy


@dataclass(frozen=True)
class ShardingPlan:
    """How the policy is sharded (from the accelerate FSDP config)."""

    wrap: tuple[str, ...] | None
    """Class names of the modules made FSDP units (None: the model's ``_no_split_modules``)."""
    reshard_after_forward: bool
    """Free the gathered parameters after each forward (ZeRO-3) or keep them until backward."""
    offload: bool
    """Keep parameters, gradients and optimizer states in CPU memory between uses."""
    activation_checkpointing: bool = False
    """Checkpoint the blocks in the rescoring pass (``fsdp_activation_checkpointing``)."""


def plan_from_accelerate() -> ShardingPlan:
    """The sharding plan of an ``accelerate launch`` with an FSDP config (the ``FSDP_*``
    environment accelerate sets). ValueError (one line) for a setting this trainer does not
    implement: FSDP version 1."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version != 2:
        raise ValueError(
            f"FSDP version {plugin.fsdp_version} is not supported: set fsdp_version: 2 in the "
            "accelerate config (raptb shards with FSDP2, torch's fully_shard)"
        )
    given = plugin.transformer_cls_names_to_wrap or []
    # "A, B" in the config reaches us as "A, B" or as ["A", " B"]
    parts = given.split(",") if isinstance(given, str) else given
    names = tuple(name.strip() for name in parts if name.strip())
    return ShardingPlan(
        wrap=names or None,
        reshard_after_forward=bool(plugin.reshard_after_forward),
        offload=isinstance(plugin.cpu_offload, CPUOffloadPolicy),
        activation_checkpointing=bool(plugin.activation_checkpointing),
    )


def _no_split_modules(model: torch.nn.Module) -> tuple[str, ...]:
    """The block class names a model declares unsplittable (peft wrappers looked through)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return tuple(getattr(inner, "_no_split_modules", None) or ())


def shard_model(model: torch.nn.Module, plan: ShardingPlan) -> int:
    """Shard ``model`` in place across the default process group: each block named by the plan
    is one FSDP unit, the root another. Returns the number of blocks; ValueError (one line) when
    the model has none of the named classes, or for CPU offloading of a model on the CPU."""
    if plan.offload and next(model.parameters()).device.type == "cpu":
        raise ValueError(
            "FSDP: fsdp_offload_params needs a GPU (on CPU the parameters already live in host "
            "memory); set fsdp_offload_params: false"
        )
    names = plan.wrap or _no_split_modules(model)
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(
            f"FSDP: the model has no module of class {', '.join(names) or '(none declared)'}; "
            "name its transformer block in fsdp_transformer_layer_cls_to_wrap"
        )
    options: dict[str, Any] = {
        "reshard_after_forward": plan.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(reduce_dtype=torch.float32),
    }
    if plan.offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return len(blocks)


def shard_policy(
    policy: HFPolicy, plan: ShardingPlan, step_together: Callable[[bool], bool]
) -> int:
    """Shard the policy's model (and its frozen reference copy, if one was taken) and make its
    rollouts step in lock with the other ranks through ``step_together`` (``DistContext.all_true``).
    Call it after the weights are loaded and before the optimizer is built. Returns the number of
    blocks sharded as units (besides the root)."""
    blocks = shard_model(policy.model, plan)
    if policy.reference_copy is not None:
        shard_model(policy.reference_copy, plan)
    policy.step_together = step_together
    return blocks


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a distributed (sharded) tensor."""
    return isinstance(tensor, DTensor)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU (a collective for a sharded one: call it on every rank). A
    shard offloaded to CPU memory is gathered over its mesh's device."""
    if is_sharded(tensor):
        mesh_device = tensor.device_mesh.device_type
        if tensor.device.type != mesh_device:
            tensor = tensor.to(mesh_device)
        tensor = tensor.full_tensor()
    return tensor.detach().cpu()


def full_model_state(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor] | None:
    """Every parameter and buffer of ``model`` unsharded, on the CPU, under the unsharded names,
    gathered one tensor at a time (a collective: every rank calls it); None where not ``keep``
    (only the writing rank holds the whole model in memory)."""
    # a tied weight (embeddings and head) is one parameter under two names: gathered once and
    # kept as one storage, so save_pretrained drops the tied name as it does unsharded
    owner = {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}
    state = {}
    gathered: dict[int, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        ident = owner.get(name, id(value))
        if ident not in gathered:
            gathered[ident] = _full(value)
        if keep:
            state[name] = gathered[ident]
    return state if keep else None


def full_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any] | None:
    """``optimizer.state_dict()`` with every sharded state tensor gathered whole onto the CPU: the
    format of an unsharded run (a collective: every rank calls it); None where not ``keep``."""
    saved = optimizer.state_dict()
    state = {}
    for index, entry in sorted(saved["state"].items()):
        whole = {key: _full(v) if torch.is_tensor(v) else v for key, v in entry.items()}
        if keep:
            state[index] = whole
    return {**saved, "state": state} if keep else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load a whole (unsharded) optimizer state into ``optimizer`` over sharded parameters: each
    state tensor of a sharded parameter becomes this rank's shard of it (no communication)."""
    optimizer.load_state_dict(saved)
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not is_sharded(param):
                continue
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == param.shape:
                    state[key] = distribute_tensor(
                        value.to(param.device),
                        param.device_mesh,
                        param.placements,
                        src_data_rank=None,
                    )


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> float:
    """Scale the gradients of ``params`` so that their joint 2-norm is at most ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``'s rule: factor max_norm / (norm + 1e-6), capped at 1) for a
    mix of sharded and ordinary parameters; the sharded ones' norm is reduced over ranks, so
    every rank scales by the same factor. Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    squares = 0.0
    for group in ([g for g in grads if is_sharded(g)], [g for g in grads if not is_sharded(g)]):
        if group:
            squares += float(_full(torch.nn.utils.get_total_norm(group))) ** 2
    total = squares**0.5
    factor = max_norm / (total + 1e-6)
    if factor < 1.0:
        for grad in grads:
            grad.mul_(factor)
    return total
