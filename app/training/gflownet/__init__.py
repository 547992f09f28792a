"""The GFlowNet objectives' training (tb, subtb, raptb, avg_prefix_tb, root_subtb_logz, vargrad and
the plug-ins'): ``algorithm`` (one optimizer step, read from its docstring), the behaviour mix's
schedule (``mix_schedule``) and each step's row plan (``row_plan``), the replay buffer
(``replay_setup``) and the items a step adds to it (``replay_items``)."""
