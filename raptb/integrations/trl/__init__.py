"""raptb's GFlowNet objectives and replay buffers inside TRL (``pip install 'raptb[trl]'``).

    from raptb.integrations.trl import GFlowNetConfig, GFlowNetTrainer

``GFlowNetTrainer`` drops in where TRL's ``GRPOTrainer`` stands; ``GFlowNetConfig`` is a
``GRPOConfig`` with raptb's objective, reward and replay fields. Importing this package checks the
installed TRL against the tested range and the parameters of the ``GRPOTrainer`` methods
GFlowNetTrainer overrides against those it was written for (``versions``).
"""

from raptb.integrations.trl.versions import check_trl_internals, check_trl_version

check_trl_version()

from trl import GRPOTrainer  # noqa: E402

check_trl_internals(GRPOTrainer)

from raptb.integrations.trl.config import GFlowNetConfig  # noqa: E402
from raptb.integrations.trl.trainer import GFlowNetTrainer  # noqa: E402

__all__ = ["GFlowNetConfig", "GFlowNetTrainer"]
