"""The per-row inputs of a rollout that both decode paths share: the arguments' check, each row's
prompt ids (one prompt for every row, or one per row), and prompts left-padded into one batch.

Left padding keeps every row's generated tokens in the same columns, so a batch of rows with
different prompts decodes in lock step; the attention mask is 0 on pads and each row's positions
count its own tokens only (``cumsum(mask) - 1``), so a row's logits equal those of the row decoded
alone, up to float rounding (tests/adapters/test_rollout_prompts.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def check_rollout_shape(n: int, min_length: int, max_length: int) -> None:
    """ValueError unless ``n >= 1`` and ``0 <= min_length <= max_length``."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if not 0 <= min_length <= max_length:
        raise ValueError(
            f"min_length, max_length: need 0 <= min_length <= max_length, got "
            f"{min_length}, {max_length}"
        )


def row_prompt_ids(
    encode: Callable[[str], list[int]], prompt: str | Sequence[str], n: int
) -> list[list[int]]:
    """The prompt token ids of each of ``n`` rows (``encode``: text -> ids, e.g. the policy's
    ``prompt_ids``); a string is every row's prompt, a sequence gives each row's (length n, else
    ValueError). Each distinct prompt is encoded once."""
    prompts = [prompt] * n if isinstance(prompt, str) else list(prompt)
    if len(prompts) != n:
        raise ValueError(f"prompt: expected a string or {n} prompts, got {len(prompts)}")
    ids = {text: encode(text) for text in dict.fromkeys(prompts)}
    return [ids[text] for text in prompts]


def left_padded(
    prompt_ids: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompts left-padded to the longest: ids [n, P] (``pad_id`` on pads), attention mask [n, P]
    (0 on pads), position ids [n, P] (mask cumsum - 1: each row's own positions, 0 on pads)."""
    width = max(len(ids) for ids in prompt_ids)
    ids = torch.tensor(
        [[pad_id] * (width - len(row)) + list(row) for row in prompt_ids],
        dtype=torch.long,
        device=device,
    )
    lengths = torch.tensor([len(row) for row in prompt_ids], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= width - lengths[:, None]).long()
    return ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)
