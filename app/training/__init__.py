"""Training: the loop and the step layer every loss shares, at this level, and the algorithms by
family below it.

- the loop, neutral to the algorithm: ``train`` (``Trainer``, the composition root), its state on
  disk (``train_state``), progress bar, stop requests, the error that ends a run, and ``raptb
  train`` (``train_command``);
- the shape of an algorithm (``algorithm``) and the shared step layer: a step's rows
  (``step_batch``), the stages on them (``step``), one micro-batch over all ranks
  (``micro_batch``);
- ``gflownet/``: the GFlowNet objectives' algorithm with its behaviour mix, row plan and replay
  buffer;
- ``rl/``: the RL losses' algorithms (GRPO and its variants, PPO, ROVER) with their rollout,
  stages and update schedules.

The per-prefix reward training shares with evaluation is app.reward's.
"""
