"""Training: the neutral loop (``train``), the algorithms it runs (``algorithm``, ``algorithms/``),
the stages of a step (``step_batch``, ``step``, ``prefix_reward``, ``reward_calls``,
``replay_items``, ``micro_batch``, ``rl_step``, ``ppo_update``), their schedules, checkpointed
state, progress, stop requests, and ``raptb train`` (``train_command``)."""
