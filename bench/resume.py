"""What a resume half-way through an epoch costs: bytes read from disk and time to the first batch.

A Loader reads the first half of an epoch and saves its state; then, in a fresh process with the
shards evicted from the page cache, a new Loader loads that state and reads the rest. Measured
in that process: seconds from building the Loader to its first batch, bytes the process read
from disk (/proc/self/io read_bytes) by the first batch and by the end of the epoch, against the
bytes of the shards the rest of the epoch needs. Several stoker versions may be compared in one
run (``--version NAME=ROOT``: a checkout of stoker, put first on the import path), alternating.

With ``--world W --resume-world W'`` the state is saved by rank 0 of W ranks and the rest is read
by all W' ranks of one node, in this one process (their batches taken in turn, as ranks stepping
together would): ``--mode global`` keeps the global batch (each rank's batch is BATCH * W / W'),
``--mode per-rank`` keeps BATCH per rank. The bytes read are then the node's, against the blocks
the rest of the epoch's global sequence needs.

    ../shared/hdd-profile -- .venv/bin/python bench/resume.py --version before=/work/wt/base
    ../shared/hdd-profile -- .venv/bin/python bench/resume.py --world 3 --resume-world 2 --mode global
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, med, prepared_photos  # noqa: E402

BATCH = 256


def read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no read_bytes in /proc/self/io")


def checkpoint(shards: Path, at: float, state_file: Path, world: int) -> None:
    """Read the first ``at`` of epoch 0 on rank 0 of ``world`` and save its state (rank 0's serves all)."""
    import stoker

    options = {"rank": 0, "world_size": world} if world > 1 else {}  # an older checkout: no elastic options
    loader = stoker.Loader(stoker.ShardDataset(shards), BATCH, threads=3, **options)
    stop = int(len(loader) * at)
    for n, _ in enumerate(loader, 1):
        if n == stop:
            break
    state_file.write_text(json.dumps(loader.state_dict()))


def resume(shards: Path, state_file: Path, world: int, batch: int) -> dict[str, float]:
    """Load the state in this fresh process and read the rest of the epoch on all ``world`` ranks."""
    import itertools

    import stoker

    start_bytes = read_bytes()
    started = time.perf_counter()
    dataset = stoker.ShardDataset(shards)
    options = [{"rank": rank, "world_size": world} for rank in range(world)] if world > 1 else [{}]
    loaders = [stoker.Loader(dataset, batch, threads=max(1, 3 // world), **o) for o in options]
    for loader in loaders:
        loader.load_state_dict(json.loads(state_file.read_text()))
    ranks = [iter(loader) for loader in loaders]
    for batches in ranks:  # the first step: every rank's first batch
        next(batches)
    first = time.perf_counter() - started
    first_bytes = read_bytes() - start_bytes
    rest = world
    for step in itertools.zip_longest(*ranks):
        rest += sum(batch is not None for batch in step)
    return {"first_batch_s": first, "bytes_by_first_batch": first_bytes, "bytes_by_epoch_end": read_bytes() - start_bytes,
            "batches": rest, "epoch_s": time.perf_counter() - started}


def rest_bytes(shards: Path, state_file: Path) -> int:
    """Bytes of the blocks the rest of the epoch's global sequence reads (what an ideal resume reads)."""
    import numpy as np

    import stoker
    from stoker.data.epoch import epoch_sequence
    from stoker.data.readahead import block_bounds_of

    dataset = stoker.ShardDataset(shards)
    state = json.loads(state_file.read_text())
    bounds = block_bounds_of(dataset.shards)
    order = epoch_sequence(bounds, "quasi_random", state["window"], state["seed"], state["epoch"])[state["samples_done"]:]
    total = 0
    for block in np.unique(np.searchsorted(bounds, order, side="right") - 1):
        shard, first = dataset.shards.locate(int(bounds[block]))
        start, end = dataset.shards.index(shard).span(first, first + int(bounds[block + 1] - bounds[block]) - 1)
        total += end - start
    return total


def child(version_root: str | None, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": version_root} if version_root else None
    out = subprocess.run([sys.executable, __file__, *args], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader-16k"))
    parser.add_argument("--count", type=int, default=16000)
    parser.add_argument("--at", type=float, default=0.5, help="where in the epoch to resume (default half-way)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--version", action="append", default=[], metavar="NAME=ROOT",
                        help="also measure the stoker checkout at ROOT (e.g. an older commit's worktree)")
    parser.add_argument("--world", type=int, default=1, help="ranks the state is saved on (rank 0's)")
    parser.add_argument("--resume-world", type=int, help="ranks that read the rest, all in one process (default --world)")
    parser.add_argument("--mode", choices=["global", "per-rank"], default="global",
                        help="keep the global batch (default) or the per-rank batch when the world size changes")
    parser.add_argument("--phase", choices=["checkpoint", "resume"], help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shards = args.data / "shards"
    resume_world = args.resume_world or args.world
    resume_batch = BATCH * args.world // resume_world if args.mode == "global" else BATCH
    if args.mode == "global" and BATCH * args.world % resume_world:
        parser.error(f"the global batch {BATCH * args.world} does not divide over {resume_world} ranks: --mode per-rank")
    if args.phase == "checkpoint":
        checkpoint(shards, args.at, args.state, args.world)
        return
    if args.phase == "resume":
        print(json.dumps(resume(shards, args.state, resume_world, resume_batch)))
        return

    header(f"resume at {args.at:.0%} of an epoch saved on {args.world} rank(s), read by {resume_world} rank(s) "
           f"x {resume_batch}: bytes read and time to the first step")
    prepared_photos(args.data, args.count)
    from stoker.storage import evict

    versions = {"this checkout": None, **dict(v.split("=", 1) for v in args.version)}
    files = sorted(shards.glob("shard-*"))
    states = {}
    for name, root in versions.items():
        states[name] = args.data / f"resume-state-{name.replace(' ', '_')}.json"
        child(root, "--phase", "checkpoint", "--data", str(args.data), "--at", str(args.at), "--state", str(states[name]),
              "--world", str(args.world))
    results: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    for _ in range(args.repeat):
        for name, root in versions.items():
            evict(files)
            line = child(root, "--phase", "resume", "--data", str(args.data), "--state", str(states[name]),
                         "--world", str(args.world), "--resume-world", str(resume_world), "--mode", args.mode)
            results[name].append(json.loads(line))
    needed = rest_bytes(shards, states["this checkout"])
    total = sum(f.stat().st_size for f in files if f.suffix == ".tar")
    print(f"data set {total / 1e6:,.0f} MB; the rest of the epoch after {args.at:.0%} needs {needed / 1e6:,.0f} MB of blocks")
    print(f"{'version':16} {'1st step s':>10} {'MB by 1st step':>14} {'MB by epoch end':>15} {'x needed':>8} "
          f"{'rest of epoch s':>15}")
    for name, runs in results.items():
        read = med([r['bytes_by_epoch_end'] for r in runs])
        print(f"{name:16} {med([r['first_batch_s'] for r in runs]):10.2f} "
              f"{med([r['bytes_by_first_batch'] for r in runs]) / 1e6:14,.0f} {read / 1e6:15,.0f} {read / needed:8.2f} "
              f"{med([r['epoch_s'] for r in runs]):15.1f}")


if __name__ == "__main__":
    main()
