"""Distribution: the process group and its rules (``distributed``), FSDP sharding (``sharding``)
and ``raptb launch`` (``launch``)."""
