"""The reward-maximising RL baselines (GRPO, PPO) in the action layout: ``batch`` (the layout),
``advantages`` (group normalisation, token rewards, GAE), ``grpo`` and ``ppo`` (the losses, with
TRL's names and defaults), and the field's variants of GRPO. The losses are registered once, with
every other loss, in app.configuration.losses."""
