"""A run's configuration: ``config`` (``TrainConfig``, ``build_config``, the presets), its
sections (``sections``, ``rl``) and the generated reference (``reference``)."""
