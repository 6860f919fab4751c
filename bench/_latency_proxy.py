"""A TCP proxy on localhost that holds every HTTP request for a fixed delay before passing it on:
an object store that answers from far away, made from a local one (moto)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


class LatencyProxy:
    """Listens on a free localhost port (``url``) and forwards to ``upstream_port``, adding
    ``delay`` seconds before each request (keep-alive connections included)."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port, self.delay = upstream_port, delay
        self.requests = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                if requests and data.startswith(_METHODS):
                    self.requests += 1
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def run_in_process(upstream_port: int, delay: float) -> tuple[subprocess.Popen, str]:
    """Start a proxy in a process of its own (in the caller's process its threads would take the
    GIL from the code being measured); returns the process and the proxy's URL."""
    process = subprocess.Popen([sys.executable, __file__, str(upstream_port), str(delay)], stdout=subprocess.PIPE,
                               text=True)
    return process, process.stdout.readline().strip()


if __name__ == "__main__":
    proxy = LatencyProxy(int(sys.argv[1]), float(sys.argv[2]))
    print(proxy.url, flush=True)
    threading.Event().wait()
