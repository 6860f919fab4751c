"""Measuring one command in a fresh process: its JSON report lines, CPU time and peak memory.

Peak memory is the proportional set size (PSS) of the whole process tree: PSS splits shared pages
(torch's libraries, a page cache mapping, copy-on-write worker memory) between the processes that
share them, so summing it over a DataLoader's workers counts each page once, unlike RSS. Reading
PSS walks every page table (~7 ms per torch process here, and it holds the process's memory map
lock), so it is read only when the tree's RSS, which is cheap to read every 50 ms, reaches a new
high, and once a second otherwise: sampling PSS itself every 50 ms took ~20% of a core.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SAMPLE_SECONDS = 0.05
_PSS_EVERY_SECONDS = 1.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Measured:
    """What one run of a command reported and cost."""

    reports: list[dict[str, Any]]  # the JSON lines it printed
    cpu_seconds: float  # user + system, the process and every child it waited for
    peak_pss_bytes: int  # of the process tree
    wall_seconds: float


class CommandFailed(RuntimeError):
    """The measured command exited with an error; the message carries the end of its stderr."""


def measure(command: list[str], timeout: float = 900, env: dict[str, str] | None = None) -> Measured:
    """Run ``command``, sampling its process tree's PSS until it exits; parse the JSON lines it prints."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        top_rss, last_pss = 0, 0.0
        while not done.wait(_SAMPLE_SECONDS):
            rss = tree_memory(process.pid, "statm")
            if rss > top_rss * 1.02 or time.perf_counter() - last_pss > _PSS_EVERY_SECONDS:
                top_rss, last_pss = max(top_rss, rss), time.perf_counter()
                peak[0] = max(peak[0], tree_memory(process.pid, "pss"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise CommandFailed(f"{' '.join(command)}: still running after {timeout:.0f} s; killed") from None
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise CommandFailed(f"exit status {process.returncode}: {stderr.strip()[-2000:]}")
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(reports, cpu, peak[0], wall)


def tree_memory(pid: int, kind: str = "pss") -> int:
    """Bytes of memory of ``pid`` and all its descendants (processes that are gone count 0):
    ``pss`` from smaps_rollup (exact, slow) or ``statm``'s resident size (RSS, cheap)."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        proc = Path(f"/proc/{current}")
        try:
            if kind == "pss":
                line = next(x for x in (proc / "smaps_rollup").read_text().splitlines() if x.startswith("Pss:"))
                total += int(line.split()[1]) * 1024
            else:
                total += int((proc / "statm").read_text().split()[1]) * _PAGE_BYTES
            for task in (proc / "task").iterdir():
                pending.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, StopIteration):
            continue
    return total


def busy_cores(seconds: float = 2.0) -> float:
    """How many cores other processes kept busy over the next ``seconds`` (from /proc/stat)."""
    def ticks() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    busy0, total0 = ticks()
    time.sleep(seconds)
    busy1, total1 = ticks()
    cores = os.cpu_count() or 1
    return cores * (busy1 - busy0) / max(1, total1 - total0)
