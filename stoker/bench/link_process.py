"""A :class:`ShapedLink` in a process of its own, with the same methods (benchmarks: the proxy's
threads then do not take the measured process's GIL): :func:`start_link_process` starts it,
:class:`LinkProcess` sends it the methods' calls as JSON lines. From a shell::

    python -m stoker.bench.link_process UPSTREAM_PORT --delay-ms 20 --rate-mbit 1000 --reset 0.01
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import threading
from typing import Any

from stoker.bench.link import FAULT_KINDS, Faults, ShapedLink


class LinkProcess:
    """A :class:`ShapedLink` in a child process (see :func:`start_link_process`): the same
    methods, sent over its stdin and answered on its stdout."""

    def __init__(self, process: subprocess.Popen, url: str) -> None:
        self.process, self.url = process, url
        self.port = int(url.rsplit(":", 1)[1])
        self._lock = threading.Lock()

    def counts(self) -> dict[str, int]:
        """As :meth:`ShapedLink.counts`."""
        return self._call("counts")

    def traffic(self) -> dict[str, dict[str, int]]:
        """As :meth:`ShapedLink.traffic`."""
        return self._call("traffic")

    def ranges(self, method: str = "GET") -> list[str]:
        """As :meth:`ShapedLink.ranges`."""
        return self._call("ranges", method)

    def inject(self, *kinds: str) -> None:
        """As :meth:`ShapedLink.inject`."""
        self._call("inject", *kinds)

    def set_faults(self, faults: Faults) -> None:
        """As :meth:`ShapedLink.set_faults`."""
        self._call("set_faults", dataclasses.asdict(faults))

    def stop(self) -> None:
        """As :meth:`ShapedLink.stop`."""
        self._call("stop")

    def start(self) -> None:
        """As :meth:`ShapedLink.start`."""
        self._call("start")

    def down(self, seconds: float) -> None:
        """As :meth:`ShapedLink.down`."""
        self._call("down", seconds)

    def close(self) -> None:
        """End the process."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> LinkProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, command: str, *args: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._lock:
            self.process.stdin.write(json.dumps([command, *args]) + "\n")
            self.process.stdin.flush()
            reply = json.loads(self.process.stdout.readline() or "null")
        if not isinstance(reply, dict) or "error" in (reply or {}):
            raise RuntimeError(f"link process: {command} failed: {reply}")
        return reply["result"]


def start_link_process(upstream_port: int, *, delay: float = 0.0, rate: float | None = None,
                       stream_rate: float | None = None, faults: Faults | None = None, seed: int = 0) -> LinkProcess:
    """A :class:`ShapedLink` (same arguments; ``faults`` None: none) in a process of its own; call
    ``close()`` at the end."""
    args = [sys.executable, "-m", "stoker.bench.link_process", str(upstream_port), "--delay-ms", str(delay * 1e3),
            "--seed", str(seed), *(["--rate-mbit", str(rate * 8 / 1e6)] if rate is not None else []),
            *(["--stream-mbit", str(stream_rate * 8 / 1e6)] if stream_rate is not None else [])]
    for kind, value in dataclasses.asdict(faults or Faults()).items():
        args += [f"--{kind.replace('_', '-')}", str(value)]
    process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://"):
        process.kill()
        raise RuntimeError(f"link process did not start (exit status {process.wait()})")
    return LinkProcess(process, url)


def _serve_commands(link: ShapedLink) -> None:
    """Answer :class:`LinkProcess`'s commands (JSON lines on stdin) until stdin closes."""
    for line in sys.stdin:
        command, *args = json.loads(line)
        try:
            if command == "set_faults":
                args = [Faults(**args[0])]
            result = getattr(link, command)(*args) if command in _COMMANDS else None
            reply: dict[str, Any] = {"result": result} if command in _COMMANDS else {"error": f"unknown {command}"}
        except Exception as e:  # noqa: BLE001 -- reported to the parent, which raises
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)
    link.close()


_COMMANDS = {"counts", "traffic", "ranges", "inject", "set_faults", "stop", "start", "down"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("upstream_port", type=int)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--rate-mbit", type=float, default=None, help="response bytes, in Mbit/s (default: unlimited)")
    parser.add_argument("--stream-mbit", type=float, default=None,
                        help="response bytes of each request, in Mbit/s (a store's per-connection rate; default: unlimited)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    for kind in FAULT_KINDS:
        parser.add_argument(f"--{kind.replace('_', '-')}", type=float, default=0.0, help=f"rate of '{kind}' faults")
    args = parser.parse_args()
    faults = Faults(**{kind: getattr(args, kind) for kind in FAULT_KINDS})
    rate = args.rate_mbit * 1e6 / 8 if args.rate_mbit is not None else None
    stream_rate = args.stream_mbit * 1e6 / 8 if args.stream_mbit is not None else None
    link = ShapedLink(args.upstream_port, delay=args.delay_ms / 1e3, rate=rate, stream_rate=stream_rate, faults=faults,
                      seed=args.seed, port=args.port)
    print(link.url, flush=True)
    _serve_commands(link)


if __name__ == "__main__":
    main()
