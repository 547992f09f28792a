"""A run's thread count, for torch and for the BLAS library that Numba's compiled code calls.

``threads = n`` sets torch's intra-op threads, and also the threads of the OpenBLAS that
``np.dot`` inside the compiled rollout and rescoring calls (SciPy's, through Numba). Left alone,
that OpenBLAS starts one thread per core for products as large as the rescoring's and keeps them
spinning between calls: a 400-step main job at ``threads = 1`` on this project's 2-core machine
took 37 s of CPU in 23 s, and 20 s in 20 s with OpenBLAS on one thread as well
(benchmarks/step_speed.md), and a second job on the same cores would wait behind the spinning.
The limit is set by threadpoolctl, the library scikit-learn uses for the same purpose, on every
BLAS library loaded in the process.
"""

from __future__ import annotations

import torch


def use_threads(threads: int) -> None:
    """torch's and the BLAS libraries' thread counts to ``threads`` (>= 1)."""
    import scipy.linalg.cython_blas  # noqa: F401  (loads the OpenBLAS Numba's np.dot calls)
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")
