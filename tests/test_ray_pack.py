"""`stoker pack --engine ray` on a real local Ray instance: the same bytes as the local engine,
resumable after a real kill, straight to an object store."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stoker
from stoker.cli import main
from stoker.errors import PackError
from stoker.format import MANIFEST_NAME
from stoker.format.verify import verify_dataset
from tests.conftest import SMALL_SHARD
from tests.test_resume import BlockedPack, files_state, wait_for
from tests.test_sources import write_hf_parquet, write_webdataset

if importlib.util.find_spec("ray") is None:  # not importorskip: this process never loads Ray (see ray_engine.py)
    pytest.skip("needs ray", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster():
    """A real local Ray cluster with 2 CPUs, started as `ray start` starts one; packs join it
    through RAY_ADDRESS (or --address), each from a driver process of its own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    # Ray 2.60's `ray start` turns token authentication on, and its drivers look for the token only
    # when told to; a test cluster on localhost goes without.
    settings = {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "disabled"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    subprocess.run([ray_cli, "start", "--head", "--num-cpus=2", f"--port={port}", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True, timeout=120)
    yield settings["RAY_ADDRESS"]
    subprocess.run([ray_cli, "stop", "--force"], check=True, capture_output=True, timeout=120)
    for name, value in previous.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value


def assert_same_data_set(a: Path, b: Path) -> None:
    """Every file byte for byte, the manifest apart from its creation time (and so its checksum)."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name != MANIFEST_NAME:
            assert filecmp.cmp(a / name, b / name, shallow=False), name
    manifests = [json.loads((root / MANIFEST_NAME).read_text()) for root in (a, b)]
    for manifest in manifests:
        del manifest["created_by"]["created"], manifest["checksum"]
    assert manifests[0] == manifests[1]


def test_ray_engine_writes_the_local_engines_bytes(cluster, photos, packed, tmp_path):
    result = stoker.pack(photos, tmp_path / "ray", shard_bytes=SMALL_SHARD, engine="ray", progress=False)
    assert result.num_shards > 4 and result.reused_shards == 0
    assert_same_data_set(packed, tmp_path / "ray")


def test_ray_engine_packs_videos_and_reports_rejects_as_the_local_engine(cluster, packed_videos, video_folder, tmp_path):
    mode, local, local_result = packed_videos
    result = stoker.pack(video_folder, tmp_path / "ray", video_mode=mode, shard_bytes=200_000, engine="ray",
                         progress=False)
    assert sorted(result.rejected) == sorted(local_result.rejected) and len(result.rejected) == 2
    assert result.notes == local_result.notes
    assert_same_data_set(local, tmp_path / "ray")


def test_killed_ray_pack_resumes_with_only_the_missing_shards(cluster, photos, packed, tmp_path):
    run = BlockedPack(photos, tmp_path, 60, 1, "--engine", "ray", "--address", cluster)
    dst = run.dst
    try:
        wait_for(lambda: len(list(dst.glob("shard-*.tar"))) >= 4 and list(dst.glob(".shard-*.tmp")))
        time.sleep(0.2)
    finally:
        run.kill()
    assert run.process.returncode == -signal.SIGKILL
    assert not (dst / MANIFEST_NAME).exists()
    finished = files_state(dst)

    run.unblock()
    result = stoker.pack(run.src, dst, shard_bytes=SMALL_SHARD, engine="ray", progress=False)
    assert result.reused_shards >= len(finished) // 2
    assert all(files_state(dst)[name] == state for name, state in finished.items()), "finished shards are kept as they are"
    assert verify_dataset(dst) == []
    local = stoker.pack(run.src, tmp_path / "local", shard_bytes=SMALL_SHARD, workers=2, progress=False)
    assert_same_data_set(local.dst, dst)


def test_ray_tasks_upload_shards_straight_to_the_object_store(cluster, s3, photos, packed):
    s3.fs.mkdir("ray")
    result = stoker.pack(photos, "s3://ray/ds", shard_bytes=SMALL_SHARD, engine="ray", progress=False,
                         storage_options=s3.options)
    assert result.dst == "s3://ray/ds"
    there = stoker.ShardDataset("s3://ray/ds", decode="raw", storage_options=s3.options)
    here = stoker.ShardDataset(packed, decode="raw")
    assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))]
    assert s3.requests("PUT", "/ray/ds/shard-") == 2 * len(here.shards.manifest.shards)


def test_ray_pack_from_the_command_line(cluster, photos, packed, tmp_path, capsys):
    assert main(["pack", str(photos), str(tmp_path / "cli"), "--shard-size", str(SMALL_SHARD),
                "--engine", "ray", "--quiet"]) == 0
    assert "packed 96 samples" in capsys.readouterr().out
    assert_same_data_set(packed, tmp_path / "cli")


def test_ray_engine_packs_parquet_and_webdataset_sources_as_the_local_engine(cluster, photos, tmp_path):
    write_hf_parquet(photos, tmp_path / "hf")
    write_webdataset(photos, tmp_path / "wds")
    for source in ("hf", "wds"):
        local = stoker.pack(tmp_path / source, tmp_path / f"{source}-local", shard_bytes=SMALL_SHARD, workers=2,
                            progress=False)
        remote = stoker.pack(tmp_path / source, tmp_path / f"{source}-ray", shard_bytes=SMALL_SHARD, engine="ray",
                             progress=False)
        assert remote.num_samples == local.num_samples == 96
        assert_same_data_set(local.dst, remote.dst)


def test_a_task_stopped_by_strict_names_the_file(cluster, photos, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(photos, src)
    bad = sorted(src.rglob("*.jpg"))[30]
    bad.write_bytes(bad.read_bytes()[:2000])
    with pytest.raises(PackError, match=rf"{bad}: truncated JPEG .*\(stopped by --strict\)"):
        stoker.pack(src, tmp_path / "ds", shard_bytes=SMALL_SHARD, engine="ray", strict=True, progress=False)
    assert not (tmp_path / "ds" / MANIFEST_NAME).exists()


def test_a_dataset_from_a_module_beside_the_script(cluster, photos, packed, tmp_path):
    """As a user runs it: `python scripts/pack.py`, whose Dataset class lives in scripts/mydata.py."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "mydata.py").write_text(
        "from pathlib import Path\n\n"
        "class Photos:\n"
        "    def __init__(self, root):\n"
        "        self.files = sorted(Path(root).rglob('*.jpg'))[:10]\n"
        "    def __len__(self):\n"
        "        return len(self.files)\n"
        "    def __getitem__(self, i):\n"
        "        return self.files[i].read_bytes(), i % 2\n")
    (scripts / "pack.py").write_text(
        "import sys\nimport stoker\nfrom mydata import Photos\n"
        "print(stoker.pack(Photos(sys.argv[1]), sys.argv[2], engine='ray', progress=False).num_samples)\n")
    done = subprocess.run([sys.executable, str(scripts / "pack.py"), str(photos), str(tmp_path / "ds")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("10")
