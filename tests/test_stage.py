"""stoker stage: a packed data set copied from a real S3-compatible server (moto, on localhost, in
its own process), verified, resumable, fetched once, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import stoker
from stoker.cli import main
from stoker.storage.stage import StageError, stage
from tests.s3server import S3Server


def data_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.suffix in (".tar", ".idx", ".json")}


def test_staged_copy_is_byte_exact_and_reads_back(s3, remote, packed, tmp_path):
    result = stage(remote, tmp_path / "local", progress=False, storage_options=s3.options)
    assert data_files(tmp_path / "local") == data_files(packed)
    assert result.fetched == 2 * len(stoker.ShardDataset(packed).shards.manifest.shards) and result.skipped == 0
    staged, original = stoker.ShardDataset(tmp_path / "local", decode="raw"), stoker.ShardDataset(packed, decode="raw")
    assert [staged[i] for i in range(len(staged))] == [original[i] for i in range(len(original))]


def test_a_second_stage_fetches_nothing_and_a_damaged_file_is_fetched_again(s3, remote, packed, tmp_path):
    dst = tmp_path / "local"
    stage(remote, dst, progress=False, storage_options=s3.options)
    before = s3.gets("/data/packed/shard-")
    assert before >= 2 * len(list(packed.glob("*.tar")))
    again = stage(remote, dst, progress=False, storage_options=s3.options)
    assert again.fetched == 0 and s3.gets("/data/packed/shard-") == before  # no shard or index GET at all
    victim = sorted(dst.glob("*.tar"))[1]
    data = bytearray(victim.read_bytes())
    data[700] ^= 0x01
    victim.write_bytes(bytes(data))
    fetched_before = s3.gets(f"/data/packed/{victim.name}")
    repaired = stage(remote, dst, progress=False, storage_options=s3.options)
    assert repaired.fetched == 1 and s3.gets(f"/data/packed/{victim.name}") == fetched_before + 1
    assert data_files(dst) == data_files(packed)


def test_leftovers_of_a_killed_stage_do_not_block_the_next(s3, remote, packed, tmp_path):
    dst = tmp_path / "local"
    dst.mkdir()
    (dst / f".stoker-partial-99999-{sorted(packed.glob('*.tar'))[0].name}").write_bytes(b"half a shard")
    stage(remote, dst, progress=False, storage_options=s3.options)
    assert data_files(dst) == data_files(packed)
    assert not list(dst.glob(".stoker-partial-*"))


def test_missing_bucket_or_data_set_is_a_clear_error(s3, tmp_path):
    with pytest.raises(StageError, match=r"s3://no-such-bucket/ds/stoker.json: not found"):
        stage("s3://no-such-bucket/ds", tmp_path / "a", progress=False, storage_options=s3.options)
    s3.fs.mkdir("empty")
    with pytest.raises(StageError, match=r"s3://empty/ds/stoker.json: not found"):
        stage("s3://empty/ds", tmp_path / "b", progress=False, storage_options=s3.options)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing made for a source that is not there


def test_a_stopped_server_gives_retries_then_a_clear_error(packed, tmp_path):
    server = S3Server(tmp_path / "requests.log")
    server.fs.mkdir("data")
    server.fs.put(str(packed) + "/", "data/packed", recursive=True)
    server.stop()
    with pytest.raises(StageError, match=r"failed after 3 attempts"):  # the retries counted, not timed
        stage("s3://data/packed", tmp_path / "local", progress=False, retries=2, backoff=0.1,
              storage_options=server.options)


def test_bad_credentials_are_a_clear_error(packed, tmp_path):
    server = S3Server(tmp_path / "requests.log", auth=True)
    try:
        server.fs.mkdir("data")
        server.fs.put(str(packed) + "/", "data/packed", recursive=True)
        assert stage("s3://data/packed", tmp_path / "ok", progress=False, storage_options=server.options).fetched > 0
        wrong = {**server.options, "key": "AKIAWRONGWRONGWRONG1", "secret": "wrong"}
        with pytest.raises(StageError, match=r"s3://data/packed/stoker.json: access denied"):
            stage("s3://data/packed", tmp_path / "denied", progress=False, storage_options=wrong)
    finally:
        server.stop()


def test_cli_stage_from_a_local_folder(packed, tmp_path, capsys):
    assert main(["stage", str(packed), str(tmp_path / "copy"), "--quiet"]) == 0
    assert data_files(tmp_path / "copy") == data_files(packed)
    assert "fetched" in capsys.readouterr().out
