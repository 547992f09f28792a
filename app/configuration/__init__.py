"""A run's configuration: ``config`` (``TrainConfig``, ``build_config``, the presets), its
sections (``sections``, ``rl``, ``report_to``), the loss registry (``losses``) and the generated
reference (``reference``)."""
