"""Mutation fuzzing of the index reader: real index files damaged, read by every reader.

    python tests/fuzz_index.py [--seconds 60 | --cases N] [--seed 0] [--require-build DIR] [--case N]

``make sanitize`` runs it beside tests/stress_extensions.py, against the copy of the package whose
C extensions are built with AddressSanitizer and UndefinedBehaviorSanitizer (the Loader's native
path, decode_chunk, reads members at the offsets an index gives). Not a pytest file: it runs for
minutes, and a hang or a sanitizer report ends the process. The fast, deterministic checks of the
same code are tests/test_format.py, test_hostile_index.py and test_verify_members.py; the suite
runs a few cases of this script too (test_hostile_index.py's smoke run).

It packs a few sample photos into small shards, then, case after case, damages one index file
(bits flipped, the file cut short or grown, a run of bytes overwritten, a header, sample or
member field set to an extreme or a neighbour's value, two rows swapped, key bytes set to NUL or
to bytes that are not UTF-8, bytes spliced into the shard between two samples with the index
moved to match, several of these at once) and reads the data set with it: with ``verify=False``,
and with the manifest's checksums recomputed over the damaged files, so that the damage reaches
the row checks instead of stopping at the index's checksum. Each case goes through ShardIndex
(every key, member range, field lookup, span), ShardDataset (every sample of the shard and its
key), one epoch of stoker.Loader in its native path, and ``stoker verify``. Every outcome must be
a clean read or a CorruptDataError or FormatError; where verify finds nothing wrong, every reader
must read every sample and Python's tarfile must list the shard's members as the index does. No
other exception, no case running past ``--case-seconds`` (faulthandler then ends the process,
printing every thread's stack), no allocation past ``--max-alloc-mb`` (tracemalloc's peak,
numpy's arrays included) nor growth of the process's peak memory. Each failure prints its case
number (``--case N`` runs it again) and the mutations, and keeps the damaged index and shard
under ``--keep``. Exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import faulthandler
import pathlib
import resource
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from damage import insert_gap  # beside this script
from stress_extensions import check_build

import stoker
from stoker.errors import CorruptDataError, FormatError
from stoker.format import ShardIndex, file_checksum, read_manifest, write_manifest
from stoker.format.index import HEADER_DTYPE, MEMBER_DTYPE, SAMPLE_DTYPE
from stoker.format.verify import verify_dataset
from stoker.sample_data import make_sample_photos

EXPECTED = (CorruptDataError, FormatError)
CROP = stoker.CropSpec("center", size=(16, 16))
SHARD = 1  # the shard whose index each case damages


class Failure(Exception):
    """A reader broke the rule: an outcome that is not a clean read or an expected error."""


def extremes(dtype: np.dtype, value: int, rng: np.random.Generator) -> int:
    """A value to put in a field of ``dtype`` that now holds ``value``: a limit, a power of two, a
    near miss or a random number."""
    info = np.iinfo(dtype)
    picks = [0, 1, info.max, info.max - 1, info.min, 2**31, 2**32 - 1, 2**62, 2**63 - 1, 2**63, value + 1, value - 1,
             value + 512, value - 512, value * 2, int(rng.integers(0, 2**63))]
    return max(int(info.min), min(int(info.max), picks[int(rng.integers(len(picks)))]))


def sections(data: bytearray) -> dict[str, np.ndarray]:
    """Writable views of an index's header, samples (with the closing row), members and key table,
    where its header still describes them."""
    buffer = np.frombuffer(data, np.uint8)
    header = buffer[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)
    n, m = int(header[0]["num_samples"]), int(header[0]["num_members"])
    rows_end = HEADER_DTYPE.itemsize + (n + 1) * SAMPLE_DTYPE.itemsize
    members_at = rows_end + (-rows_end % 8)
    return {"header": header, "rows": buffer[HEADER_DTYPE.itemsize : rows_end].view(SAMPLE_DTYPE),
            "members": buffer[members_at : members_at + m * MEMBER_DTYPE.itemsize].view(MEMBER_DTYPE),
            "keys": buffer[len(data) - int(header[0]["keys_nbytes"]) :]}


def mutate(data: bytes, shard: bytes, rng: np.random.Generator) -> tuple[bytes, bytes, list[str]]:
    """The index ``data`` and its ``shard`` damaged by one to three mutations, and what they were."""
    done: list[str] = []
    out = bytearray(data)
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        kind = int(rng.integers(9))
        if kind == 0 and out:  # bit flips
            flips = rng.integers(0, len(out) * 8, int(rng.integers(1, 9)))
            for bit in flips.tolist():
                out[bit // 8] ^= 1 << (bit % 8)
            done.append(f"flip bits {flips.tolist()}")
        elif kind == 1:  # cut short, or a slice taken out
            at = int(rng.integers(len(out) + 1))
            if rng.random() < 0.5:
                del out[at:]
                done.append(f"cut at {at}")
            else:
                end = int(rng.integers(at, len(out) + 1))
                del out[at:end]
                done.append(f"remove bytes {at}:{end}")
        elif kind == 2:  # grown
            extra = rng.integers(0, 256, int(rng.integers(1, 4097)), dtype=np.uint8).tobytes()
            out += extra
            done.append(f"append {len(extra)} bytes")
        elif kind == 3 and out:  # a run overwritten
            at = int(rng.integers(len(out)))
            run = min(int(rng.integers(1, 65)), len(out) - at)
            fill = [b"\0" * run, b"\xff" * run, rng.integers(0, 256, run, dtype=np.uint8).tobytes()][int(rng.integers(3))]
            out[at : at + run] = fill
            done.append(f"overwrite {run} bytes at {at} with {fill[:4].hex()}...")
        elif kind in (4, 5, 6, 7) and len(out) >= HEADER_DTYPE.itemsize:
            edited, what = edit_table(bytes(out), kind, rng)
            out = bytearray(edited)  # a new buffer: the edit's numpy views hold the old one
            done.append(what)
        elif kind == 8:
            shard, what = splice_gap(shard, out, rng)
            done.append(what)
    return bytes(out), shard, done


def splice_gap(shard: bytes, index: bytearray, rng: np.random.Generator) -> tuple[bytes, str]:
    """Bytes (zeros or random, a few to a few blocks) spliced into ``shard`` where a sample starts,
    ``index`` moved to match, as a tool that edits the tar and fixes the index would leave them:
    every offset still right, but tar readers read the gap. stoker's writer never leaves one."""
    try:
        rows = sections(index)["rows"]
        sample = int(rng.integers(1, len(rows)))
    except ValueError:  # the header no longer describes the file (or no sample to put it before)
        return shard, "nothing (no sample to splice bytes before)"
    size = [1, 511, 512, 1024, int(rng.integers(1, 4097))][int(rng.integers(5))]
    gap = bytes(size) if rng.random() < 0.5 else rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    try:
        return insert_gap(shard, index, sample, gap), f"splice {size} bytes ({gap[:4].hex()}...) before sample {sample}"
    except (ValueError, IndexError, OverflowError):  # the rows already damaged past moving
        return shard, "nothing (the rows cannot be moved)"


def edit_table(data: bytes, kind: int, rng: np.random.Generator) -> tuple[bytes, str]:
    """One edit of the index's tables: a key table byte (``kind`` 7), two rows swapped (6), a
    field set to a neighbour's value (5) or to an extreme (4)."""
    out = bytearray(data)
    try:
        views = sections(out)
    except ValueError:  # the header no longer describes the file: flip a bit instead
        out[int(rng.integers(len(out)))] ^= 1
        return bytes(out), "flip one bit (the tables are not where the header says)"
    if kind == 7 and len(views["keys"]):  # NUL, bytes that are not UTF-8, a slash
        at = int(rng.integers(len(views["keys"])))
        value = [0, 0xFF, 0xC3, 0x80, ord("/")][int(rng.integers(5))]
        views["keys"][at] = value
        return bytes(out), f"key table byte {at} = {value:#x}"
    section = ["header", "rows", "members"][int(rng.integers(3))]
    table = views[section]
    if not len(table):
        return bytes(out), f"nothing ({section} is empty)"
    row = int(rng.integers(len(table)))
    if kind == 6 and len(table) > 1:
        other = int(rng.integers(len(table)))
        table[[row, other]] = table[[other, row]]
        return bytes(out), f"swap {section} rows {row} and {other}"
    names = [f for f in table.dtype.names if table.dtype[f].kind in "iu"]
    name = names[int(rng.integers(len(names)))]
    if kind == 5 and len(table) > 1:
        value = int(table[name][row + 1 if row == 0 else row - 1])
    else:
        value = extremes(table.dtype[name], int(table[name][row]), rng)
    table[name][row] = value
    return bytes(out), f"{section}[{row}].{name} = {value}"


def check_outcome(outcomes: Counter, what: str, call: Callable[..., object], *args: object) -> bool:
    """Run one read, ``call(*args)``; True if it was clean. An expected error is counted, anything else fails."""
    try:
        call(*args)
    except EXPECTED as e:
        outcomes[f"{what}: {type(e).__name__}"] += 1
        return False
    except Exception as e:
        raise Failure(f"{what}: {type(e).__name__}: {e}\n{traceback.format_exc()}") from None
    outcomes[f"{what}: clean"] += 1
    return True


def read_index(path: pathlib.Path) -> None:
    """Everything a reader asks of an index."""
    index = ShardIndex.open(path)
    for i in range(len(index)):
        index.key(i)
        for member in index.sample_members(i):
            index.fields[int(member["field"])]
        index.span(i, i)
    if len(index):
        index.find(index.key(0))
        index.span(0, len(index) - 1)
    index.first_members(("jpg",))
    index.labels.sum()


def read_samples(root: pathlib.Path, verify: bool, outcomes: Counter) -> bool:
    """Every sample of the damaged shard, and its key; True if all read cleanly."""
    clean = True
    dataset = stoker.ShardDataset(root, verify=verify, decode="raw")
    first, end = int(dataset.shards.starts[SHARD]), int(dataset.shards.starts[SHARD + 1])
    for i in range(first, end):
        clean &= check_outcome(outcomes, "ShardDataset[i]", dataset.__getitem__, i)
        clean &= check_outcome(outcomes, "ShardDataset.key", dataset.key, i)
    return clean


def one_epoch(root: pathlib.Path, verify: bool) -> None:
    for _ in stoker.Loader(stoker.ShardDataset(root, verify=verify), 8, crop=CROP, threads=2, order="sequential"):
        pass


def tar_reads_as_indexed(shard: pathlib.Path, index: pathlib.Path) -> bool:
    """Whether Python's tarfile lists the shard's members as the index does (names and sizes, in order)."""
    index_ = ShardIndex.open(index)
    keys = [index_.key(i) for i in range(len(index_)) for _ in range(len(index_.sample_members(i)))]
    listed = [(f"{key}.{index_.fields[int(member['field'])]}", int(member["size"]))
              for key, member in zip(keys, index_.members)]
    try:
        with tarfile.open(shard) as tar:
            return [(member.name, member.size) for member in tar.getmembers()] == listed
    except tarfile.TarError:
        return False


def damage(number: int, seed: int, pristine: pathlib.Path) -> tuple[bytes, bytes, list[str]]:
    """Case ``number``'s damaged index and shard, and its mutations."""
    entry = read_manifest(pristine).shards[SHARD]
    return mutate((pristine / entry.index).read_bytes(), (pristine / entry.name).read_bytes(),
                  np.random.default_rng((seed, number)))


def run_case(number: int, seed: int, pristine: pathlib.Path, root: pathlib.Path, outcomes: Counter) -> None:
    """Damage the index (and the shard), read the data set every way, restore it."""
    entry = read_manifest(pristine).shards[SHARD]
    index, shard = root / entry.index, root / entry.name
    damaged, damaged_shard, _ = damage(number, seed, pristine)
    index.write_bytes(damaged)
    shard.write_bytes(damaged_shard)
    try:
        for verify in (False, True):
            if verify:  # the checksums recomputed over the damaged files: the rows and the shard must tell
                manifest = read_manifest(pristine)
                manifest.shards[SHARD] = replace(entry, bytes=len(damaged_shard), checksum=file_checksum(shard),
                                                 index_checksum=file_checksum(index), index_bytes=len(damaged))
                write_manifest(root, manifest)
            check_outcome(outcomes, "ShardIndex", read_index, index)
            clean = read_samples(root, verify, outcomes)
            clean &= check_outcome(outcomes, "Loader", one_epoch, root, verify)
            if verify:
                problems = verify_dataset(root)
                outcomes["verify: " + ("damage found" if problems else "OK")] += 1
                if not problems and not clean:
                    raise Failure("stoker verify found nothing wrong, but a reader failed")
                if not problems and not tar_reads_as_indexed(shard, index):
                    raise Failure("stoker verify found nothing wrong, but tarfile lists other members than the index")
    finally:
        shutil.copy(pristine / entry.index, index)
        shutil.copy(pristine / entry.name, shard)
        shutil.copy(pristine / "stoker.json", root / "stoker.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--cases", type=int, help="run cases 0 to N - 1, however long they take, instead of --seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", type=int, help="run only this case")
    parser.add_argument("--case-seconds", type=float, default=120.0, help="a case running longer is a hang")
    parser.add_argument("--max-alloc-mb", type=float, default=256.0)
    parser.add_argument("--keep", default="fuzz-index-failures", help="folder for the damaged indexes that failed")
    parser.add_argument("--require-build", metavar="DIR", help="fail unless the extensions are ASan builds under DIR")
    args = parser.parse_args()
    if args.require_build:
        check_build(args.require_build)
    outcomes: Counter = Counter()
    failures = 0
    with tempfile.TemporaryDirectory() as workdir:
        work = pathlib.Path(workdir)
        photos = make_sample_photos(work / "photos", count=24, num_classes=4, seed=args.seed)
        pristine = stoker.pack(photos, work / "pristine", shard_bytes=64 << 10, max_side=160, workers=1, progress=False).dst
        root = work / "damaged"
        shutil.copytree(pristine, root)
        tracemalloc.start()
        rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        numbers = [args.case] if args.case is not None else range(args.cases or sys.maxsize)
        deadline = time.monotonic() + args.seconds
        start, cases = time.monotonic(), 0
        for number in numbers:
            if args.case is None and args.cases is None and time.monotonic() > deadline:
                break
            faulthandler.dump_traceback_later(args.case_seconds, exit=True)
            tracemalloc.reset_peak()
            try:
                run_case(number, args.seed, pristine, root, outcomes)
                peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
                if peak_mb > args.max_alloc_mb:
                    raise Failure(f"allocated {peak_mb:.0f} MB at its peak")
                grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_start) / 1024
                if grown_mb > 4 * args.max_alloc_mb:
                    raise Failure(f"the process's peak memory grew by {grown_mb:.0f} MB")
            except Failure as e:
                failures += 1
                keep = pathlib.Path(args.keep)
                keep.mkdir(exist_ok=True)
                damaged, damaged_shard, mutations = damage(number, args.seed, pristine)
                (keep / f"case-{number}.idx").write_bytes(damaged)
                (keep / f"case-{number}.tar").write_bytes(damaged_shard)
                print(f"FAIL case {number} ({'; '.join(mutations)}): {e}", flush=True)
                if failures >= 20:
                    break
            finally:
                faulthandler.cancel_dump_traceback_later()
            cases += 1
    print(f"{cases} cases in {time.monotonic() - start:.0f} s, {failures} failures; outcomes:", flush=True)
    for what, count in sorted(outcomes.items()):
        print(f"  {what}: {count}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
