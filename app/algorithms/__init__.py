"""The training algorithms the loop of app.train runs, one module each (app.algorithm declares
their shape): ``gflownet`` (every GFlowNet objective), ``grpo`` and ``ppo`` (the RL baselines,
sharing ``rl_rollout``)."""
