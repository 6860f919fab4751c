"""Packing survives a SIGKILL and a full disk: completed shards are kept, a rerun finishes the job."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stoker
from stoker.errors import PackError
from stoker.format import read_manifest
from stoker.format.verify import verify_dataset


def files_state(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.glob("shard-*")}


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


# Holds a write lease on a file (fcntl F_SETLEASE): the kernel then makes any other process's open()
# of it wait until the lease is let go (or lease-break-time, 45 s by default, has passed), and
# tells the holder (SIGIO), which says so: "blocked".
_HOLD_LEASE = """
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, lambda *_: print("blocked", flush=True))
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("held", flush=True)
sys.stdin.read()
"""


class BlockedPack:
    """`stoker pack` in a subprocess over a copy of the photos where photo ``position`` cannot be
    opened yet (another process holds a file lease on it): the packer blocks opening it,
    deterministically mid-way, with earlier shards finished and a later one half written.
    :meth:`unblock` lets go of the lease; the photo is a real one all along, so the listing and
    the plan do not change. (A FIFO did this before; stoker now refuses FIFOs without opening them.)"""

    def __init__(self, photos: Path, tmp_path: Path, position: int, workers: int, *options: str,
                 dst: str | None = None, env: dict[str, str] | None = None) -> None:
        self.src, self.dst = tmp_path / "src", dst or tmp_path / "dst"
        shutil.copytree(photos, self.src)
        self.blocker = sorted(self.src.rglob("*.jpg"))[position]
        self.holder = subprocess.Popen([sys.executable, "-c", _HOLD_LEASE, str(self.blocker)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.holder.stdout.readline().strip() != "held":
            self.holder.wait()
            pytest.skip(f"no file leases here: {self.holder.stderr.read().strip().splitlines()[-1:]}")
        self.process = subprocess.Popen([sys.executable, "-m", "stoker.cli", "pack", str(self.src), str(self.dst),
                                         "--shard-size", "600000", "--workers", str(workers), "--quiet", *options],
                                        start_new_session=True, env=env)

    def kill(self, whole_group: bool = True) -> None:
        if whole_group:
            os.killpg(self.process.pid, signal.SIGKILL)
        else:
            self.process.kill()  # the main process only, as the OOM killer would
        self.process.wait(timeout=10)

    def wait_blocked(self, timeout: float = 120.0) -> None:
        """Wait until the pack waits to open the blocked photo (a generous deadline)."""
        ready, _, _ = select.select([self.holder.stdout], [], [], timeout)
        assert ready and self.holder.stdout.readline().strip() == "blocked", "the pack never reached the photo"

    def unblock(self) -> None:
        self.holder.stdin.close()
        self.holder.wait(timeout=10)


def test_sigkill_mid_pack_then_resume(photos, tmp_path):
    run = BlockedPack(photos, tmp_path, position=60, workers=1)
    src, dst = run.src, run.dst
    try:
        wait_for(lambda: len(list(dst.glob("shard-*.tar"))) >= 4 and list(dst.glob(".shard-*.tmp")))
        time.sleep(0.2)
    finally:
        run.kill()
    assert run.process.returncode == -signal.SIGKILL
    assert not (dst / "stoker.json").exists(), "no manifest may exist before every shard is complete"
    finished = files_state(dst)
    assert finished

    run.unblock()
    result = stoker.pack(src, dst, shard_bytes=600_000, workers=1, progress=False)
    assert result.reused_shards >= len(finished) // 2
    after = files_state(dst)
    assert all(after[name] == state for name, state in finished.items()), "finished shards must not be rewritten"
    assert not list(dst.glob(".shard-*")) and not (dst / ".stoker-pack").exists()
    assert verify_dataset(dst) == []

    fresh = stoker.pack(src, tmp_path / "fresh", shard_bytes=600_000, workers=2, progress=False)
    for entry_a, entry_b in zip(read_manifest(dst).shards, read_manifest(fresh.dst).shards):
        assert entry_a.checksum == entry_b.checksum and entry_a.index_checksum == entry_b.index_checksum


def test_full_disk_keeps_completed_shards_and_resumes(photos, small_disk):
    dst = small_disk / "ds"
    with pytest.raises(PackError, match=r"No space left on device") as info:
        stoker.pack(photos, dst, shard_bytes=600_000, workers=1, progress=False)
    assert str(dst) in str(info.value)
    assert not (dst / "stoker.json").exists()
    assert not list(dst.glob(".shard-*.tmp")), "the half-written shard is removed"
    finished = files_state(dst)
    assert finished
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    result = stoker.pack(photos, dst, shard_bytes=600_000, workers=1, progress=False)
    assert result.reused_shards >= 1 and result.num_samples == len(list(photos.rglob("*.jpg")))
    assert all(files_state(dst)[name] == state for name, state in finished.items())
    assert verify_dataset(dst) == []


def forked_children(pid: int) -> list[int]:
    """The processes ``pid`` forked and that still run its program (pack workers; not the
    helpers multiprocessing starts with exec)."""
    program = Path(f"/proc/{pid}/cmdline").read_bytes()
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and (stat.parent / "cmdline").read_bytes() == program:
                children.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # a process that ended meanwhile
    return children


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for whoever adopted it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def assert_workers_end_and_the_folder_packs(workers: list[int], src: Path, dst: Path) -> None:
    """Every worker of the killed pack exits by itself (a generous deadline: only a worker left
    waiting forever fails it), so the pack lock is free and the next pack into the folder works."""
    assert workers
    try:
        wait_for(lambda: not any(map(running, workers)), timeout=120)
    except TimeoutError:
        for pid in filter(running, workers):
            os.kill(pid, signal.SIGKILL)
        pytest.fail("a pack worker outlived the pack process (it would hold the pack lock forever)")
    result = stoker.pack(src, dst, shard_bytes=600_000, workers=2, progress=False)
    assert result.num_samples == len(list(src.rglob("*.jpg")))
    assert verify_dataset(dst) == []


def test_killing_only_the_main_process_stops_its_workers(photos, tmp_path):
    run = BlockedPack(photos, tmp_path, position=40, workers=2)
    try:
        wait_for(lambda: list(run.dst.glob(".shard-*.tmp")) and len(forked_children(run.process.pid)) == 2)
        workers = forked_children(run.process.pid)
    finally:
        run.kill(whole_group=False)
    # A worker is still blocked opening the photo and holds the pack lock; it must exit by itself.
    run.unblock()
    assert_workers_end_and_the_folder_packs(workers, run.src, run.dst)


# `stoker pack` whose workers wait, right after their fork, until the file argv[3] exists: the
# test kills the pack before or after their initializers run (os.register_at_fork's hook runs in
# the child inside fork(), before multiprocessing starts the worker).
_PACK_WORKERS_HELD = """
import os, sys, time
import stoker
def hold():
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
os.register_at_fork(after_in_child=hold)
stoker.pack(sys.argv[1], sys.argv[2], shard_bytes=600_000, workers=2, progress=False)
"""


@pytest.mark.parametrize("when", ["before the workers' initializers", "while a worker writes a shard"])
def test_pack_workers_end_with_their_pack_however_early_it_dies(photos, tmp_path, when):
    src, dst, gate = tmp_path / "src", tmp_path / "dst", tmp_path / "go"
    shutil.copytree(photos, src)
    if when == "while a worker writes a shard":
        gate.touch()
    pack = subprocess.Popen([sys.executable, "-c", _PACK_WORKERS_HELD, str(src), str(dst), str(gate)])
    try:
        wait_for(lambda: len(forked_children(pack.pid)) == 2 and (not gate.exists() or list(dst.glob(".shard-*.tmp"))),
                 timeout=120)
        workers = forked_children(pack.pid)
    finally:
        pack.kill()
        pack.wait()
    gate.touch()
    assert_workers_end_and_the_folder_packs(workers, src, dst)


def test_a_second_pack_into_the_same_folder_is_refused(photos, tmp_path, monkeypatch):
    import fcntl

    from stoker.pack import destination

    monkeypatch.setattr(destination, "LOCK_WAIT_SECONDS", 0.3)
    dst = tmp_path / "busy"
    dst.mkdir()
    with open(dst / ".stoker-pack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(PackError, match="another stoker pack is writing here"):
            stoker.pack(photos, dst, progress=False)


def test_rerun_rejects_replaced_shards_and_removes_leftovers(photos, tmp_path):
    run = BlockedPack(photos, tmp_path, position=70, workers=1)
    dst = run.dst
    try:
        wait_for(lambda: len(list(dst.glob("shard-*.idx"))) >= 3 and list(dst.glob(".shard-*.tmp")))
    finally:
        run.kill()
    run.unblock()
    # What other killed runs leave: a shard another run replaced (same size, other bytes), a
    # half-written manifest, and a shard of a plan with more shards.
    replaced = dst / "shard-000001.idx"
    data = bytearray(replaced.read_bytes())
    data[-2] ^= 0x01
    replaced.write_bytes(bytes(data))
    (dst / ".stoker.json.12345.tmp").write_text("{")
    (dst / "shard-000099.tar").write_bytes(b"old")
    result = stoker.pack(run.src, dst, shard_bytes=600_000, workers=1, progress=False)
    assert result.reused_shards >= 2
    assert verify_dataset(dst) == []
    assert not (dst / ".stoker.json.12345.tmp").exists() and not (dst / "shard-000099.tar").exists()
    assert sorted(p.name for p in dst.glob("shard-*.tar")) == [s.name for s in read_manifest(dst).shards]
