"""A shaped link to an object store, on loopback: an HTTP/1.1 proxy of ours in front of a local
S3-compatible server (moto) that makes it answer as one far away on a misbehaving network.

Per request it waits a set round trip (``delay``; a new connection waits one more, its
handshake), sends response bytes no faster than ``rate`` bytes/s over the whole link (a token
bucket shared by every connection), and injects faults at given rates (:class:`Faults`):
connections reset mid-response, ``503 SlowDown`` and ``500 InternalError`` answers (S3's XML
error bodies), bodies cut short (the full Content-Length promised, fewer bytes sent, the
connection closed), answers shorter than their Content-Range says (well framed), a Range header
dropped (the whole object answered, 200) and requests never answered (the connection held open,
silent). :meth:`ShapedLink.stop` takes the server "down" (connections refused and open ones
reset) until :meth:`ShapedLink.start`. Which request gets a fault is a pure function of
``seed``, the request (method, path, Range) and how many times that request came before, so a
run's faults do not depend on thread timing. No tc/netem, no root: traffic stays on 127.0.0.1.

:class:`ShapedLink` runs on threads of the calling process (tests);
:func:`stoker.bench.link_process.start_link_process` runs one in a process of its own with the
same methods (benchmarks: the proxy's threads then do not take the measured process's GIL).
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import IO

from stoker.bench.http_messages import parse_head, read_body, read_head, without_header

FAULT_KINDS = ("reset", "slow_down", "error", "cut", "short", "ignore_range", "black_hole")
# Faults that end a response body early: only a request answered with a body gets one.
_BODY_FAULTS = ("reset", "cut", "short")
# A "short" answer lacks this many bytes of its body (all of a body that small).
SHORT_BY = 100
_PIECE = 64 << 10  # response bytes sent per token-bucket draw
_BURST = 256 << 10  # bytes an idle link may send at once
_ERRORS = {"slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
           "error": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again.")}


@dataclass(frozen=True)
class Faults:
    """Per-request fault rates (each in [0, 1], summing to at most 1): ``reset`` (the connection
    reset partway through the response body), ``slow_down`` (503 SlowDown), ``error`` (500
    InternalError), ``cut`` (the body cut short after its headers promised all of it, then the
    connection closed), ``short`` (the answer's Content-Length and body :data:`SHORT_BY` bytes
    shorter than the server's, all else kept, the connection too: well framed, so only a client
    that checks the answer against its Content-Range, or the range it asked, sees it),
    ``ignore_range`` (the request's Range header dropped, so the whole object comes back with
    200: a server or proxy that ignores ranges; only requests with a Range get it),
    ``black_hole`` (the request read and never answered: the connection stays open and silent
    until the client gives up or the link stops)."""

    reset: float = 0.0
    slow_down: float = 0.0
    error: float = 0.0
    cut: float = 0.0
    short: float = 0.0
    ignore_range: float = 0.0
    black_hole: float = 0.0

    def __post_init__(self) -> None:
        rates = dataclasses.astuple(self)
        if any(not 0.0 <= r <= 1.0 for r in rates) or sum(rates) > 1.0:
            raise ValueError(f"fault rates must lie in [0, 1] and sum to at most 1, got {self}")


class ShapedLink:
    """Listens on ``127.0.0.1:port`` (a free one by default; :attr:`url`) and forwards HTTP/1.1 to
    ``127.0.0.1:upstream_port``, shaped: ``delay`` seconds per request (and per new connection),
    response bytes at most ``rate`` bytes/s over the link and ``stream_rate`` bytes/s per response
    (a store's per-connection rate; None: unlimited), ``faults`` drawn with ``seed``. Counts
    requests, connections, response body bytes sent and each fault (:meth:`counts`), and the
    requests and body bytes of each object (:meth:`traffic`). One link per client (a simulated
    node, bench/nodes.py) counts what each client asked of the store."""

    def __init__(self, upstream_port: int, *, delay: float = 0.0, rate: float | None = None,
                 stream_rate: float | None = None, faults: Faults = Faults(), seed: int = 0, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.delay, self.faults, self.seed = delay, faults, seed
        self._bucket = _Bucket(rate)
        _Bucket(stream_rate)  # checked now, one made per response
        self.stream_rate = stream_rate
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("requests", "connections", "body_bytes", *FAULT_KINDS), 0)
        self._seen: dict[bytes, int] = {}
        self._ranges: list[tuple[str, str]] = []  # (method, Range header) of each request
        self._traffic: dict[str, dict[str, int]] = {}  # "METHOD /path": requests, body bytes
        self._injected: list[str] = []
        self._clients: set[socket.socket] = set()
        self._server: socket.socket | None = None
        self.port = port
        self.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def counts(self) -> dict[str, int]:
        """Requests, connections, response body bytes sent, and how many of each fault so far."""
        with self._lock:
            return dict(self._counts)

    def ranges(self, method: str = "GET") -> list[str]:
        """The Range header of each ``method`` request so far, in order ('' for one without)."""
        with self._lock:
            return [byte_range for m, byte_range in self._ranges if m == method]

    def traffic(self) -> dict[str, dict[str, int]]:
        """Per object, as ``"GET /bucket/key"`` (the query string left out): its ``requests`` and the
        response ``body_bytes`` sent for them, so far."""
        with self._lock:
            return {request: dict(tally) for request, tally in self._traffic.items()}

    def inject(self, *kinds: str) -> None:
        """The next requests get these faults, one each, in order (before any drawn at random; a
        reset, a cut or a short body goes to the next request that is not a HEAD, a dropped
        Range to the next request with one)."""
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")
        with self._lock:
            self._injected.extend(kinds)

    def set_faults(self, faults: Faults) -> None:
        """Draw from these rates from now on."""
        self.faults = faults

    def stop(self) -> None:
        """The server goes down: new connections are refused, open ones are reset."""
        with self._lock:
            server, self._server = self._server, None
            clients, self._clients = self._clients, set()
        if server is not None:
            try:  # wakes the thread blocked in accept(); a close alone would leave the port listening
                server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            server.close()
        for client in clients:
            _reset(client)

    def start(self) -> None:
        """The server is back: listen on the same port again (no-op when listening)."""
        with self._lock:
            if self._server is not None:
                return
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", self.port))
            server.listen(128)
            self.port = server.getsockname()[1]
            self._server = server
        threading.Thread(target=self._accept, args=(server,), name="stoker-link-accept", daemon=True).start()

    def down(self, seconds: float) -> None:
        """Stop now and start again after ``seconds`` (in the background)."""
        self.stop()
        timer = threading.Timer(seconds, self.start)
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        """Stop for good."""
        self.stop()

    def __enter__(self) -> ShapedLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:  # closed by stop()
                return
            with self._lock:
                if self._server is not server:
                    _reset(client)
                    return
                self._clients.add(client)
                self._counts["connections"] += 1
            threading.Thread(target=self._serve, args=(client,), name="stoker-link", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """Requests of one client connection, one at a time, each over this connection's own upstream one."""
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream: socket.socket | None = None
        from_upstream: IO[bytes] | None = None
        from_client = client.makefile("rb")
        try:
            time.sleep(self.delay)  # the handshake's round trip
            while True:
                head = read_head(from_client)
                if head is None:
                    return
                request_line, headers = parse_head(head)
                method, target = request_line.split(b" ")[:2]
                if headers.get(b"expect", b"").lower() == b"100-continue":  # answered here; the server sees none
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = without_header(head, b"expect")
                body = read_body(from_client, headers)
                fault, fraction = self._draw(method, target, headers.get(b"range", b""))
                tally = self._tally(method, target)
                if fault == "black_hole":
                    while from_client.read(1):  # silent until the client closes or stop() resets it
                        pass
                    return
                time.sleep(self.delay)
                if fault in _ERRORS:
                    self._answer_error(client, fault, method, target)
                    continue
                if fault == "ignore_range":
                    head = without_header(head, b"range")
                if upstream is None:
                    upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    from_upstream = upstream.makefile("rb")
                upstream.sendall(head + body)
                assert from_upstream is not None
                client_open, upstream_open = self._relay(client, from_upstream, method,
                                                         fault if fault in _BODY_FAULTS else None, fraction, tally)
                if not upstream_open:
                    from_upstream.close()
                    upstream.close()
                    upstream = from_upstream = None
                if not client_open:
                    return
        except OSError:
            pass
        finally:
            with self._lock:
                self._clients.discard(client)
            from_client.close()
            if upstream is not None:
                upstream.close()
            client.close()

    def _relay(self, client: socket.socket, from_upstream: IO[bytes], method: bytes, fault: str | None,
               fraction: float, tally: dict[str, int]) -> tuple[bool, bool]:
        """Pass one response on, shaped (and cut or reset by ``fault``), its body bytes counted in
        ``tally`` (the object's :meth:`traffic`) too: whether the client
        connection stays open, and whether the upstream one does. A server that closes after each
        answer (moto's does) still looks like a keep-alive store to the client: only the upstream
        connection is made again, on loopback, unshaped."""
        head = read_head(from_upstream)
        if head is None:
            raise ConnectionError("upstream closed the connection")
        status_line, headers = parse_head(head)
        status = int(status_line.split(b" ")[1])
        has_body = method != b"HEAD" and status >= 200 and status not in (204, 304)
        length = int(headers[b"content-length"]) if b"content-length" in headers else None
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        upstream_open = headers.get(b"connection", b"").lower() != b"close"
        if not has_body or length is None or length == 0 or chunked:
            fault = None  # only a body of known length is cut or reset
        head = without_header(head, b"connection")
        stop_at = length or 0
        if fault in ("cut", "reset"):
            stop_at = min(stop_at - 1, int(stop_at * fraction))
        elif fault == "short":  # well framed, holding less than its Content-Range says
            stop_at = max(0, stop_at - SHORT_BY)
            head = without_header(head, b"content-length")[:-2] + b"Content-Length: %d\r\n\r\n" % stop_at
        self._bucket.take(len(head))
        client.sendall(head)
        if not has_body:
            return True, upstream_open
        stream = _Bucket(self.stream_rate)
        if chunked or length is None:  # framed by chunks, or by the end of the connection
            body = read_body(from_upstream, headers) if chunked else from_upstream.read()
            for start in range(0, len(body), _PIECE):
                self._send(client, body[start : start + _PIECE], stream, tally)
            return chunked, chunked and upstream_open
        sent = 0
        while sent < stop_at:
            piece = from_upstream.read(min(_PIECE, stop_at - sent))
            if not piece:
                raise ConnectionError("upstream closed the connection mid-body")
            self._send(client, piece, stream, tally)
            sent += len(piece)
        if fault == "short":
            from_upstream.read(length - stop_at)  # what the client is not sent, for the next answer
            return True, upstream_open
        if fault == "reset":  # closed by _serve: with no linger, the close sends a reset
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False, False
        if fault == "cut":
            client.shutdown(socket.SHUT_RDWR)
            return False, False
        return True, upstream_open

    def _send(self, client: socket.socket, piece: bytes, stream: _Bucket, tally: dict[str, int]) -> None:
        stream.take(len(piece))
        self._bucket.take(len(piece))
        with self._lock:  # counted before the client can see them: a reader's counts() then includes them
            self._counts["body_bytes"] += len(piece)
            tally["body_bytes"] += len(piece)
        client.sendall(piece)

    def _tally(self, method: bytes, target: bytes) -> dict[str, int]:
        """The :meth:`traffic` entry of a ``method`` request for ``target``, counted once more."""
        request = f"{method.decode('latin-1')} {target.split(b'?')[0].decode('latin-1')}"
        with self._lock:
            tally = self._traffic.setdefault(request, {"requests": 0, "body_bytes": 0})
            tally["requests"] += 1
            return tally

    def _draw(self, method: bytes, target: bytes, byte_range: bytes) -> tuple[str | None, float]:
        """This request's fault (or None) and where in the body a cut or reset falls (a fraction)."""
        key = b" ".join((method, target, byte_range))
        with self._lock:
            self._counts["requests"] += 1
            self._ranges.append((method.decode("latin-1"), byte_range.decode("latin-1")))
            nth = self._seen.get(key, 0)
            self._seen[key] = nth + 1
            # A fault that needs a body (or a range) waits for a request that has one.
            takes = self._injected and _applies(self._injected[0], method, byte_range)
            injected = self._injected.pop(0) if takes else None
        digest = hashlib.blake2b(key + struct.pack("<qq", self.seed, nth), digest_size=16).digest()
        draw, where = (v / 2.0**64 for v in struct.unpack("<QQ", digest))
        fraction = 0.1 + 0.8 * where
        fault = injected
        if fault is None:
            edge = 0.0
            for kind, rate in zip(FAULT_KINDS, dataclasses.astuple(self.faults), strict=True):
                edge += rate
                if draw < edge:
                    fault = kind if _applies(kind, method, byte_range) else None
                    break
        if fault is not None:
            with self._lock:
                self._counts[fault] += 1
        return fault, fraction

    def _answer_error(self, client: socket.socket, fault: str, method: bytes, target: bytes) -> None:
        """S3's answer for ``fault`` (503 SlowDown or 500 InternalError), with its XML body."""
        status, reason, code, message = _ERRORS[fault]
        resource = target.split(b"?")[0].decode("latin-1")
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<Resource>{resource}</Resource><RequestId>stoker-link</RequestId></Error>").encode()
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {0 if method == b'HEAD' else len(body)}\r\nx-amz-request-id: stoker-link\r\n\r\n")
        client.sendall(head.encode() + (b"" if method == b"HEAD" else body))


def _applies(fault: str, method: bytes, byte_range: bytes) -> bool:
    """Whether ``fault`` can happen to a ``method`` request with this Range header ('' for none)."""
    if fault in _BODY_FAULTS:
        return method != b"HEAD"
    if fault == "ignore_range":
        return bool(byte_range)
    return True


class _Bucket:
    """A token bucket: :meth:`take` waits until ``n`` more bytes fit under ``rate`` bytes/s
    (an idle link may send :data:`_BURST` bytes at once)."""

    def __init__(self, rate: float | None) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive bytes/s or None, got {rate}")
        self.rate = rate
        self._free_at = 0.0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        if self.rate is None:
            return
        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now - _BURST / self.rate) + n / self.rate
            wait = self._free_at - now
        if wait > 0:
            time.sleep(wait)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), as a dropped connection looks to the peer.
    The shutdown ends it now even while a file made by makefile() holds the descriptor open (the
    reset then goes out when the serving thread closes that file)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
