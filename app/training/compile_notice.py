"""One line when raptb's Numba kernels compile: a first run is otherwise silent for a minute.

The kernels (``core/subm``, ``adapters/lm``'s compiled rollout and rescoring) are jitted with
``cache=True``: the first call of each compiles it and writes it to the ``__pycache__`` beside
its source (or to ``NUMBA_CACHE_DIR``), and later processes load it from there. Numba announces
a compilation, and only a compilation, with its ``"numba:compile"`` event (Numba's event API):
a function found in the cache, or compiled earlier in the process, raises none. So the line is
said on the first such event from a function of ``package``, which happens exactly when the
cache is cold for a kernel the run uses (a fresh install, a new Numba or an edited kernel), and
never on a warm run. What it costs is measured in docs/install.md ("The first run").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from numba.core import event

COMPILING_LINE = "compiling kernels, first run only, about a minute"


class CompileNotice(event.Listener):
    """Calls ``say(COMPILING_LINE)`` once, when a function of a module under ``package`` (a
    dotted prefix such as ``"raptb."``) starts compiling; ``said`` tells whether it has."""

    def __init__(self, say: Callable[[str], None], package: str) -> None:
        self.say = say
        self.package = package
        self.said = False

    def on_start(self, event: event.Event) -> None:
        if self.said:
            return
        module = getattr(event.data["dispatcher"].py_func, "__module__", None) or ""
        if module.startswith(self.package):
            self.said = True
            self.say(COMPILING_LINE)

    def on_end(self, event: event.Event) -> None:
        pass


@contextmanager
def compile_notice(say: Callable[[str], None], package: str = "raptb.") -> Iterator[CompileNotice]:
    """Within the block, say :data:`COMPILING_LINE` before the first kernel of ``package`` that
    is compiled rather than loaded from Numba's cache."""
    notice = CompileNotice(say, package)
    with event.install_listener("numba:compile", notice):
        yield notice
