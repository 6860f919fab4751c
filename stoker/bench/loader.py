"""``stoker bench loader``: stoker.Loader against torch DataLoader and peer loaders, one run.

Every reader is a script in ``stoker/bench/readers/`` run in a fresh process (with its own Python
for peers installed elsewhere), twice per repeat-round: nothing is shared between readers but the
page cache. Each makes the same output: 224x224 uint8 RandomResizedCrop + flip, batches of 256.
Per reader the table shows medians over the repeats of: img/s of the first epoch in a fresh
process, img/s of the second (warm) epoch, CPU seconds per 1,000 images (whole process tree, both
epochs, start-up included), peak PSS of the process tree, and time to the first batch.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from stoker.bench.measure import CommandFailed, busy_cores, measure
from stoker.ranges import BENCH_BATCH, BENCH_COUNT, BENCH_REPEAT
from stoker.storage import evict

READERS = Path(__file__).parent / "readers"
PEERS = ("ffcv", "dali", "webdataset", "streaming", "litdata", "spdl")
_RESTART = "stoker.Loader, --restart-rows pack"
_RESTART_160 = "stoker.Loader, 160 px, --restart-rows pack"
# Another process using more than this many cores makes the figures meaningless.
MAX_BUSY_CORES = 0.25


@dataclass(frozen=True)
class Reader:
    """One row: ``script`` (in readers/) run by ``python`` with ``args``; ``key`` is what ``--only`` matches."""

    key: str
    name: str
    script: str
    python: str = sys.executable
    args: tuple[str, ...] = ()
    workers: int = os.cpu_count() or 1
    size: int = 224
    shards: Path | None = None  # another pack of the same photos than the default one


@dataclass
class Row:
    """A reader's runs and their medians; ``error`` when it could not run."""

    reader: Reader
    first_epoch: list[float] = field(default_factory=list)  # img/s
    warm_epoch: list[float] = field(default_factory=list)  # img/s
    cpu_per_1000: list[float] = field(default_factory=list)  # CPU seconds
    peak_pss_mb: list[float] = field(default_factory=list)
    first_batch: list[float] = field(default_factory=list)  # seconds
    error: str | None = None

    def median(self, name: str) -> float:
        values = getattr(self, name)
        return statistics.median(values) if values else float("nan")


def default_readers(peers: dict[str, str], cores: int) -> list[Reader]:
    """stoker.Loader (224 and 160 px, and without its region-decode extension), the decode-only limit,
    DataLoader over loose files (0..cores workers) and over ShardDataset (1..cores), and each peer in
    ``peers`` (name -> its Python)."""
    readers = [Reader("stoker", "stoker.Loader", "stoker_loader.py"),
               Reader("stoker160", "stoker.Loader, 160 px", "stoker_loader.py", size=160),
               Reader("stoker-noext", "stoker.Loader, no region decode (simplejpeg)", "stoker_loader_noext.py"),
               Reader("limit", f"limit: {cores} threads of simplejpeg decode only", "limit.py")]
    readers += [Reader(f"loose{w}", f"DataLoader, loose files + Pillow, {w} workers", "dataloader.py",
                       args=("--source", "loose"), workers=w) for w in range(cores + 1)]
    readers += [Reader(f"shards{w}", f"DataLoader, ShardDataset + Pillow, {w} workers", "dataloader.py",
                       args=("--source", "shards"), workers=w) for w in range(1, cores + 1)]
    readers += [Reader(name, f"peer: {name}", f"peer_{name}.py", python=python) for name, python in peers.items()]
    return readers


def standard_readers(cores: int) -> list[Reader]:
    """``--transform standard``: the training and the validation pipeline (torchvision's, as a
    training script holds them), each through a DataLoader with ``cores`` workers, through
    stoker.Loader(transform=...) and written by hand as CropSpec + stoker.augment."""
    readers = []
    for pipeline in ("train", "val"):
        for via, name in (("dataloader", f"DataLoader + torchvision, {cores} workers"),
                          ("transform", "stoker.Loader(transform=the Compose)"),
                          ("hand", "stoker.Loader + stoker.augment by hand")):
            readers.append(Reader(f"{pipeline}-{via}", f"{pipeline}: {name}", "standard.py",
                                  args=("--via", via, "--pipeline", pipeline), workers=cores))
    return readers


def report_standard(rows: list[Row]) -> str:
    """The ``--transform standard`` ratios the targets are stated in (issue 19)."""
    warm = {row.reader.key: row.median("warm_epoch") for row in rows if not row.error}
    targets = (("train-transform", "train-dataloader", "train: Loader(transform=) / DataLoader", "target >= 3x"),
               ("train-transform", "train-hand", "train: Loader(transform=) / by hand", "target >= 0.9x"),
               ("val-transform", "val-dataloader", "val: Loader(transform=) / DataLoader", "target >= 2x"))
    return "\n".join(f"{label}: {warm[a] / warm[b]:.2f}x ({target})" for a, b, label, target in targets
                     if a in warm and b in warm)


def timm_readers(cores: int) -> list[Reader]:
    """``--transform timm``: timm's training transform (create_transform, is_training=True) through
    timm's own dataset and DataLoader with ``cores`` workers, and through stoker.Loader(transform=...)."""
    return [Reader(f"timm-{via}", f"timm train: {name}", "timm_train.py",
                   args=("--via", via, "--pipeline", "train"), workers=cores)
            for via, name in (("timm", f"timm's dataset + DataLoader, {cores} workers"),
                              ("transform", "stoker.Loader(transform=the same)"))]


def report_timm(rows: list[Row]) -> str:
    """The ``--transform timm`` ratio the target is stated in (issue 39)."""
    warm = {row.reader.key: row.median("warm_epoch") for row in rows if not row.error}
    if "timm-transform" not in warm or "timm-timm" not in warm:
        return ""
    return f"timm train: Loader(transform=) / timm's DataLoader: {warm['timm-transform'] / warm['timm-timm']:.2f}x " \
           "(target >= 4x on 2 cores)"


def restart_readers(shards: Path) -> list[Reader]:
    """stoker.Loader at 224 and 160 px on ``shards``, the photos packed with ``--restart-rows``."""
    return [Reader("rst", _RESTART, "stoker_loader.py", shards=shards),
            Reader("rst160", _RESTART_160, "stoker_loader.py", size=160, shards=shards)]


def run_readers(readers: list[Reader], photos: Path, shards: Path, work: Path, *, batch: int = 256, repeat: int = 3,
                cold: bool = False, log=print) -> list[Row]:
    """Prepare every reader once, then run each ``repeat`` times, interleaved (A, B, ..., A, B, ...),
    so that drift in the machine hits every reader alike."""
    rows = [Row(r) for r in readers]
    for row in rows:
        try:
            measure(_command(row.reader, "prepare", photos, shards, work, batch))
        except (CommandFailed, OSError) as e:
            row.error = f"prepare failed: {e}"
            log(f"{row.reader.name}: {row.error}")
    for round_ in range(repeat):
        for row in rows:
            if row.error:
                continue
            if cold:
                evict(_files([photos, row.reader.shards or shards, _work(work, row.reader)]))
            try:
                result = measure(_command(row.reader, "run", photos, shards, work, batch))
            except (CommandFailed, OSError) as e:
                row.error = f"run failed: {e}"
                log(f"{row.reader.name}: {row.error}")
                continue
            first, warm = result.reports[0], result.reports[-1]
            images = sum(r["images"] for r in result.reports)
            row.first_epoch.append(first["images"] / first["seconds"])
            row.warm_epoch.append(warm["images"] / warm["seconds"])
            row.cpu_per_1000.append(result.cpu_seconds / images * 1000)
            row.peak_pss_mb.append(result.peak_pss_bytes / 1e6)
            row.first_batch.append(first["first_batch_s"])
            log(f"round {round_ + 1}/{repeat} {row.reader.name}: first epoch {row.first_epoch[-1]:.0f} img/s, "
                f"warm {row.warm_epoch[-1]:.0f} img/s")
    return rows


def refuse_if_busy(force: bool) -> None:
    """Stop unless the machine is idle: other processes' load makes every figure noise."""
    busy = busy_cores()
    if busy > MAX_BUSY_CORES and not force:
        raise SystemExit(f"stoker bench: other processes keep {busy:.2f} cores busy (more than {MAX_BUSY_CORES}); "
                         "refusing to report noise. Stop them, or pass --force to run anyway.")


def floor_pss_mb() -> float:
    """Peak PSS of a process that only imports torch and stoker: what every reader pays before reading."""
    code = "import time, torch, stoker; time.sleep(0.5)"
    return measure([sys.executable, "-c", code]).peak_pss_bytes / 1e6


def report(rows: list[Row], cores: int, floor_mb: float | None = None) -> str:
    """The table and the ratios the targets are stated in; ``floor_mb``: see :func:`floor_pss_mb`."""
    lines = [f"{'reader':52} {'1st epoch':>9} {'warm':>7} {'CPU s/1k':>8} {'PSS MB':>7} {'1st batch':>9}",
             f"{'':52} {'img/s':>9} {'img/s':>7} {'img':>8} {'peak':>7} {'s':>9}"]
    for row in rows:
        if row.error:
            lines.append(f"{row.reader.name:52} not measured: {row.error.splitlines()[-1][:200]}")
            continue
        lines.append(f"{row.reader.name:52} {row.median('first_epoch'):9.0f} {row.median('warm_epoch'):7.0f} "
                     f"{row.median('cpu_per_1000'):8.2f} {row.median('peak_pss_mb'):7.0f} {row.median('first_batch'):9.2f}")
    measured = {row.reader.name: row for row in rows if not row.error}
    stoker, small = measured.get("stoker.Loader"), measured.get("stoker.Loader, 160 px")
    limit = next((r for n, r in measured.items() if n.startswith("limit")), None)
    lines += _restart_ratios(measured, stoker, limit)
    loose = [r for n, r in measured.items() if n.startswith("DataLoader, loose")]
    if stoker is None:
        return "\n".join(lines)
    ours = stoker.median("warm_epoch")
    if loose:
        best = max(loose, key=lambda r: r.median("warm_epoch"))
        ours_mb, theirs_mb = stoker.median("peak_pss_mb"), best.median("peak_pss_mb")
        lines.append(f"stoker.Loader / best DataLoader over loose files ({best.reader.workers} workers): "
                     f"{ours / best.median('warm_epoch'):.2f}x (target >= 1.8x); peak PSS {ours_mb / theirs_mb:.0%} "
                     "of it (target <= 50%)")
        if floor_mb is not None:
            lines.append(f"peak PSS above a bare 'import torch, stoker' process ({floor_mb:.0f} MB): stoker.Loader "
                         f"{ours_mb - floor_mb:.0f} MB, that DataLoader {theirs_mb - floor_mb:.0f} MB "
                         f"({(ours_mb - floor_mb) / (theirs_mb - floor_mb):.0%})")
    for name, row in measured.items():
        if name.startswith("peer: "):
            peer = max(row.median("warm_epoch"), row.median("first_epoch"))
            lines.append(f"stoker.Loader / {name.removeprefix('peer: ')}: {ours / peer:.2f}x (target >= 1.5x)")
    if limit is not None:
        lines.append(f"stoker.Loader / limit: {ours / limit.median('warm_epoch'):.0%} (target >= 85%)")
        if small is not None:
            lines.append(f"stoker.Loader 160 px / limit: {small.median('warm_epoch') / limit.median('warm_epoch'):.2f}x "
                         "(target >= 1.3x)")
    disk = measured.get("disk: shards read sequentially (cat)")
    if disk is not None:
        bound = min(ours, disk.median("first_epoch"))
        lines.append(f"stoker.Loader cold first epoch: {stoker.median('first_epoch') / bound:.0%} of the lesser of its "
                     f"warm rate and the disk's sequential rate ({bound:.0f} img/s; target >= 85%)")
    fallback = measured.get("stoker.Loader, no region decode (simplejpeg)")
    if fallback is not None:
        lines.append(f"stoker.Loader without / with its region-decode extension: "
                     f"{fallback.median('warm_epoch') / ours:.0%}")
    lines.append(f"stoker.Loader time to first batch, fresh process: {stoker.median('first_batch'):.2f} s (target < 0.5 s)")
    return "\n".join(lines)


def _restart_ratios(measured: dict[str, Row], stoker: Row | None, limit: Row | None) -> list[str]:
    """What the --restart-rows targets compare: the Loader on that pack against the limit row and
    against itself on the byte-exact pack, warm epochs."""
    lines = []
    for name, exact, target_limit, target_exact in ((_RESTART, stoker, 1.25, 1.15), (_RESTART_160, None, 1.4, None)):
        row = measured.get(name)
        if row is None:
            continue
        rate = row.median("warm_epoch")
        if limit is not None:
            lines.append(f"{name} / limit: {rate / limit.median('warm_epoch'):.2f}x (target >= {target_limit}x)")
        if exact is not None:
            lines.append(f"{name} / the same on the byte-exact pack: {rate / exact.median('warm_epoch'):.2f}x "
                         f"(target >= {target_exact}x)")
    return lines


def _command(reader: Reader, action: str, photos: Path, shards: Path, work: Path, batch: int) -> list[str]:
    return [reader.python, str(READERS / reader.script), action, *reader.args, "--photos", str(photos),
            "--shards", str(reader.shards or shards), "--work", str(_work(work, reader)), "--batch", str(batch),
            "--size", str(reader.size), "--workers", str(reader.workers)]


def _work(work: Path, reader: Reader) -> Path:
    return work / Path(reader.script).stem


def _files(roots: Iterable[Path]) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def prepare_data(data: Path, count: int, images: Path | None = None, progress: bool = True) -> tuple[Path, Path]:
    """(photos, shards): ``images`` (a user's ImageFolder of JPEGs) or ``count`` generated sample
    photos under ``data``, and their packed shards; made once and reused."""
    from stoker.pack import pack
    from stoker.sample_data import make_sample_photos

    photos = images if images is not None else make_sample_photos(data / "photos", count=count, num_classes=100,
                                                                  progress=progress)
    shards = data / "shards"
    pack(photos, shards, progress=progress)
    return Path(photos), shards


def bench_loader(data: Path, *, count: int = 4000, images: Path | None = None, peers: dict[str, str] | None = None,
                 only: str = "", repeat: int = 3, batch: int = 256, cold: bool = False, force: bool = False,
                 restart_rows: bool = False, transform: str | None = None) -> str:
    """The whole ``stoker bench loader`` run: check the machine is idle, prepare, measure, report.
    ``restart_rows`` adds stoker.Loader on the photos packed with ``--restart-rows`` (224 and 160
    px, whatever ``only`` says) and the pack's rate and size with and without it. ``transform="standard"``:
    the standard torchvision pipelines instead of the default readers (:func:`standard_readers`);
    ``transform="timm"``: timm's training transform (:func:`timm_readers`)."""
    from stoker.bench.pack_rate import measure_packs, pack_report
    from stoker.pack import pack

    for option, value in ((BENCH_COUNT, count), (BENCH_REPEAT, repeat), (BENCH_BATCH, batch)):
        option.check(value)
    refuse_if_busy(force)
    photos, shards = prepare_data(data, count, images)
    cores = os.cpu_count() or 1
    every = (standard_readers(cores) if transform == "standard" else timm_readers(cores) if transform == "timm"
             else default_readers(peers or {}, cores))
    readers = [r for r in every if not only or r.key in only.split(",")]
    if restart_rows:
        pack(photos, data / "shards-restart", restart_rows=True)
        readers += restart_readers(data / "shards-restart")
    if cold:
        readers.append(Reader("disk", "disk: shards read sequentially (cat)", "disk.py"))
    rows = run_readers(readers, photos, shards, data / "readers", batch=batch, repeat=repeat, cold=cold,
                       log=lambda line: print(line, file=sys.stderr, flush=True))
    packs = measure_packs(photos, data / "pack-rate", workers=cores, repeat=repeat, cold=cold) if restart_rows else []
    load = os.getloadavg()
    head = (f"stoker bench loader: {len(readers)} readers, {cores} cores, batch {batch}, medians of {repeat}, "
            f"{'cold' if cold else 'warm'} page cache; load average after {load[0]:.2f}")
    if transform in ("standard", "timm"):
        ratios = report_standard(rows) if transform == "standard" else report_timm(rows)
        return head + "\n" + report(rows, cores) + "\n" + ratios
    text = head + "\n" + report(rows, cores, floor_pss_mb())
    return text + ("\n" + pack_report(packs, cores) if packs else "")
