"""Evaluation metrics of the paper's appendix "Metrics: Formal Definitions and Protocol".

Two words, one meaning each:

- **valid**: the text is well-formed for its task (Expr24: it parses; SMILES: the merged
  molecule sanitises). Only the SMILES and generic reports count it (``n_valid``).
- **correct**: the sample counts as a success, what Acc measures (Expr24: it parses *and*
  equals 24; SMILES and custom tasks: it is valid). Every metric except Acc and log p_term is
  computed on the correct samples; a metric whose denominator is zero is 0.

Notation: N samples x_i with pre-stop token length l_i, a ``correct`` flag, a task score s_i
and the raw model log-prob of stop at the sampled stop step ``log_pterm_stop``. Sequences are
any sequences of hashable tokens (token strings, token ids, or plain strings, which are
sequences of characters). Shapes: per-sample arrays are [N]; per-depth arrays are [K] for
depths k = 1..K; token marginals are [T, V] over a vocabulary of V tokens.

Modules, one concept each (their docstrings hold the formulas):

- ``sequence``: Acc, Score, Len/Len_q/Count/Frac, log p_term, UniqStr/UniqRate, ragged entropy.
- ``prefix``: prefix-collapse diagnostics Surv, PefEnt, Eff, Top1, UniqueRate by depth.
- ``coverage``: coverage of an enumerated solution set Y* (Expr24's).
- ``divergence``: position-wise token marginals and stabilised KL / JS.
- ``diversity``: FPDiv and MacroFP on a pairwise similarity.
- ``vendi``: the Vendi score, an effective number of distinct items under a similarity kernel.
- ``pass_at_k``: the unbiased pass@k estimator, per prompt and averaged.
- ``exact``: closed forms over an enumerated Y* from exact log-probabilities (Acc, distances to
  the target, uniformity, active modes, expected distinct at N).
- ``statistics``: the Student-t confidence interval across seeds.
- ``reports``: the task-neutral report (``sequence_metrics``, and ``sequence_report``, the keys
  every task's report shares). A task's own report lives with the task (its ``metrics``
  module, e.g. ``raptb.adapters.tasks.expr24.metrics``) and reaches evaluation through the
  task's ``TaskSpec.metrics``.
"""

from raptb.core.metrics._arrays import TokenSequence, safe_div
from raptb.core.metrics.coverage import Coverage, coverage, target_distinct
from raptb.core.metrics.divergence import (
    DIVERGENCE_EPS,
    MarginalDivergences,
    marginal_divergences,
    stabilised_js,
    stabilised_kl,
    token_marginals,
)
from raptb.core.metrics.diversity import (
    DEFAULT_FP_BINS,
    PairwiseSimilarity,
    fp_div,
    macro_fp_div,
)
from raptb.core.metrics.pass_at_k import (
    DEFAULT_PASS_K,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_report,
)
from raptb.core.metrics.prefix import PrefixDiagnostics, prefix_diagnostics
from raptb.core.metrics.reports import require_fields, sequence_metrics, sequence_report
from raptb.core.metrics.sequence import (
    ENTROPY_EPS,
    accuracy,
    entropy_by_length,
    length_count,
    length_fraction,
    length_percentile,
    log_pterm_by_length,
    mean_length,
    mean_log_pterm,
    mean_score,
    ragged_token_entropy,
    unique_count,
    unique_rate,
)
from raptb.core.metrics.statistics import ConfidenceInterval, mean_ci, student_t_quantile
from raptb.core.metrics.vendi import (
    DEFAULT_VENDI_DISTINCT,
    VendiEstimate,
    sample_vendi,
    vendi_score,
)

__all__ = [
    "DEFAULT_FP_BINS",
    "DEFAULT_PASS_K",
    "DEFAULT_VENDI_DISTINCT",
    "DIVERGENCE_EPS",
    "ENTROPY_EPS",
    "ConfidenceInterval",
    "Coverage",
    "MarginalDivergences",
    "PairwiseSimilarity",
    "PrefixDiagnostics",
    "TokenSequence",
    "VendiEstimate",
    "accuracy",
    "coverage",
    "entropy_by_length",
    "fp_div",
    "length_count",
    "length_fraction",
    "length_percentile",
    "log_pterm_by_length",
    "macro_fp_div",
    "marginal_divergences",
    "mean_ci",
    "mean_length",
    "mean_log_pterm",
    "mean_pass_at_k",
    "mean_score",
    "pass_at_k",
    "pass_at_k_report",
    "prefix_diagnostics",
    "ragged_token_entropy",
    "require_fields",
    "safe_div",
    "sample_vendi",
    "sequence_metrics",
    "sequence_report",
    "stabilised_js",
    "stabilised_kl",
    "student_t_quantile",
    "target_distinct",
    "token_marginals",
    "unique_count",
    "unique_rate",
    "vendi_score",
]
