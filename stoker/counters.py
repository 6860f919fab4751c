"""What the kernel counts that tells a measurement whether other processes shared the machine:
the busy time of this process's cores (``/proc/stat``) and the bytes this process caused to be
read from storage (``/proc/self/io``). The doctor's probes (doctor/contention.py) and the Loader's
tuner (loader/meter.py) read them the same way; where /proc is missing they say so (None, 0).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_cpu_seconds(cpus: list[int]) -> float | None:
    """Seconds the ``cpus`` have been busy since boot (user, nice, system, interrupts and the time
    a hypervisor gave to another machine), from /proc/stat; None where it is not readable."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{k}" for k in cpus}
    ticks = 0
    for line in lines:
        if not line.startswith("cpu"):  # the intr line alone holds a number per interrupt source
            continue
        fields = line.split()
        if fields[0] in wanted:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / TICKS


def own_read_bytes() -> int:
    """Bytes this process (all its threads) caused to be read from storage (``read_bytes``)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def available_memory() -> float:
    """Bytes of memory the kernel says can be taken without swapping (``MemAvailable``), else free."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
