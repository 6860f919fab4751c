"""The node cache (``cache_dir=``) against the reads it replaces, in one run per part.

``hdd`` (run it under ../shared/hdd-profile: cold cache, 150 IOPS, 150 MiB/s):
  - the disk's sequential bandwidth (one shard read cold with 8 MiB reads);
  - stoker.Loader epochs 1-3 with ``cache_dir=/dev/shm/...`` (whole data set fits), against the
    same Loader with every shard already in the page cache (the warm-cache rate);
  - a cache limit of half the data set: raw sample bytes delivered per second through a
    QuasiRandomSampler and a 2-worker DataLoader, against the disk's sequential bandwidth.
``s3``: the same data on a moto S3 server behind a proxy adding 50 ms to every request (and with
``--stream-mbit``, holding each response to that rate, as a store caps one connection):
  - whole-shard downloads into /dev/shm, MB/s: the node cache's (``reads_in_flight`` ranged parts
    at once) against one streamed GET per shard (s3fs's ``get_file``, what it did before);
  - time to the first batch and img/s of stoker.Loader with ``cache_dir=/dev/shm/...``, against
    the same Loader over the shards on local disk (page cache warm).
``downloads``: only the whole-shard downloads, with 2, 4, 8 and 16 parts in flight.
``staged``: stoker.Loader over a node cache in /dev/shm holding every shard (staged before the
first pass) against the same Loader over the same shards on local disk (page cache warm), passes
interleaved A B A after one pass each to warm up: img/s and the ratio (target: 0.97 or more).

    ../shared/hdd-profile -- .venv/bin/python bench/cache.py hdd
    .venv/bin/python bench/cache.py s3 [--stream-mbit 400]
    .venv/bin/python bench/cache.py staged [--threads N] [--quick]

``--quick`` (1,000 photos under ``--data``/quick, 3 rounds) shows the direction in about a minute;
the figures to report come from the full run on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import s3fs
import torch.utils.data

import stoker
from stoker.bench.link_process import start_link_process
from stoker.format import read_manifest
from stoker.storage import evict
from stoker.storage.remote import DEFAULT_PARALLEL, RemoteData

from _common import header, packed_photos

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.s3server import S3Server  # noqa: E402 -- the tests' moto server, started the same way

SHARD_BYTES = 32 << 20  # ~9 shards of the 4,000 photos: enough to cache half of them


def evict_all(shards: Path) -> None:
    evict(shards.iterdir())


def warm_all(shards: Path) -> None:
    for path in shards.iterdir():
        path.read_bytes()


def sequential_mb_s(paths: list[Path]) -> float:
    """MB/s of one cold read of ``paths`` back to back in 8 MiB pieces (long enough that the
    throttle's burst allowance does not count)."""
    evict(paths)
    start = time.perf_counter()
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while data := f.read(8 << 20):
                total += len(data)
    return total / 1e6 / (time.perf_counter() - start)


def timed_epoch(loader: stoker.Loader, step: float = 0.0) -> tuple[float, float, float]:
    """One pass: seconds to the first batch, img/s over the pass, img/s after the first batch.
    With ``step``, the loop sleeps that long per batch (a GPU step, leaving the cores to the loader)."""
    start = time.perf_counter()
    first = float("nan")
    n = 0
    for images, _ in loader:
        if n == 0:
            first = time.perf_counter() - start
        n += len(images)
        time.sleep(step)
    elapsed = time.perf_counter() - start
    return first, n / elapsed, (n - loader.batch_size) / (elapsed - first)


def loader_epochs(dataset: stoker.ShardDataset, epochs: int, step: float = 0.0) -> list[tuple[float, float, float]]:
    """:func:`timed_epoch` for ``epochs`` passes of one stoker.Loader (batches of 256)."""
    loader = stoker.Loader(dataset, 256, seed=0)
    return [timed_epoch(loader, step) for _ in range(epochs)]


def raw_epoch_mb_s(dataset: stoker.ShardDataset) -> float:
    """MB/s of stored image bytes delivered by a QuasiRandomSampler and 2 DataLoader workers."""
    sampler = stoker.QuasiRandomSampler(dataset, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=2,
                                         collate_fn=lambda batch: sum(len(data) for data, _ in batch))
    start = time.perf_counter()
    total = sum(loader)
    return total / 1e6 / (time.perf_counter() - start)


def fresh_cache(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root


def hdd(shards: Path, repeat: int) -> None:
    cache = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir="/dev/shm"))
    total = sum(entry.bytes for entry in read_manifest(shards).shards)
    names = sorted(shards.glob("*.tar"))
    seq, cached, warm, half, plain = [], [], [], [], []
    try:
        for _ in range(repeat):
            seq.append(sequential_mb_s(names))
            evict_all(shards)
            epochs = loader_epochs(stoker.ShardDataset(shards, cache_dir=fresh_cache(cache)), 3)
            cached.append([rate for _, rate, _ in epochs])
            warm_all(shards)
            warm.append(statistics.median(rate for _, rate, _ in loader_epochs(stoker.ShardDataset(shards), 2)))
            evict_all(shards)
            half.append(raw_epoch_mb_s(stoker.ShardDataset(shards, decode="raw", cache_dir=fresh_cache(cache),
                                                           cache_limit=total // 2)))
            evict_all(shards)
            plain.append(raw_epoch_mb_s(stoker.ShardDataset(shards, decode="raw")))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    med = statistics.median
    print(f"data: {len(names)} shards, {total / 1e6:.0f} MB; medians of {repeat} rounds")
    print(f"disk sequential read (every shard, back to back): {med(seq):.0f} MB/s")
    for epoch in range(3):
        print(f"Loader, cache_dir=/dev/shm, epoch {epoch + 1}: {med(r[epoch] for r in cached):,.0f} img/s")
    print(f"Loader, page cache warm (no cache_dir): {med(warm):,.0f} img/s")
    print(f"ratio epoch 2 / warm: {med(r[1] for r in cached) / med(warm):.2f}  "
          f"epoch 3 / warm: {med(r[2] for r in cached) / med(warm):.2f}")
    print(f"raw bytes, cache_limit = half the data set: {med(half):.0f} MB/s = {med(half) / med(seq):.0%} of sequential")
    print(f"raw bytes, no cache (block read-ahead only): {med(plain):.0f} MB/s = {med(plain) / med(seq):.0%} of sequential")


def download_mb_s(shards: Path, options: dict, into: Path, parts: bool, in_flight: int = DEFAULT_PARALLEL) -> float:
    """MB/s of downloading every shard of s3://data/ds into ``into``, one shard after another: by
    the node cache's download (``parts``, ``in_flight`` at once), or one s3fs ``get_file`` each."""
    manifest = read_manifest(shards)
    fs = s3fs.S3FileSystem(**options)
    source = RemoteData("s3://data/ds", options, parallel=in_flight)
    start = time.perf_counter()
    for entry in manifest.shards:
        if parts:
            source.download(entry.name, entry.bytes, entry.checksum, into / "partial", lambda copy: copy.unlink())
        else:
            fs.get_file(f"data/ds/{entry.name}", str(into / "copy"))
            (into / "copy").unlink()
    return sum(entry.bytes for entry in manifest.shards) / 1e6 / (time.perf_counter() - start)


def downloads(shards: Path, repeat: int, delay: float, stream_rate: float | None) -> None:
    """Only the whole-shard downloads: the node cache's with 2, 4, 8 and 16 parts in flight
    (1 would be its one streamed GET) against one s3fs get_file per shard, interleaved."""
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-s3-"))
    into = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir="/dev/shm"))
    server = S3Server(work / "requests.log")
    link = start_link_process(server.port, delay=delay, stream_rate=stream_rate)
    counts = (2, 4, 8, 16)
    runs: dict[str, list[float]] = {"get_file": [], **{f"{n} parts in flight": [] for n in counts}}
    try:
        server.fs.mkdir("data")
        server.fs.put(str(shards) + "/", "data/ds", recursive=True)
        options = {**server.options, "client_kwargs": {**server.options["client_kwargs"], "endpoint_url": link.url}}
        for _ in range(repeat):
            runs["get_file"].append(download_mb_s(shards, options, into, parts=False))
            for n in counts:
                runs[f"{n} parts in flight"].append(download_mb_s(shards, options, into, parts=True, in_flight=n))
    finally:
        link.close()
        server.stop()
        shutil.rmtree(into, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    stream = f", each response at most {stream_rate * 8 / 1e6:.0f} Mbit/s" if stream_rate else ""
    print(f"whole-shard downloads, {delay * 1e3:.0f} ms per request{stream}, medians of {repeat}: " + "   ".join(
        f"{name} {statistics.median(values):.0f} MB/s" for name, values in runs.items()))


def s3(shards: Path, repeat: int, delay: float, stream_rate: float | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-s3-"))
    cache = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir="/dev/shm"))
    os.environ["XDG_CACHE_HOME"] = str(work / "xdg")
    server = S3Server(work / "requests.log")
    link = start_link_process(server.port, delay=delay, stream_rate=stream_rate)
    url = link.url
    try:
        server.fs.mkdir("data")
        server.fs.put(str(shards) + "/", "data/ds", recursive=True)
        options = {**server.options, "client_kwargs": {**server.options["client_kwargs"], "endpoint_url": url}}
        warm_all(shards)
        step = 256 / (0.6 * statistics.median(rate for _, rate, _ in loader_epochs(stoker.ShardDataset(shards), 2)))
        runs: dict[str, list] = {"opened": [], "remote": [], "local": [], "remote_paced": [], "local_paced": [],
                                 "get_file": [], "parts": []}
        for _ in range(repeat):
            for parts in (False, True, False):  # A B A: the baseline around ours
                runs["parts" if parts else "get_file"].append(download_mb_s(shards, options, cache, parts))
            warm_all(shards)
            runs["local"].append(loader_epochs(stoker.ShardDataset(shards), 2))
            runs["local_paced"].append(loader_epochs(stoker.ShardDataset(shards), 1, step)[0])
            for paced in (False, True):
                shutil.rmtree(work / "xdg", ignore_errors=True)
                start = time.perf_counter()
                dataset = stoker.ShardDataset("s3://data/ds", storage_options=options, cache_dir=fresh_cache(cache))
                if paced:
                    runs["remote_paced"].append(loader_epochs(dataset, 1, step)[0])
                else:
                    runs["opened"].append(time.perf_counter() - start)
                    runs["remote"].append(loader_epochs(dataset, 2))
    finally:
        link.close()
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    stream = f", each response at most {stream_rate * 8 / 1e6:.0f} Mbit/s" if stream_rate else ""
    print(f"object store: moto on localhost behind a proxy adding {delay * 1e3:.0f} ms per request{stream}; "
          f"medians of {repeat} rounds; img/s of the whole epoch, and after its first batch")
    print(f"whole-shard downloads: node cache (ranged parts, {DEFAULT_PARALLEL} at once) {med(runs['parts']):.0f} MB/s   "
          f"one s3fs get_file per shard {med(runs['get_file']):.0f} MB/s   "
          f"ratio {med(runs['parts']) / med(runs['get_file']):.2f}")
    print(f"open the data set (manifest + indexes): {med(runs['opened']):.2f} s; "
          f"then first batch: {med(r[0][0] for r in runs['remote']):.2f} s "
          f"(local: {med(r[0][0] for r in runs['local']):.2f} s)")

    def line(name: str, remote: list, local: list) -> None:
        whole, after = med(r[1] for r in remote), med(r[2] for r in remote)
        local_whole, local_after = med(r[1] for r in local), med(r[2] for r in local)
        print(f"{name}: s3 + cache {whole:,.0f} / {after:,.0f} img/s   local disk (page cache warm) "
              f"{local_whole:,.0f} / {local_after:,.0f}   ratio {whole / local_whole:.2f} / {after / local_after:.2f}")

    for epoch in range(2):
        line(f"Loader epoch {epoch + 1}", [r[epoch] for r in runs["remote"]], [r[epoch] for r in runs["local"]])
    line(f"epoch 1, loop paced by a {step * 1e3:.0f} ms step (60% of the local rate)", runs["remote_paced"],
         runs["local_paced"])


def staged(shards: Path, repeat: int, threads: int | None) -> None:
    """The Loader over a node cache holding every shard against the same Loader over local disk
    (``threads`` each; None: the Loader's choice, printed, which a busy machine may make differently)."""
    cache = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir="/dev/shm"))
    try:
        through_cache = stoker.ShardDataset(shards, cache_dir=cache)
        node = through_cache.shards.cache
        assert node is not None
        if not node.holds_everything:
            raise SystemExit(f"the node cache in {cache} cannot hold every shard")
        for shard in range(len(through_cache.shards.manifest.shards)):
            node.fetch(shard)
        warm_all(shards)
        loaders = {"local": stoker.Loader(stoker.ShardDataset(shards), 256, seed=0, threads=threads),
                   "cached": stoker.Loader(through_cache, 256, seed=0, threads=threads)}
        for loader in loaders.values():  # without --threads, the first pass decides threads or processes
            timed_epoch(loader)
        runs: dict[str, list[tuple[float, float, float]]] = {"local": [], "cached": []}
        for _ in range(repeat):
            for name in ("local", "cached", "local"):  # A B A: the baseline around ours
                runs[name].append(timed_epoch(loaders[name]))
        workers = {name: next(line.strip() for line in loader.explain().splitlines() if "workers:" in line)
                   for name, loader in loaders.items()}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    med = statistics.median
    print("   ".join(f"{name}: {line}" for name, line in workers.items()))
    print(f"stoker.Loader, batches of 256, medians of {repeat} rounds (local twice a round); img/s of the whole "
          "pass, and after its first batch")
    whole = {name: med(r[1] for r in runs[name]) for name in runs}
    after = {name: med(r[2] for r in runs[name]) for name in runs}
    print(f"node cache in /dev/shm, every shard staged: {whole['cached']:,.0f} / {after['cached']:,.0f} img/s   "
          f"local disk (page cache warm): {whole['local']:,.0f} / {after['local']:,.0f}   "
          f"ratio {whole['cached'] / whole['local']:.3f} / {after['cached'] / after['local']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["hdd", "s3", "downloads", "staged"])
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"))
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--stream-mbit", type=float, default=None,
                        help="s3, downloads: hold each response to this rate (a store's per-connection cap; default: none)")
    parser.add_argument("--threads", type=int, default=None, help="staged: the Loader's threads (default: its choice)")
    parser.add_argument("--quick", action="store_true", help="1,000 photos (under DATA/quick), 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.data, args.count, args.repeat = args.data / "quick", 1000, 3
    header(f"node cache, part {args.part}")
    shards = packed_photos(args.data, args.count, SHARD_BYTES)
    if args.part == "hdd":
        hdd(shards, args.repeat)
    elif args.part == "staged":
        staged(shards, args.repeat, args.threads)
    else:
        stream_rate = args.stream_mbit * 1e6 / 8 if args.stream_mbit else None
        (s3 if args.part == "s3" else downloads)(shards, args.repeat, args.delay_ms / 1e3, stream_rate)


if __name__ == "__main__":
    main()
