"""HTTP/1.1 messages as the shaped link (stoker.bench.link) reads and rewrites them: a message's
head (start line and headers), its headers by name, one header left out, its body as it came."""

from __future__ import annotations

from typing import IO


def read_head(stream: IO[bytes]) -> bytes | None:
    """A message's start line and headers up to the blank line; None at a clean end of stream."""
    lines: list[bytes] = []
    while True:
        line = stream.readline(65536)
        if not line:
            if lines:
                raise ConnectionError("connection closed inside a message head")
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n") and len(lines) > 1:
            return b"".join(lines)
        if line in (b"\r\n", b"\n"):
            lines.clear()  # a stray blank line between messages


def parse_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    first, *rest = head.split(b"\r\n")
    headers = {}
    for line in rest:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return first, headers


def without_header(head: bytes, name: bytes) -> bytes:
    lines = head.split(b"\r\n")
    return b"\r\n".join(line for line in lines if line.partition(b":")[0].strip().lower() != name)


def read_body(stream: IO[bytes], headers: dict[bytes, bytes]) -> bytes:
    """A message body as it came (chunked framing kept): by Content-Length, chunked, or none."""
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        parts = []
        while True:
            size_line = stream.readline(65536)
            parts.append(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := stream.readline(65536)) not in (b"\r\n", b"\n", b""):
                    parts.append(trailer)
                parts.append(b"\r\n")
                return b"".join(parts)
            parts.append(stream.read(size + 2))
    if b"content-length" in headers:
        return stream.read(int(headers[b"content-length"]))
    return b""
