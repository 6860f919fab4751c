"""stoker stage: a packed data set copied from a real S3-compatible server (moto, on localhost, in
its own process), verified, resumable, fetched once, with clear errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import s3fs

import stoker
from stoker.cli import main
from stoker.storage.stage import StageError, stage


class S3Server:
    """``python -m moto.server`` on a free localhost port; its request log counts the GETs. With
    ``auth``, requests must carry the keys of an IAM user the server creates first."""

    def __init__(self, log: Path, auth: bool = False) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # moto checks credentials after this many requests: the three that make the user and its keys.
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"} if auth else None
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"moto server did not start: {log.read_text()}") from None
                time.sleep(0.1)
        key, secret = self._user() if auth else ("testing", "testing")
        self.options = {"key": key, "secret": secret, "skip_instance_cache": True,
                        "client_kwargs": {"endpoint_url": self.url, "region_name": "eu-west-1"},
                        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}}
        self.fs = s3fs.S3FileSystem(**self.options)

    def _user(self) -> tuple[str, str]:
        iam = boto3.client("iam", endpoint_url=self.url, region_name="eu-west-1", aws_access_key_id="x",
                           aws_secret_access_key="x")
        iam.create_user(UserName="stoker")
        key = iam.create_access_key(UserName="stoker")["AccessKey"]
        everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="stoker", PolicyName="all", PolicyDocument=json.dumps(everything))
        return key["AccessKeyId"], key["SecretAccessKey"]

    def gets(self, key_part: str) -> int:
        """GET requests so far whose path contains ``key_part``."""
        log = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())  # werkzeug colours some lines
        return len(re.findall(rf'"GET [^ "]*{re.escape(key_part)}[^ "]* HTTP', log))

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "requests.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote(s3, packed) -> str:
    """``packed`` uploaded to s3://data/packed."""
    s3.fs.mkdir("data")
    s3.fs.put(str(packed) + "/", "data/packed", recursive=True)
    return "s3://data/packed"


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
    assert not (tmp_path / "a" / "stoker.json").exists()


def test_a_stopped_server_gives_retries_then_a_clear_error(packed, tmp_path):
    server = S3Server(tmp_path / "requests.log")
    server.fs.mkdir("data")
    server.fs.put(str(packed) + "/", "data/packed", recursive=True)
    server.stop()
    start = time.monotonic()
    with pytest.raises(StageError, match=r"failed after 3 attempts"):
        stage("s3://data/packed", tmp_path / "local", progress=False, retries=2, backoff=0.1,
              storage_options=server.options)
    assert time.monotonic() - start < 60


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
