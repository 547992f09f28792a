"""The run directory: verified checkpoints (``checkpoint``), atomic writes (``durable``), its
``config.toml`` (``run_config``) and ``eval/`` folder (``eval_folder``), start or resume
(``resume``), one writer per run (``run_lock``), ``metrics.jsonl`` (``run_log``) and the
experiment trackers (``trackers``)."""
