"""The reward-maximising RL baselines (GRPO, PPO) in the action layout: ``batch`` (the layout),
``advantages`` (group normalisation, token rewards, GAE), ``grpo`` and ``ppo`` (the losses, with
TRL's names and defaults), ``objectives`` (their registry)."""
