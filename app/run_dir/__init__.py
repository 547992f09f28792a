"""The run directory: verified checkpoints (``checkpoint``), atomic writes (``durable``), start or
resume (``resume``), one writer per run (``run_lock``), ``metrics.jsonl`` (``run_log``) and the
experiment trackers (``trackers``)."""
