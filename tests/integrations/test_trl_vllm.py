"""GFlowNetTrainer with ``use_vllm=True, vllm_mode="colocate"`` on vLLM's CPU build is refused at
construction in one line saying why (TRL's colocated weight sync fails there); elsewhere the
refusal stays out of TRL's way."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from datasets import Dataset

import raptb.integrations.trl.trainer as trl_trainer
from raptb.adapters.lm.decode_mode import vllm_installed
from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer
from tests.integrations.trl_fixtures import CPU_RUN, a_count_reward


def colocated(model_dir: Path, out: Path) -> GFlowNetTrainer:
    args = GFlowNetConfig(
        **CPU_RUN,
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        use_vllm=True,
        vllm_mode="colocate",
    )
    return GFlowNetTrainer(
        model=str(model_dir),
        reward_funcs=a_count_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab", "ba"]}),
    )


def test_colocated_vllm_on_the_cpu_build_is_refused(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trl_trainer, "vllm_cpu_build", lambda: True)
    with pytest.raises(ValueError, match="CPU build") as caught:
        colocated(model_dir, tmp_path)
    assert "\n" not in str(caught.value) and "decode vllm" in str(caught.value)


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here: TRL would start an engine")
def test_the_refusal_is_only_for_the_cpu_build(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trl_trainer, "vllm_cpu_build", lambda: False)
    with pytest.raises(ImportError, match="vLLM is not available"):  # TRL's own, not ours
        colocated(model_dir, tmp_path)
