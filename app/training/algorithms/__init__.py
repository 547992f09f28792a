"""The training algorithms the loop of app.training.train runs, one module each
(app.training.algorithm declares their shape): ``gflownet`` (every GFlowNet objective), ``grpo``
and ``ppo`` (the RL baselines, sharing ``rl_rollout``)."""
