"""The RL losses' training: GRPO and its variants (``grpo``: dapo, passk, ucpo, g2rpo; DAPO's
``dynamic_sampling``), PPO (``ppo``, ``ppo_update``) and ROVER (``rover``), sharing the on-policy
``rollout``, the stages in ``rl_step`` and the mini-batch ``update_schedule``."""
