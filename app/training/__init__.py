"""Training: the neutral loop (``train``), the algorithms it runs (``algorithm``, ``algorithms/``),
the stages of a step (``step_batch``, ``step``, ``replay_items``, ``micro_batch``, ``rl_step``,
``ppo_update``), the behaviour mix's schedule, checkpointed state, progress, stop requests, and
``raptb train`` (``train_command``). The per-prefix reward it shares with evaluation is
app.reward's."""
