"""SIGTERM (spot reclaim, a scheduler's preemption): the open window is kept before we go.

:func:`install` (called on the main thread when a session opens its first window) puts a
SIGTERM handler in front of the one in place (Lightning's, the user's, or the default). On
SIGTERM it stops every open window, spools it as partial and hands it to the background
uploader, waits a little (at most :data:`SUMMARY_WAIT_S`) for its summary to be written, then
runs the previous handler; with the default one the process then dies of SIGTERM as it would
have. A window the uploader could not send stays pending for ``neuron-mlflow sync``.
:func:`uninstall` puts the previous handler back; a session's ``close()`` calls it when no
window is open in the process any more, so nothing of ours stays installed after it.

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
from collections.abc import Callable, Iterable
from typing import Any

SUMMARY_WAIT_S = 10.0
"""How long the SIGTERM handler waits for the open windows' summaries (seconds)."""

_previous: Any = None
_sessions: Callable[[], Iterable[Any]] | None = None


def install(open_sessions: Callable[[], Iterable[Any]] | None = None) -> None:
    """Put our SIGTERM handler in front of the current one (main thread only; idempotent).

    Args:
        open_sessions: returns the sessions with an open window (each has ``flush()`` and
            ``wait_summaries(timeout_s)``).
    """
    global _previous, _sessions
    if open_sessions is not None:
        _sessions = open_sessions
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


def _keep_open_windows() -> None:
    sessions = list(_sessions()) if _sessions is not None else []
    for session in sessions:
        with contextlib.suppress(Exception):
            session.flush()  # spooled as partial, handed to the uploader
    deadline = time.monotonic() + SUMMARY_WAIT_S
    for session in sessions:
        with contextlib.suppress(Exception):
            session.wait_summaries(max(0.0, deadline - time.monotonic()))


def _on_sigterm(signum: int, frame: Any) -> None:
    with contextlib.suppress(Exception):
        _keep_open_windows()
    previous = _previous
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # the default: die of SIGTERM, as without us
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
