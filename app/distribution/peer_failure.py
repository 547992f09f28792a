"""The error a collective raises when another process of the run is gone.

Its own module, free of torch, so that the command line's error handling (``raptb.app.errors``)
can name it without importing the distributed machinery.
"""

from __future__ import annotations

PEER_GONE = "died or closed its connection"
"""What a rank's line says of a peer whose connection closed under a collective (it died or was
killed, rather than stopped or slow): the launcher then names the killed rank instead
(``raptb.app.distribution.launch.failed_rank``)."""


class PeerFailure(RuntimeError):
    """A collective failed: another process died, stopped or did not answer in time."""
