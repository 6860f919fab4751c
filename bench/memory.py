"""Memory per DataLoader worker: stoker's memory-mapped index versus an index kept as Python lists.

Target: with a 2,000,000-sample data set of tiny samples, a DataLoader with 4 workers adds < 50 MB
per worker for stoker's index. Each worker's memory is read from /proc/<pid>/smaps_rollup:

    RSS  every resident page, shared ones included (overstates what a worker adds)
    PSS  shared pages split among the processes that map them
    USS  Private_Clean + Private_Dirty: pages only this worker holds, what it adds ("added" below)
    growth since fork: end minus a snapshot taken by worker_init_fn, before the worker reads anything

Each trial is a fresh interpreter; order baseline, stoker, baseline, ... (A-B-A), then medians.
The baseline keeps a list of (key, shard, offset, size, label) tuples, as ImageFolder keeps
``samples``; its workers unpack a tuple per read, so refcount writes copy those pages. "null" (no
index) is a bare worker; "stoker-noverify" is ShardDataset(verify=False); "stoker-parent" opens
every index in the parent before fork (as QuasiRandomSampler and ``.targets`` do). Workers fork,
persist, and read --touch random samples spread over the whole data set. Run by hand, no GPU needed;
the data set is built once under --data:

    .venv/bin/python bench/memory.py            # 2,000,000 samples
    .venv/bin/python bench/memory.py --quick    # 200,000 samples
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
import torch.utils.data as tud
from PIL import Image

import stoker
from stoker.format import Manifest, ShardEntry, ShardIndex, read_manifest, shard_name, write_manifest
from stoker.pack.writer import ShardWriter

WORKERS, SHARDS, CLASSES, LIMIT_MB, MB = 4, 50, 1000, 50.0, 1e6
KINDS = ("baseline", "stoker", "null", "stoker-noverify", "stoker-parent")


def tiny_png() -> bytes:
    """The same 8x8 noise PNG (268 bytes) for every sample."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def write_shard(job: tuple[str, int, int, int]) -> ShardEntry:
    root, number, start, stop = job
    png = tiny_png()
    with ShardWriter(root, shard_name(number)) as writer:
        for i in range(start, stop):
            label = i % CLASSES
            writer.add(f"c{label:03d}/{i:08d}", label, [("png", png), ("cls", str(label).encode())])
        return dataclasses.replace(writer.commit().entry, start=start)


def build(root: Path, n: int) -> None:
    """Write shards straight with ShardWriter (no source files, no ``stoker pack``), then the manifest."""
    if (root / "stoker.json").exists():
        found = len(stoker.ShardDataset(root))
        if found != n:
            sys.exit(f"{root} holds {found} samples, not {n}; pass another --data or delete it")
        print(f"reusing {root} ({n:,} samples)")
        return
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, SHARDS + 1).astype(int).tolist()
    with Pool(os.cpu_count()) as pool:
        entries = pool.map(write_shard, [(str(root), k, bounds[k], bounds[k + 1]) for k in range(SHARDS)])
    write_manifest(root, Manifest(num_samples=n, shards=entries, schema={"png": "image", "cls": "class"},
                                  classes=[f"c{k:03d}" for k in range(CLASSES)], source={"kind": "synthetic"},
                                  created_by={"stoker_version": stoker.__version__, "tool": "bench/memory.py"}))
    assert len(stoker.ShardDataset(root)) == n
    size = sum(e.bytes + e.index_bytes for e in entries) / MB
    print(f"built {root}: {n:,} samples, {SHARDS} shards, {size:,.0f} MB in {time.perf_counter() - started:.1f} s")


class NaiveDataset(tud.Dataset):
    """The usual index: one Python tuple (key, shard, offset, size, label) per sample in a list."""

    def __init__(self, root: Path) -> None:
        shards = read_manifest(root).shards
        self.paths = [str(root / s.name) for s in shards]
        self.samples: list[tuple[str, int, int, int, int]] = []
        for number, entry in enumerate(shards):
            index = ShardIndex.open(root / entry.index)
            keys = index._keys.tobytes().decode().split("\0")[1:-1]  # key table, NUL-separated
            image = index.members[index.samples["first_member"]]  # the png member is written first
            self.samples += zip(keys, [number] * len(keys), image["offset"].tolist(), image["size"].tolist(),
                                index.labels.tolist())
        self.fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        key, shard, offset, size, label = self.samples[i]  # refcount writes: copy-on-write of these pages
        if shard not in self.fds:
            self.fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return os.pread(self.fds[shard], size, offset), label


class NullDataset(NaiveDataset):
    """No index: the cost of a bare worker."""

    def __init__(self, n: int) -> None:
        self.samples, self.png = range(n), tiny_png()  # type: ignore[assignment]

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return self.png, i % CLASSES


def rollup(pid: int) -> dict[str, float]:
    """RSS, PSS, USS (private) and PSS of file pages of ``pid``, in MB."""
    kb = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, _ = line.split()
        kb[name.rstrip(":")] = int(value) * 1024 / 1e6  # smaps "kB" are KiB; report MB = 10^6 bytes
    return {"rss": kb["Rss"], "pss": kb["Pss"], "uss": kb["Private_Clean"] + kb["Private_Dirty"],
            "pss_file": kb.get("Pss_File", 0.0)}


def children(pid: int) -> list[int]:
    """Child pids (the DataLoader workers): psutil if installed, else /proc."""
    try:
        import psutil
        return [c.pid for c in psutil.Process(pid).children()]
    except ImportError:
        return [int(p) for task in Path(f"/proc/{pid}/task").iterdir() for p in (task / "children").read_text().split()]


def opened(dataset: stoker.ShardDataset) -> stoker.ShardDataset:
    """Open every index in the parent before fork, as QuasiRandomSampler or ``.targets`` do."""
    _ = dataset.targets
    return dataset


def record_start(folder: str, worker_id: int) -> None:
    """worker_init_fn: note the worker's memory right after fork, before it reads anything."""
    Path(folder, f"{os.getpid()}.json").write_text(json.dumps(rollup(os.getpid())))


def trial(kind: str, root: Path, touch: int, batch: int) -> dict:
    """One measurement, in this (fresh) process; returns main and per-worker memory in MB."""
    start = rollup(os.getpid())
    n = read_manifest(root).num_samples
    dataset: tud.Dataset = {"null": lambda: NullDataset(n), "baseline": lambda: NaiveDataset(root),
                            "stoker": lambda: stoker.ShardDataset(root, decode="raw"),
                            "stoker-noverify": lambda: stoker.ShardDataset(root, decode="raw", verify=False),
                            "stoker-parent": lambda: opened(stoker.ShardDataset(root, decode="raw"))}[kind]()
    built = rollup(os.getpid())
    folder = tempfile.mkdtemp(prefix="stoker-memory-")
    indices = np.random.default_rng(0).choice(n, size=min(touch, n), replace=False).tolist()
    loader = tud.DataLoader(dataset, batch_size=batch, sampler=tud.SubsetRandomSampler(indices), num_workers=WORKERS,
                            persistent_workers=True, multiprocessing_context="fork",
                            worker_init_fn=functools.partial(record_start, folder))
    started, samples = time.perf_counter(), sum(len(labels) for _, labels in loader)
    seconds = time.perf_counter() - started
    workers = [{**rollup(pid), "at_fork": json.loads(Path(folder, f"{pid}.json").read_text())}
               for pid in sorted(children(os.getpid()))]
    shutil.rmtree(folder)
    if len(workers) != WORKERS:
        raise RuntimeError(f"found {len(workers)} child processes, expected {WORKERS} workers")
    return {"kind": kind, "samples": samples, "seconds": seconds, "start": start, "built": built,
            "after": rollup(os.getpid()), "workers": workers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="200,000 samples instead of 2,000,000")
    p.add_argument("--data", type=Path, help="data set folder, built if missing (default bench-data/memory-2m or -200k)")
    p.add_argument("--touch", type=int, default=20_000, help="samples read per trial, all workers (default 20000)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2, help="stoker trials; baseline gets one more (A-B-A-B-A)")
    p.add_argument("--trial", choices=KINDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    n = 200_000 if args.quick else 2_000_000
    root = args.data or Path("bench-data") / ("memory-200k" if args.quick else "memory-2m")
    if args.trial:
        print(json.dumps(trial(args.trial, root, args.touch, args.batch_size)))
        return
    print("command:", shlex.join([sys.executable, *sys.argv]))
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {os.cpu_count()} cores, {ram:.0f} GiB RAM; uptime: {uptime}")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, stoker {stoker.__version__}")
    build(root, n)
    order = ["baseline", "stoker"] * args.rounds + ["baseline", "null", "stoker-noverify", "stoker-parent"]
    results: dict[str, list[dict]] = {k: [] for k in KINDS}
    for kind in order:
        cmd = [sys.executable, __file__, "--trial", kind, "--data", str(root), "--touch", str(args.touch),
               "--batch-size", str(args.batch_size)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        results[kind].append(r)
        print(f"  {kind:16} {len(r['workers'])} workers, {r['samples']:,} samples in {r['seconds']:5.1f} s; MB per worker:"
              + "".join(f" {m.upper()} " + " ".join(f"{w[m]:6.1f}" for w in r["workers"]) for m in ("uss", "pss", "rss")))

    def med(kind: str, f) -> float:
        return statistics.median(f(r, w) for r in results[kind] for w in r["workers"])

    rows = [("worker USS = private, 'added'", lambda r, w: w["uss"]),
            ("worker PSS", lambda r, w: w["pss"]),
            ("  of which file pages (mmap)", lambda r, w: w["pss_file"]),
            ("worker RSS", lambda r, w: w["rss"]),
            ("worker RSS growth since fork", lambda r, w: w["rss"] - w["at_fork"]["rss"]),
            ("worker USS growth since fork", lambda r, w: w["uss"] - w["at_fork"]["uss"]),
            ("main USS: index build", lambda r, w: r["built"]["uss"] - r["start"]["uss"]),
            ("main RSS after loading", lambda r, w: r["after"]["rss"])]
    print(f"\n{n:,} samples, {WORKERS} workers, {args.touch:,} random reads, medians in MB"
          f" (trials: {', '.join(f'{k} {len(results[k])}' for k in KINDS)})")
    print(f"{'':30}" + "".join(f"{k:>16}" for k in KINDS) + f"{'baseline/stoker':>16}")
    for label, f in rows:
        values = [med(k, f) for k in KINDS]
        ratio = values[0] / values[1] if values[1] else float("nan")
        print(f"{label:30}" + "".join(f"{v:16.1f}" for v in values) + f"{ratio:16.1f}")
    uss, pss, rss = (med("stoker", rows[i][1]) for i in (0, 1, 4))
    bare_uss, bare_pss = med("null", rows[0][1]), med("null", rows[1][1])
    print(f"\n{'PASS' if uss < LIMIT_MB else 'FAIL'}: stoker adds {uss:.1f} MB private (USS) per worker"
          f" ({uss - bare_uss:.1f} MB over a bare worker); target < {LIMIT_MB:.0f} MB")
    print(f"{'pass' if pss - bare_pss < LIMIT_MB else 'over'} by PSS (shared pages split): {pss:.1f} MB per worker,"
          f" {pss - bare_pss:.1f} MB over a bare worker")
    print(f"{'pass' if rss < LIMIT_MB else 'over'} by RSS growth since fork (shared pages counted in full): {rss:.1f} MB")


if __name__ == "__main__":
    main()
