"""``python -m raptb``: the ``raptb`` command line, so that ``accelerate launch -m raptb train ...``
starts one trainer per process.

The guard matters: worker processes started with ``spawn`` (the reward pool) re-run this module
under another name, and must not start a second command line.
"""

from raptb.app.entry import main

if __name__ == "__main__":
    main()
