"""What TRL's model card says about a GFlowNetTrainer run: the method and the papers it is from.

TRL writes ``output_dir/README.md`` with every checkpoint (``create_model_card``, from the
trainer's ``_name`` and ``_paper``). GRPOTrainer's credit the method to DeepSeekMath and cite it;
GFlowNetTrainer names the configured objective and replay buffer and cites each one's own paper:
TB, SubTB, VarGrad, RP and PRT their authors', RapTB, AvgPrefixTB, RootSubTBLogZ and SubM the
paper raptb implements (its ICML 2026 version, which has no arXiv id). TRL links the paper of the
objective (``_paper``'s title and arXiv id) and prints every citation (``_paper``'s citation).
A plug-in objective or buffer without an entry here is named, and cites nothing.
"""

from __future__ import annotations

from typing import Any

PAPER_TITLE = (
    "Rooted Absorbed Prefix Trajectory Balance with Submodular Replay for GFlowNet Training"
)


def _bibtex(key: str, kind: str, title: str, authors: str, venue: str, year: int) -> str:
    field = "journal" if kind == "article" else "booktitle"
    return (
        f"@{kind}{{{key},\n"
        f"    title        = {{{{{title}}}}},\n"
        f"    author       = {{{authors}}},\n"
        f"    {field:<12} = {{{venue}}},\n"
        f"    year         = {year},\n"
        "}"
    )


def _paper(key: str, title: str, arxiv: str | None, authors: str, venue: str, year: int) -> dict:
    return {
        "title": title,
        "id": arxiv,
        "citation": _bibtex(key, "inproceedings", title, authors, venue, year),
    }


RAPTB_PAPER = _paper(
    "wang2026raptb",
    PAPER_TITLE,
    None,
    "Xi Wang and Wenbo Lu and Shengjie Wang",
    "International Conference on Machine Learning (ICML)",
    2026,
)
"""The paper raptb implements (title and authors from its source)."""

TB_PAPER = _paper(
    "malkin2022trajectory",
    "Trajectory balance: Improved credit assignment in GFlowNets",
    "2201.13259",
    "Nikolay Malkin and Moksh Jain and Emmanuel Bengio and Chen Sun and Yoshua Bengio",
    "Advances in Neural Information Processing Systems (NeurIPS)",
    2022,
)
SUBTB_PAPER = _paper(
    "madan2023learning",
    "Learning GFlowNets from partial episodes for improved convergence and stability",
    "2209.12782",
    "Kanika Madan and Jarrid Rector-Brooks and Maksym Korablyov and Emmanuel Bengio and "
    "Moksh Jain and Andrei Cristian Nica and Tom Bosc and Yoshua Bengio and Nikolay Malkin",
    "International Conference on Machine Learning (ICML)",
    2023,
)
VARGRAD_PAPER = _paper(
    "richter2020vargrad",
    "VarGrad: A Low-Variance Gradient Estimator for Variational Inference",
    "2010.10436",
    'Lorenz Richter and Ayman Boustati and Nikolas N{\\"u}sken and Francisco J. R. Ruiz and '
    '{\\"O}mer Deniz Akyildiz',
    "Advances in Neural Information Processing Systems (NeurIPS)",
    2020,
)
RP_PAPER = _paper(
    "hu2024amortizing",
    "Amortizing intractable inference in large language models",
    "2310.04363",
    "Edward J. Hu and Moksh Jain and Eric Elmoznino and Younesse Kaddar and Guillaume Lajoie "
    "and Yoshua Bengio and Nikolay Malkin",
    "International Conference on Learning Representations (ICLR)",
    2024,
)
PRT_PAPER = _paper(
    "shen2023towards",
    "Towards Understanding and Improving GFlowNet Training",
    "2305.07170",
    "Max W. Shen and Emmanuel Bengio and Ehsan Hajiramezanali and Andreas Loukas and "
    "Kyunghyun Cho and Tommaso Biancalani",
    "International Conference on Machine Learning (ICML)",
    2023,
)

OBJECTIVES: dict[str, tuple[str, dict]] = {
    "tb": ("trajectory balance (TB)", TB_PAPER),
    "subtb": ("subtrajectory balance (SubTB)", SUBTB_PAPER),
    "raptb": ("RapTB (rooted absorbed prefix trajectory balance)", RAPTB_PAPER),
    "avg_prefix_tb": ("prefix-averaged trajectory balance (AvgPrefixTB)", RAPTB_PAPER),
    "root_subtb_logz": ("rooted SubTB with a learned logZ (RootSubTBLogZ)", RAPTB_PAPER),
    "vargrad": ("VarGrad", VARGRAD_PAPER),
}
"""Each built-in objective's name on the card and the paper it is from."""

REPLAYS: dict[str, tuple[str, dict]] = {
    "rp": ("reward-prioritised replay (RP)", RP_PAPER),
    "prt": ("prioritised replay training (PRT)", PRT_PAPER),
    "subm": ("submodular replay (SubM)", RAPTB_PAPER),
}
"""Each built-in replay buffer's name on the card and the paper it is from."""


def method_name(loss: str, replay: str) -> str:
    """The method TRL's card credits: the GFlowNet objective and the replay, by name."""
    name = f"GFlowNet fine-tuning with the {OBJECTIVES.get(loss, (repr(loss),))[0]} objective"
    if replay != "none":
        name += f" and {REPLAYS.get(replay, (f'the {replay!r} replay buffer',))[0]}"
    paper = OBJECTIVES.get(loss, ("", {"id": "-"}))[1]
    if paper["id"] is None:  # TRL links only a paper with an arXiv id: name it here instead
        name += f" (paper: *{paper['title']}*)"
    return f"{name}, raptb's GFlowNetTrainer"


def card_paper(loss: str, replay: str) -> dict[str, Any]:
    """TRL's ``_paper``: the objective's paper (linked when it has an arXiv id) and the citations
    of the objective's and the replay's papers, each once."""
    papers = [entry[1] for entry in (OBJECTIVES.get(loss), REPLAYS.get(replay)) if entry]
    unique = [p for i, p in enumerate(papers) if p not in papers[:i]]
    if not unique:
        return {}
    first = OBJECTIVES[loss][1] if loss in OBJECTIVES else {"title": None, "id": None}
    return {
        "title": first["title"],
        "id": first["id"],
        "citation": "\n\n".join(p["citation"] for p in unique),
    }
