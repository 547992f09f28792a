"""What TRL's model card says about a GFlowNetTrainer run: the method and the paper it is from.

TRL writes ``output_dir/README.md`` with every checkpoint (``create_model_card``, from the
trainer's ``_name`` and ``_paper``). GRPOTrainer's credit the method to DeepSeekMath and cite it;
GFlowNetTrainer names the configured objective and replay buffer and cites the paper raptb
implements (its ICML 2026 version; it has no arXiv id, so TRL's "a method introduced in" link is
left out and the title is part of the method's name).
"""

from __future__ import annotations

PAPER_TITLE = (
    "Rooted Absorbed Prefix Trajectory Balance with Submodular Replay for GFlowNet Training"
)
PAPER = {
    "title": PAPER_TITLE,
    "id": None,
    "citation": (
        "@inproceedings{wang2026raptb,\n"
        f"    title        = {{{{{PAPER_TITLE}}}}},\n"
        "    author       = {Xi Wang and Wenbo Lu and Shengjie Wang},\n"
        "    booktitle    = {International Conference on Machine Learning (ICML)},\n"
        "    year         = 2026,\n"
        "}"
    ),
}
"""The paper raptb implements, in TRL's ``_paper`` form (title and authors from its source)."""

OBJECTIVE_NAMES = {
    "tb": "trajectory balance (TB)",
    "subtb": "subtrajectory balance (SubTB)",
    "raptb": "RapTB (rooted absorbed prefix trajectory balance)",
    "avg_prefix_tb": "prefix-averaged trajectory balance",
    "root_subtb_logz": "rooted SubTB with a learned logZ",
    "vargrad": "VarGrad",
}
REPLAY_NAMES = {
    "rp": "reward-prioritised replay (RP)",
    "prt": "prioritised replay training (PRT)",
    "subm": "submodular replay (SubM)",
}


def method_name(loss: str, replay: str) -> str:
    """The method TRL's card credits: the GFlowNet objective, the replay, and the paper."""
    name = f"GFlowNet fine-tuning with the {OBJECTIVE_NAMES[loss]} objective"
    if replay != "none":
        name += f" and {REPLAY_NAMES.get(replay, f'the {replay!r} replay buffer')}"
    return f"{name} (raptb's GFlowNetTrainer; paper: *{PAPER_TITLE}*, Wang, Lu and Wang, ICML 2026)"
