"""The stoker command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from stoker.cli import main, parse_size
from tests.conftest import PHOTOS, encode, source_files


def stoker_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker.cli", *args], capture_output=True)


def test_pack_info_verify_cat(photos, tmp_path):
    dst = tmp_path / "ds"
    run = stoker_command("pack", str(photos), str(dst), "--shard-size", "1MB", "--workers", "2")
    assert run.returncode == 0, run.stderr
    assert f"packed {PHOTOS} samples into" in run.stdout.decode()
    assert b"img/s" in run.stderr  # the progress bar

    info = stoker_command("info", str(dst)).stdout.decode()
    assert f"samples      {PHOTOS}" in info and "jpg (image), cls (class)" in info
    manifest = json.loads(stoker_command("info", str(dst), "--json").stdout)
    assert manifest["num_samples"] == PHOTOS

    verify = stoker_command("verify", str(dst), "--quiet")
    assert verify.returncode == 0 and f"OK: {PHOTOS} samples" in verify.stdout.decode()

    key = "class_02/" + sorted(p.stem for p in (photos / "class_02").iterdir())[3]
    assert stoker_command("cat", str(dst), key).stdout == source_files(photos)[key]
    assert stoker_command("cat", str(dst), key, "cls").stdout == b"2"
    assert stoker_command("cat", str(dst), "0").stdout in source_files(photos).values()
    missing = stoker_command("cat", str(dst), "no/such")
    assert missing.returncode == 1 and b"no sample 'no/such'" in missing.stderr


def test_verify_exits_nonzero_naming_the_damage(packed, tmp_path, capsys):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(packed, root)
    shard = sorted(root.glob("shard-*.tar"))[2]
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(root), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {shard}, sample '" in out


def test_cat_prefers_keys_over_indexes(tmp_path, capsysbinary):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "0001.png").write_bytes(encode(Image.new("L", (4, 4), 1), "PNG"))
    (src / "0002.png").write_bytes(encode(Image.new("L", (4, 4), 2), "PNG"))
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--quiet"]) == 0
    capsysbinary.readouterr()
    assert main(["cat", str(tmp_path / "ds"), "c/0002"]) == 0
    assert capsysbinary.readouterr().out == (src / "0002.png").read_bytes()
    assert main(["cat", str(tmp_path / "ds"), "1"]) == 0
    assert capsysbinary.readouterr().out == (src / "0002.png").read_bytes()


def test_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 1
    assert "not a stoker data set" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "missing"), str(tmp_path / "out"), "--quiet"]) == 1
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("text, value", [("256MB", 256 << 20), ("1g", 1 << 30), ("500k", 500 << 10), ("65536", 65536),
                                         ("1.5GiB", 3 << 29)])
def test_sizes(text, value):
    assert parse_size(text) == value


def test_pack_help_names_every_kind_of_source_and_the_column_options(capsys):
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for named in ("ImageFolder", "CSV/TSV", "Parquet", "WebDataset .tar", "Hugging Face save_to_disk folder",
                  "Hugging Face Dataset", "pandas DataFrame", "pyarrow Table", "map-style Dataset",
                  "--image-column", "--label-column", "--unlabelled", "--split"):
        assert named in text, named
