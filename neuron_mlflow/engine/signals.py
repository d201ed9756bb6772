"""SIGTERM (spot reclaim, a scheduler's preemption): the open windows are spooled as partial,
then the previous handler runs (the default one: the process dies of SIGTERM, as it would).

Example:
    >>> import signal
    >>> install()  # on the main thread; idempotent
    >>> signal.getsignal(signal.SIGTERM) is _on_sigterm
    True
    >>> uninstall()
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import weakref
from typing import Any

SUMMARY_WAIT_S = 10.0
"""How long the SIGTERM handler waits for the open windows' summaries (seconds)."""

capturing: weakref.WeakSet[Any] = weakref.WeakSet()
"""The sessions with an open window (each has ``flush()`` and ``wait_summaries(timeout_s)``)."""

_previous: Any = None


def install() -> None:
    """Put our SIGTERM handler in front of the current one (main thread only; idempotent)."""
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            return
        _previous = current
        signal.signal(signal.SIGTERM, _on_sigterm)


def uninstall() -> None:
    """Put the previous handler back (when ours is still the one in place)."""
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError, TypeError):
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
    _previous = None


def _on_sigterm(signum: int, frame: Any) -> None:
    with contextlib.suppress(Exception):
        sessions = list(capturing)
        for session in sessions:
            with contextlib.suppress(Exception):
                session.flush()  # spooled as partial, handed to the worker
        deadline = time.monotonic() + SUMMARY_WAIT_S
        for session in sessions:
            with contextlib.suppress(Exception):
                session.wait_summaries(max(0.0, deadline - time.monotonic()))
    previous = _previous
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # the default: die of SIGTERM, as without us
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
