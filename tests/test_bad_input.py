"""What a pack is given but does not pack is counted and said; special files are refused without
being opened; text inputs that are not what they should be get one line naming the file and the
form expected (issue 18, classes 2, 3 and 4). Real files throughout: FIFOs, sockets, devices,
symbolic links, Latin-1 and UTF-16 lists."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.cli import main
from stoker.errors import OptionError, PackError
from stoker.sources import open_source
from tests.conftest import encode

RED = Image.new("RGB", (40, 30), (255, 0, 0))


@pytest.fixture
def deadline():
    """Fail instead of hanging: a pack that opened a FIFO for reading would wait forever."""
    def expired(*_):
        raise TimeoutError("the pack hung (a special file opened for reading?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def image_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def mixed_tree(root: Path) -> Path:
    """Two class folders with JPEGs, and files of other kinds beside them."""
    return image_tree(root, {
        "a/one.jpg": encode(RED, "JPEG"), "a/two.png": encode(RED, "PNG"), "a/anim.gif": encode(RED, "GIF"),
        "a/notes.txt": b"hello", "b/three.jpg": encode(RED, "JPEG"), "b/deep/four.GIF": encode(RED, "GIF"),
        "b/README": b"readme", "b/deep/five.jpeg": encode(RED, "JPEG"),
    })


def error_line(capsys) -> str:
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


# Class 2: files listed but not packed because of their extension


def test_files_left_out_by_extension_are_counted_in_the_result_the_manifest_and_the_summary(tmp_path, capsys):
    src = mixed_tree(tmp_path / "src")
    assert main(["pack", str(src), str(tmp_path / "ds"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "not packed: 4 files in the class folders with other extensions (2 .gif, 1 .txt, 1 without extension)" in out
    assert "--extensions +gif" in out
    manifest = json.loads((tmp_path / "ds" / "stoker.json").read_text())
    assert manifest["num_samples"] == 4
    assert manifest["source"]["skipped_extensions"] == {"": 1, ".gif": 2, ".txt": 1}
    assert manifest["source"]["repeated_folders"] == 0
    assert main(["info", str(tmp_path / "ds")]) == 0
    assert "not packed   2 .gif, 1 .txt, 1 without extension (other extensions)" in capsys.readouterr().out
    again = stoker.pack(src, tmp_path / "ds", progress=False)  # finished earlier: the counts come from the manifest
    assert again.skipped_extensions == {"": 1, ".gif": 2, ".txt": 1}


@pytest.mark.parametrize("extensions, packed, skipped", [
    ("+gif", 6, {"": 1, ".txt": 1}),
    (["jpg", ".GIF"], 4, {"": 1, ".jpeg": 1, ".png": 1, ".txt": 1}),
    ("gif", 2, {"": 1, ".jpeg": 1, ".jpg": 2, ".png": 1, ".txt": 1}),
])
def test_extensions_take_other_formats_that_pillow_reads(tmp_path, extensions, packed, skipped):
    src = mixed_tree(tmp_path / "src")
    result = stoker.pack(src, tmp_path / "ds", extensions=extensions, progress=False, workers=1)
    assert result.num_samples == packed and result.skipped_extensions == skipped and result.rejected == []
    dataset = stoker.ShardDataset(tmp_path / "ds")
    assert dataset.shards.manifest.schema.get("gif") == "image"
    assert all(np.abs(np.asarray(image, np.int16) - np.asarray(RED)).max() <= 2 for image, _ in dataset)  # JPEG: 254


def test_the_loader_decodes_a_gif_with_pillow(tmp_path):
    src = image_tree(tmp_path / "src", {"a/red.gif": encode(RED, "GIF"), "b/blue.gif": encode(Image.new("RGB", (40, 30),
                                                                                                         (0, 0, 255)), "GIF")})
    stoker.pack(src, tmp_path / "ds", extensions="gif", progress=False, workers=1)
    loader = stoker.Loader(stoker.ShardDataset(tmp_path / "ds"), batch_size=2, order="sequential", threads=2,
                           crop=stoker.CropSpec("resize", size=(16, 16)))
    images, labels = next(iter(loader))
    colours = {int(label): tuple(int(v) for v in image.reshape(3, -1).float().mean(1)) for image, label in zip(images, labels)}
    assert colours == {0: (255, 0, 0), 1: (0, 0, 255)}  # GIF keeps these colours exactly


def test_tar_shards_take_gif_members_with_extensions(tmp_path):
    shards = tmp_path / "wds"
    shards.mkdir()
    with tarfile.open(shards / "part-0.tar", "w") as archive:
        for key, data in (("k0.gif", encode(RED, "GIF")), ("k0.cls", b"1"), ("k1.jpg", encode(RED, "JPEG")), ("k1.cls", b"0")):
            info = tarfile.TarInfo(key)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    default = stoker.pack(shards, tmp_path / "default", progress=False, workers=1)
    assert default.num_samples == 1 and default.rejected[0][1] == "the sample has no image member"
    taken = stoker.pack(shards, tmp_path / "gif", extensions="+gif", progress=False, workers=1)
    assert taken.num_samples == 2 and taken.rejected == []


def test_a_folder_with_no_file_of_the_extensions_says_what_it_found(tmp_path):
    src = image_tree(tmp_path / "src", {"a/x.gif": encode(RED, "GIF"), "a/y.txt": b"t"})
    with pytest.raises(PackError, match=r"no image files \(.jpg, .*\) found in the class folders; found only 1 .gif, 1 .txt"):
        stoker.pack(src, tmp_path / "ds", progress=False)


# Class 3: FIFOs, sockets, devices and links to them; link cycles


def special_tree(root: Path) -> Path:
    """Class folders with a real JPEG each, a FIFO, a socket and a link to /dev/zero named as images."""
    image_tree(root, {"a/good.jpg": encode(RED, "JPEG"), "b/good.jpg": encode(RED, "JPEG")})
    os.mkfifo(root / "a" / "fifo.jpg")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "b" / "socket.png"))
    server.close()  # the socket file stays
    (root / "b" / "zero.jpg").symlink_to("/dev/zero")
    (root / "a" / "pipe-link.jpg").symlink_to(root / "a" / "fifo.jpg")
    return root


def test_special_files_are_rejected_with_a_reason_without_being_opened(tmp_path, deadline):
    src = special_tree(tmp_path / "src")
    result = stoker.pack(src, tmp_path / "ds", progress=False, workers=2)
    assert result.num_samples == 2
    reasons = {Path(path).name: reason for path, reason in result.rejected}
    assert reasons == {
        "fifo.jpg": "not a regular file: a FIFO (named pipe)",
        "pipe-link.jpg": f"not a regular file: a symbolic link to a FIFO (named pipe) ({src / 'a' / 'fifo.jpg'})",
        "socket.png": "not a regular file: a socket",
        "zero.jpg": "not a regular file: a symbolic link to a character device (/dev/zero)",
    }
    rows = (tmp_path / "ds" / "rejected.tsv").read_text().splitlines()
    assert len(rows) == 5 and any("fifo.jpg\tnot a regular file" in row for row in rows)


def test_strict_stops_at_a_special_file_naming_it(tmp_path, deadline):
    src = special_tree(tmp_path / "src")
    with pytest.raises(PackError, match=r"fifo.jpg: not a regular file: a FIFO .*--strict"):
        stoker.pack(src, tmp_path / "ds", progress=False, workers=1, strict=True)


def test_a_device_node_named_as_an_image_is_rejected(tmp_path, deadline):
    src = image_tree(tmp_path / "src", {"a/good.jpg": encode(RED, "JPEG")})
    try:
        os.mknod(src / "a" / "zero.jpg", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("making a device node needs root")
    result = stoker.pack(src, tmp_path / "ds", progress=False, workers=1)
    assert result.rejected == [(str(src / "a" / "zero.jpg"), "not a regular file: a character device")]


def test_a_fifo_named_as_a_video_is_rejected(tmp_path, deadline):
    from tests.videos import make_video

    (tmp_path / "src" / "a").mkdir(parents=True)
    make_video(tmp_path / "src" / "a" / "real.mp4", 5)
    os.mkfifo(tmp_path / "src" / "a" / "pipe.mp4")
    result = stoker.pack(tmp_path / "src", tmp_path / "ds", video_mode="frames", progress=False, workers=1)
    assert result.num_samples == 1 and result.rejected[0][1] == "not a regular file: a FIFO (named pipe)"


def test_special_files_as_the_source_or_inside_it_are_refused_in_one_line(tmp_path, capsys, deadline):
    os.mkfifo(tmp_path / "list.csv")
    assert main(["pack", str(tmp_path / "list.csv"), str(tmp_path / "ds")]) == 1
    assert "not a folder or a list file but a FIFO (named pipe)" in error_line(capsys)
    (tmp_path / "wds").mkdir()
    os.mkfifo(tmp_path / "wds" / "part-0.tar")
    assert main(["pack", str(tmp_path / "wds"), str(tmp_path / "ds")]) == 1
    assert "part-0.tar: not a regular file but a FIFO" in error_line(capsys)


def test_link_cycles_end_and_each_real_folder_is_listed_once(tmp_path, deadline):
    src = image_tree(tmp_path / "src", {"a/x.jpg": encode(RED, "JPEG"), "a/sub/y.jpg": encode(RED, "JPEG"),
                                        "b/z.jpg": encode(RED, "JPEG")})
    (src / "a" / "sub" / "back").symlink_to(src / "a")  # a cycle inside class a
    (src / "b" / "root").symlink_to(src)  # a cycle through the source root
    (src / "b" / "same-sub").symlink_to(src / "a" / "sub")  # a second way to a folder listed in class a
    source = open_source(src)
    assert sorted(os.path.relpath(p, src) for p in source.refs) == ["a/sub/y.jpg", "a/x.jpg", "b/z.jpg"]
    assert source.repeated_folders == 3
    result = stoker.pack(src, tmp_path / "ds", progress=False, workers=1)
    assert result.num_samples == 3 and result.repeated_folders == 3


def test_links_to_folders_elsewhere_are_followed_in_imagefolder_order(tmp_path):
    elsewhere = image_tree(tmp_path / "elsewhere", {"p.jpg": b"1", "q/r.jpg": b"2"})
    src = image_tree(tmp_path / "src", {"a/m.jpg": b"3", "a/z/n.jpg": b"4", "b/o.png": b"5"})
    (src / "a" / "linked").symlink_to(elsewhere)
    expected = []  # what torchvision's ImageFolder lists: sorted(os.walk(followlinks=True)), files sorted
    for label, name in enumerate(["a", "b"]):
        for folder, _, files in sorted(os.walk(src / name, followlinks=True)):
            expected += [(os.path.join(folder, f), label) for f in sorted(files)]
    source = open_source(src)
    assert list(zip(source.refs, source.labels.tolist())) == expected and source.repeated_folders == 0


# Class 4: text inputs that are not what they should be


@pytest.mark.parametrize("content, says", [
    ("é.jpg,0\n".encode("latin-1"), r"list.csv:1: not UTF-8 text \(byte 0xe9\); a path list is a UTF-8 CSV/TSV"),
    (b"a.jpg,0\nb.jpg,1\n\xff\xfejunk\n", r"list.csv:3: not UTF-8 text \(byte 0xff\)"),
    ("a.jpg,0\n".encode("utf-16"), r"list.csv: UTF-16 text; save the list as UTF-8"),
    (b"a.jpg,0\nb.jpg\x00,1\n", r"list.csv:2: holds a NUL byte: binary data, not a UTF-8 CSV/TSV"),
    (b"", r"list.csv: the list holds no paths \(expected 'path,label' rows\)"),
    (b"# only a comment\npath,label\n", r"list.csv: the list holds no paths"),
])
def test_a_path_list_that_is_not_utf8_csv_gets_one_line(tmp_path, capsys, content, says):
    (tmp_path / "list.csv").write_bytes(content)
    with pytest.raises(PackError, match=says):
        stoker.pack(tmp_path / "list.csv", tmp_path / "ds", progress=False)
    assert main(["pack", str(tmp_path / "list.csv"), str(tmp_path / "ds")]) == 1
    assert str(tmp_path / "list.csv") in error_line(capsys)


def test_a_list_with_a_byte_order_mark_and_crlf_lines_packs(tmp_path):
    image_tree(tmp_path, {"x/a.jpg": encode(RED, "JPEG"), "x/b.png": encode(RED, "PNG")})
    (tmp_path / "list.csv").write_bytes("\ufeffpath,label\r\nx/a.jpg,cat\r\nx/b.png,dog\r\n".encode())
    result = stoker.pack(tmp_path / "list.csv", tmp_path / "ds", progress=False, workers=1)
    dataset = stoker.ShardDataset(result.dst)
    assert result.rejected == [] and dataset.classes == ["cat", "dog"] and [dataset.key(i) for i in range(2)] == ["x/a", "x/b"]


@pytest.mark.parametrize("name", ["photo.jpg", "photo.PNG", "clip.mp4"])
def test_a_single_image_file_as_the_source_names_the_form_expected(tmp_path, capsys, name):
    (tmp_path / name).write_bytes(encode(RED, "JPEG"))
    assert main(["pack", str(tmp_path / name), str(tmp_path / "ds")]) == 1
    line = error_line(capsys)
    assert name in line and "a single" in line and "a folder of class folders" in line and "path,label" in line


def test_a_list_naming_a_folder_rejects_that_row(tmp_path):
    image_tree(tmp_path, {"x/a.jpg": encode(RED, "JPEG")})
    (tmp_path / "list.csv").write_text("x/a.jpg,0\nx,1\n")
    result = stoker.pack(tmp_path / "list.csv", tmp_path / "ds", progress=False, workers=1)
    assert result.rejected == [(str(tmp_path / "x"), "not a regular file: a folder")]


def test_a_file_where_a_data_set_folder_is_expected(tmp_path, capsys, packed):
    (tmp_path / "photo.jpg").write_bytes(encode(RED, "JPEG"))
    for command in (["info"], ["verify"], ["cat", "x"]):
        command.insert(1, str(tmp_path / "photo.jpg"))
        assert main(command) == 1
        assert "photo.jpg: a file, not a data set" in error_line(capsys)
    assert main(["stage", str(packed), str(tmp_path / "photo.jpg"), "--quiet"]) == 1
    assert "photo.jpg: cannot stage into it (a file is there)" in error_line(capsys)
    assert (tmp_path / "photo.jpg").read_bytes() == encode(RED, "JPEG")


@pytest.mark.parametrize("command", [["info", "--json"], ["info"], ["cat", "0"], ["verify", "--quiet"]])
def test_a_reader_that_goes_away_gets_no_traceback(packed, command):
    process = subprocess.Popen([sys.executable, "-m", "stoker.cli", command[0], str(packed), *command[1:]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # as `| head -1` does once it has its line: before stoker writes anything
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_a_manifest_that_is_not_utf8_is_a_format_error(packed, tmp_path, capsys):
    import shutil

    shutil.copytree(packed, tmp_path / "ds")
    (tmp_path / "ds" / "stoker.json").write_bytes(b"\xff\xfe{not json")
    assert main(["info", str(tmp_path / "ds")]) == 1
    assert "stoker.json: not valid JSON" in error_line(capsys)


def test_extensions_are_checked_as_extensions(tmp_path):
    src = mixed_tree(tmp_path / "src")
    for bad in ("a/b", "", ",", "j pg"):
        with pytest.raises(OptionError, match="--extensions"):
            stoker.pack(src, tmp_path / "ds", extensions=bad, progress=False)
    assert not (tmp_path / "ds").exists()
