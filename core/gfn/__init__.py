"""The GFlowNet objectives on a terminable prefix tree: ``batch`` (the prefix-batch layout),
``objectives`` (TB, SubTB, RapTB, AvgPrefixTB, RootSubTBLogZ, VarGrad and their registry),
``targets`` (RapTB's absorbed suffix targets)."""
