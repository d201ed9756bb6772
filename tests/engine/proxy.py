"""A TCP proxy to a tracking server that can stop answering: it accepts connections and
holds them (no refusal, only time-outs), and cuts the calls in flight. Used by the on-demand
tests and ``benchmarks/on_demand_server_down.py``."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Forward 127.0.0.1:<port> to ``target_port``; ``hang = True`` stops answering."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.hang = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def resume(self) -> None:
        """Answer again; the connections held while hanging are closed."""
        self.hang = False
        held, self.held = self.held, []
        for conn in held:
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.hang:
                self.held.append(client)  # never answered
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.hang:
                    return  # a call in flight when the server stops never gets its answer
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (src, dst):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
