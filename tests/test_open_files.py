"""Open files: data sets dropped unclosed release their descriptors, a process out of descriptors
is told which limit to raise (never that its data is damaged), and a forked child never closes a
descriptor number of its parent's readers that it may have reused. Each case in a subprocess
with RLIMIT_NOFILE lowered, as a user's `ulimit -n` would."""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stoker

ROOT = Path(__file__).parent.parent


def run_limited(script: str, *args: object) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python whose first lines lower RLIMIT_NOFILE to ``LIMIT`` (in its ``args``)."""
    head = "import resource, sys\nLIMIT = int(sys.argv[1])\n" \
           "resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-c", head + textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_new_data_sets_and_loader_epochs_in_a_loop_stay_within_the_file_limit(packed):
    # 12 shards: each data set left open holds 24 descriptors (its shards and their indexes'
    # maps), so without finalizers the fourth round needs some 130, over a limit of 80
    shards = len(stoker.ShardDataset(packed).shards.manifest.shards)
    assert shards >= 8
    done = run_limited("""
        import stoker
        for round in range(4):
            data = stoker.ShardDataset(sys.argv[2])
            assert sum(len(labels) for _, labels in stoker.Loader(data, 16, threads=2)) == len(data)
            raw = stoker.ShardDataset(sys.argv[2], decode="raw")
            assert all(raw[i] for i in range(0, len(raw), 7))
        print("rounds done")
    """, 80, packed)
    assert done.returncode == 0 and "rounds done" in done.stdout, done.stderr[-3000:]


def test_a_closed_or_exited_data_set_holds_no_file(packed):
    before = set(os.listdir("/proc/self/fd"))
    with stoker.ShardDataset(packed, decode="raw") as data:
        for i in range(len(data)):
            data[i]
        assert len(set(os.listdir("/proc/self/fd")) - before) >= len(data.shards.manifest.shards)
    assert set(os.listdir("/proc/self/fd")) - before == set()  # the shards, and the indexes' maps with them
    assert data[3] == stoker.ShardDataset(packed, decode="raw")[3]  # reading again opens them again
    data.close()


@pytest.mark.parametrize("cache", [False, True], ids=["local", "node-cache"])
def test_no_descriptor_left_is_a_limit_to_raise_not_damage(packed, tmp_path, cache):
    done = run_limited("""
        import os
        import stoker
        from stoker.errors import ResourceLimitError
        cache = {"cache_dir": sys.argv[3]} if sys.argv[3] != "-" else {}
        data = stoker.ShardDataset(sys.argv[2], decode="raw", on_error="skip", **cache)
        if cache:  # every index open first: the first open to fail is the cache's
            for shard in range(len(data.shards.manifest.shards)):
                data.shards.index(shard)
        hold = []
        while len(os.listdir("/proc/self/fd")) < LIMIT - 1:
            hold.append(os.open(os.devnull, os.O_RDONLY))
        try:
            for i in range(len(data)):
                data[i]
        except ResourceLimitError as e:
            print("ResourceLimitError:", e)
        print("skipped", data.skipped)
    """, 64, packed, tmp_path / "cache" if cache else "-")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ResourceLimitError:" in done.stdout and "RLIMIT_NOFILE" in done.stdout and "ulimit -n" in done.stdout
    assert "skipped 0" in done.stdout  # nothing passed over as damaged


def close_reused_number_in_a_child(packed: Path, results) -> None:
    """In a forked child: the inherited descriptor of the parent's reader is closed by something
    else (as a library closing descriptors would), its number reused for a file of the child's own,
    then the inherited data set is dropped: that file must stay open."""
    data = inherited
    name = data.shards.manifest.shards[0].name
    fd = next(int(n) for n in os.listdir("/proc/self/fd") if os.readlink(f"/proc/self/fd/{n}").endswith(name))
    os.close(fd)
    mine = os.open(os.devnull, os.O_RDONLY)
    assert mine == fd
    del data
    globals().pop("inherited")
    gc.collect()
    try:
        os.fstat(mine)
        results.put("still open")
    except OSError as e:
        results.put(f"closed: {e}")


def test_a_forked_child_never_closes_a_number_it_inherited(packed):
    global inherited
    inherited = stoker.ShardDataset(packed, decode="raw")
    inherited[0]
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=close_reused_number_in_a_child, args=(packed, results))
    child.start()
    child.join(60)
    assert results.get(timeout=10) == "still open"
    assert inherited[1] == stoker.ShardDataset(packed, decode="raw")[1]  # the parent's reads go on
    del inherited
