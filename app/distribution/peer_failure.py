"""The error a collective raises when another process of the run is gone.

Its own module, free of torch, so that the command line's error handling (``raptb.app.errors``)
can name it without importing the distributed machinery.
"""

from __future__ import annotations


class PeerFailure(RuntimeError):
    """A collective failed: another process died, stopped or did not answer in time."""
