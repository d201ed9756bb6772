"""Files made when a window opens, so that its end only overwrites and renames them.

At a window's end the training thread writes two small files, the window's manifest and the
worker's job, and renames each into place. Measured on a VM's ext4 (2 vCPUs, the CI
machine), a new inode costs about 0.12 ms and the first write into an empty file another
0.10 ms (the filesystem allocates and journals the growth), while overwriting bytes a file
already holds, cutting it to length and renaming it cost about 0.03 ms in all. Three such
files were a third of our own work at a small window's end (``benchmarks/window_end.py``).
So :func:`prepare_file` makes each file, with room, when the window opens (outside the
window, before the profiler starts), and :func:`write_whole` at its end overwrites it in
place and cuts it to the new content's length. ``write_whole`` works on any path: a file
that was not prepared is created, one left by an earlier crash is overwritten whole.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / ".job.tmp"
    >>> prepare_file(path)
    >>> path.stat().st_size == PREPARED_BYTES
    True
    >>> write_whole(path, b'{"window": "a"}')
    >>> path.read_bytes()
    b'{"window": "a"}'
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PREPARED_BYTES", "prepare_file", "write_whole"]

PREPARED_BYTES = 16384
"""Room made in a prepared file: more than a window's manifest at its end (about 4 KB with
the config, the environment tags and the params) and its job file (about 0.2 KB)."""


def prepare_file(path: Path, size: int = PREPARED_BYTES) -> None:
    """Make ``path`` (or remake it) holding ``size`` bytes of spaces."""
    path.write_bytes(b" " * size)


def write_whole(path: Path, data: bytes) -> None:
    """Make ``data`` the whole content of ``path``: overwritten in place and cut to length
    (created when missing). Not atomic by itself: write a temporary name, then rename it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:  # plain descriptors: no buffered file object for one write
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
