"""Use cases and the edge, in floors (docs/layout.md; tests/test_app_floors.py): the
configuration (``configuration``, and ``parent_death``) at the bottom; then what the use cases
share: the run directory (``run_dir``), ``distribution``, the per-prefix reward (``reward``) and
the run's task and policy (``runtime``); then the use cases ``training``, ``evaluation`` and
``study``; the command line (``entry``, ``cli``, ``errors``) on top."""
