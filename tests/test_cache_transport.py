"""A transport fault is never taken for the object's content: an answer that holds less than its
Content-Range says, a server that ignores the Range once, resets and a request never answered,
during a ranged read or a node-cache download (moto behind the shaped link), are read again; the
shard is cached intact and nothing is recorded in ``.damaged/``. Damage at the source is still
named, after a second, complete, mismatching copy (tests/test_cache_damage.py)."""

from __future__ import annotations

import logging
import os

import pytest

import stoker
from stoker.bench.link import Faults, ShapedLink
from stoker.storage import remote as remote_module
from stoker.storage.remote import RemoteData
from tests.test_remote_faults import through


@pytest.fixture
def link(s3):
    with ShapedLink(s3.port, delay=0.002, seed=3) as shaped:
        yield shaped


def cached_and_damaged(cache_dir) -> tuple[dict[str, bytes], list[str]]:
    """The copies in the node cache folder (name -> bytes) and the names recorded as damaged."""
    (folder,) = [p for p in cache_dir.iterdir() if p.is_dir()]
    copies = {p.name: p.read_bytes() for p in folder.glob("shard-*.tar")}
    return copies, sorted(os.listdir(folder / ".damaged"))


@pytest.mark.parametrize("fault", ["short", "ignore_range"])
def test_a_ranged_read_given_a_wrong_answer_once_reads_again(s3, remote, packed, link, fault):
    name = stoker.ShardDataset(packed).shards.manifest.shards[0].name
    data = RemoteData(remote, through(s3, link))
    link.inject(fault)
    assert data.read_range(name, 1000, 300_000) == (packed / name).read_bytes()[1000:300_000]
    assert link.counts()[fault] == 1 and len(link.ranges("GET")) == 2


@pytest.mark.parametrize(("fault", "parallel"), [("short", 16), ("ignore_range", 16), ("short", 1)])
def test_a_cache_download_given_a_wrong_answer_once_caches_the_shard_intact(s3, remote, packed, link, tmp_path,
                                                                            monkeypatch, fault, parallel):
    """Parts of 64 KiB, so that most start inside the shard (as a shard of over 8 MiB's do); or one
    streamed GET per shard (``reads_in_flight=1``: no Range to ignore)."""
    monkeypatch.setattr(remote_module, "DOWNLOAD_PART", 64 << 10)
    there = stoker.ShardDataset(remote, decode="raw", storage_options=through(s3, link), cache_dir=tmp_path / "c",
                                reads_in_flight=parallel)
    here = stoker.ShardDataset(packed, decode="raw")
    link.set_faults(Faults(**{fault: 0.3}))  # parts fetched together: a third of them answered wrong once or more
    assert [there[i] for i in range(len(here))] == [here[i] for i in range(len(here))]
    copies, damaged = cached_and_damaged(tmp_path / "c")
    assert damaged == []
    assert copies and all(data == (packed / name).read_bytes() for name, data in copies.items())
    assert link.counts()[fault] >= 1


def test_a_node_cache_epoch_through_resets_is_intact_and_never_waits_out_a_timeout(s3, remote, packed, link,
                                                                                   tmp_path, caplog):
    there = stoker.ShardDataset(remote, storage_options=through(s3, link), cache_dir=tmp_path / "c",
                                cache_limit=2_000_000, read_timeout=10)  # a fetch left running stops soon
    link.set_faults(Faults(reset=0.1))
    with caplog.at_level(logging.WARNING, logger="stoker"):
        labels = [label for _, batch in stoker.Loader(there, 16, seed=1, threads=3) for label in batch.tolist()]
    assert sorted(labels) == sorted(stoker.ShardDataset(packed).targets.tolist())
    copies, damaged = cached_and_damaged(tmp_path / "c")
    assert damaged == [] and all(data == (packed / name).read_bytes() for name, data in copies.items())
    assert link.counts()["reset"] >= 1
    # each reset was seen as one and read again at once, never waited out: every retry's cause is a
    # reset's own error or, where a loaded machine kept moto silent over 2 s, our stall (NoAnswer);
    # none is a backend's timeout (10 s here), the wait a reset once cost
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert not [m for m in retries if "Timeout" in m]
    assert len([m for m in retries if "NoAnswer" not in m]) <= link.counts()["reset"]


def test_a_request_never_answered_is_asked_again_long_before_the_read_timeout(s3, remote, packed, link, caplog):
    """The read's first attempt gives up on a silent connection after 2 s (``_STALL``), not at
    the read timeout (60 s here), nor at the backend's own read timeout (10 s in these options):
    told by the cause each retry names, not by the clock, so a loaded machine cannot fail it."""
    name = stoker.ShardDataset(packed).shards.manifest.shards[0].name
    data = RemoteData(remote, through(s3, link), read_timeout=60)
    link.inject("black_hole")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert data.read_range(name, 0, 200_000) == (packed / name).read_bytes()[:200_000]
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries and "NoAnswer: nothing arrived for 2 s" in retries[0]
    assert not [m for m in retries if "Timeout" in m]
    assert link.counts()["black_hole"] == 1 and len(link.ranges("GET")) == len(retries) + 1
