"""Stub tracking servers on localhost: one that accepts and never answers, one that answers 503.

They stand for a sick server or a proxy in front of a dead one (not for MLflow itself: the
tests upload to a real ``mlflow server`` or SQLite store afterwards).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Stub:
    """A running stub: its ``http://`` URI and how many connections it accepted."""

    uri: str
    connections: int = 0
    _held: list[socket.socket] = field(default_factory=list)


def _serve(sock: socket.socket, stub: Stub, answer: bytes | None, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        stub.connections += 1
        if answer is None:
            stub._held.append(conn)  # keep it open, never answer
            continue
        with contextlib.suppress(OSError):
            conn.settimeout(2)
            conn.recv(65536)
            conn.sendall(answer)
        conn.close()


@contextlib.contextmanager
def stub_server(answer: bytes | None) -> Iterator[Stub]:
    """Serve ``answer`` to every request (``None``: accept and never answer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    stub = Stub(f"http://127.0.0.1:{sock.getsockname()[1]}")
    stop = threading.Event()
    thread = threading.Thread(target=_serve, args=(sock, stub, answer, stop), daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()
        for conn in stub._held:
            conn.close()


UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 19\r\nConnection: close\r\n\r\nService Unavailable"
)


@contextlib.contextmanager
def hanging_server() -> Iterator[Stub]:
    """Accepts connections and never answers."""
    with stub_server(None) as stub:
        yield stub


@contextlib.contextmanager
def unavailable_server() -> Iterator[Stub]:
    """Answers every request with HTTP 503."""
    with stub_server(UNAVAILABLE) as stub:
        yield stub
