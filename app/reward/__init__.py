"""The per-prefix reward, shared by training and evaluation (objectives.md): for a trajectory with
tokens x_1..x_tau and every k <= tau,

    u_k     = lambda * S(x_1..x_k)                      (task-only part, scored on the text)
    log_r_k = kappa * log P_ref(x_1..x_k + stop) + u_k

``prefix`` the task part (``PrefixScorer``, its cache, ``ScoredRows``), ``calls`` the task's
reward calls (failures, the worker pool), ``reference`` the reference prior log P_ref (computed
only when kappa > 0), ``schedule`` lambda and the reward temperature at a step.

The package imports nothing here: a reward worker spawned by ``calls`` imports only what it needs.
"""
