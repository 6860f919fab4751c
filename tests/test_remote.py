"""Reading a packed data set in place from a real S3-compatible server (moto, on localhost, in its
own process): ShardDataset, DataLoader workers under fork and spawn, stoker.Loader, errors."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import pickle
import threading

import pytest
import torch.utils.data

import stoker
from stoker.errors import RemoteError
from stoker.storage.remote import RemoteData, cache_root
from tests.conftest import SMALL_SHARD
from tests.test_resume import BlockedPack


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Metadata folders under this test's tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def as_list(batch):
    return list(batch)


def test_items_read_in_place_are_byte_exact(s3, remote, packed):
    there = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options)
    here = stoker.ShardDataset(packed, decode="raw")
    assert len(there) == len(here) and there.classes == here.classes
    before = s3.gets("/data/packed/shard-")
    assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))]
    shards = len(here.shards.manifest.shards)
    assert s3.gets("/data/packed/shard-") - before <= 2 * shards  # in order: a member, then its whole block
    fetched = [p.suffix for p in (cache_root() / "metadata").rglob("*") if p.is_file() and p.name != ".lock"]
    assert sorted(fetched) == sorted([".idx"] * shards + [".json"])  # only manifest and indexes came down (and a lock)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_in_place(s3, remote, packed, context):
    there = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options)
    loader = torch.utils.data.DataLoader(there, batch_size=8, num_workers=2, multiprocessing_context=context,
                                         collate_fn=as_list)
    manifests = s3.gets("/data/packed/stoker.json")
    got = [item for batch in loader for item in batch]
    assert s3.gets("/data/packed/stoker.json") == manifests  # workers use the metadata the parent fetched
    here = stoker.ShardDataset(packed, decode="raw")
    assert got == [here[i] for i in range(len(here))]


def test_loader_reads_in_place(s3, remote, packed):
    there = stoker.Loader(stoker.ShardDataset(remote, storage_options=s3.options), 16, seed=3, threads=2)
    here = stoker.Loader(stoker.ShardDataset(packed), 16, seed=3, threads=2)
    for (a, la), (b, lb) in zip(there, here, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_reads_in_flight_is_kept_by_workers_and_the_node_cache(s3, remote, tmp_path):
    dataset = stoker.ShardDataset(remote, storage_options=s3.options, cache_dir=tmp_path / "node", reads_in_flight=3)
    for shards in (dataset.shards, pickle.loads(pickle.dumps(dataset)).shards):  # as a spawned worker gets it
        assert shards.remote.parallel == 3 and shards.cache.origin.parallel == 3
    with pytest.raises(ValueError, match="reads_in_flight"):
        stoker.ShardDataset(remote, storage_options=s3.options, reads_in_flight=0)


def test_a_damaged_cached_index_is_fetched_again(s3, remote, packed):
    stoker.ShardDataset(remote, storage_options=s3.options)
    index = sorted((cache_root() / "metadata").rglob("*.idx"))[0]
    index.write_bytes(b"\0" * index.stat().st_size)
    there = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options)
    assert there[0] == stoker.ShardDataset(packed, decode="raw")[0]


def test_a_missing_data_set_is_a_clear_error(s3, remote):
    with pytest.raises(RemoteError, match=r"s3://data/nothing/stoker.json: not found"):
        stoker.ShardDataset("s3://data/nothing", storage_options=s3.options)


def test_pack_to_s3_uploads_a_readable_data_set_and_resumes(s3, photos, packed):
    result = stoker.pack(photos, "s3://data/uploaded", shard_bytes=SMALL_SHARD, workers=2, progress=False,
                         storage_options=s3.options)
    assert result.dst == "s3://data/uploaded"
    assert not any((cache_root() / "pack").iterdir())  # the local copy is gone once uploaded
    there = stoker.ShardDataset("s3://data/uploaded", decode="raw", storage_options=s3.options)
    here = stoker.ShardDataset(packed, decode="raw")
    assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))]
    puts = s3.requests("PUT", "/data/uploaded/shard-")
    assert puts == 2 * len(here.shards.manifest.shards)
    stoker.pack(photos, "s3://data/uploaded", shard_bytes=SMALL_SHARD, workers=2, progress=False,
                storage_options=s3.options)
    assert s3.requests("PUT", "/data/uploaded/shard-") == puts  # every shard already there: none sent again


def test_killed_pack_to_s3_resumes_and_uploads_only_missing_shards(s3, photos, packed, tmp_path):
    s3.fs.mkdir("resume")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_ENDPOINT_URL": s3.url, "AWS_DEFAULT_REGION": "eu-west-1"}
    run = BlockedPack(photos, tmp_path, 60, 1, dst="s3://resume/ds", env=env)
    try:
        run.wait_blocked()  # each task uploads its own shard at once: every shard before the photo is up
        assert s3.requests("PUT", "/resume/ds/shard-") >= 8
    finally:
        run.kill()
    uploaded_before = s3.requests("PUT", "/resume/ds/shard-")
    assert not s3.fs.exists("resume/ds/stoker.json")
    run.unblock()
    result = stoker.pack(run.src, "s3://resume/ds", shard_bytes=SMALL_SHARD, workers=1, progress=False,
                         storage_options=s3.options)
    shards = len(stoker.ShardDataset(packed).shards.manifest.shards)
    assert result.reused_shards * 2 >= uploaded_before - 1
    assert s3.requests("PUT", "/resume/ds/shard-") == 2 * shards, "shards uploaded before the kill are not sent again"
    there = stoker.ShardDataset("s3://resume/ds", decode="raw", storage_options=s3.options)
    here = stoker.ShardDataset(packed, decode="raw")
    assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))]
    assert not any((cache_root() / "pack").iterdir())


class _NoLength(http.server.SimpleHTTPRequestHandler):
    """A plain HTTP/1.0 server that never says a file's size (no Content-Length: the body ends
    when the connection closes), as some web servers and proxies answer."""

    protocol_version = "HTTP/1.0"

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() != "content-length":
            super().send_header(keyword, value)

    def log_message(self, *args) -> None:
        pass

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError):  # a client that asked for the headers only and left
            super().handle()


def test_the_manifest_and_indexes_come_from_a_server_that_does_not_say_their_size(packed):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_NoLength, directory=packed.parent))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        there = RemoteData(f"http://127.0.0.1:{server.server_port}/{packed.name}", read_timeout=30)
        indexes = [entry.index for entry in stoker.ShardDataset(packed).shards.manifest.shards]
        assert there.read("stoker.json") == (packed / "stoker.json").read_bytes()
        assert there.read_many(indexes) == {name: (packed / name).read_bytes() for name in indexes}
    finally:
        server.shutdown()
        server.server_close()
