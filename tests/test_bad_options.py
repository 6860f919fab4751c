"""Options out of range, or given for another mode, are refused before any work, in one line
(issue 18, class 1). The CLI test finds every numeric option in the parser itself, so an option
added later is covered without touching this file."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.cli import _parser, main
from stoker.errors import OptionError

# Out of every numeric option's range: below 0, not a number, infinite, huge.
BAD_VALUES = ["-1", "abc", "nan", "1e400", "100000000000000000000"]


def subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(argv prefix, subparser) for every leaf subcommand, however deeply nested (`bench loader`)."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        yield prefix, parser
    for action in actions:
        for name, child in action.choices.items():
            yield from subcommands(child, (*prefix, name))


def numeric_options() -> list[tuple[tuple[str, ...], list[str], str]]:
    """(command, placeholder positionals, option) for every option whose argparse type makes a
    number: anything but a plain string or a path."""
    found = []
    for command, parser in subcommands(_parser()):
        positionals = ["x" for a in parser._actions if not a.option_strings and a.nargs is None]
        for action in parser._actions:
            if action.option_strings and action.type not in (None, str, Path):
                found.append((command, positionals, action.option_strings[0]))
    return found


OPTIONS = numeric_options()


def test_the_parser_has_the_numeric_options_we_know_of():
    flags = {(" ".join(command), flag) for command, _, flag in OPTIONS}
    assert {("pack", "--shard-size"), ("pack", "--workers"), ("pack", "--shuffle-seed"), ("pack", "--max-side"),
            ("pack", "--quality"), ("pack", "--fps"), ("pack", "--short-side"), ("pack", "--gop"), ("pack", "--crf"),
            ("sample", "--count"), ("sample", "--classes"), ("sample", "--seed"), ("doctor", "--step-time"),
            ("doctor", "--batch-size"), ("doctor", "--workers"), ("doctor", "--size"), ("bench loader", "--count"),
            ("bench loader", "--repeat"), ("bench loader", "--batch")} <= flags


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command, positionals, flag", OPTIONS, ids=[f"{' '.join(c)} {f}" for c, _, f in OPTIONS])
def test_every_numeric_option_refuses_bad_values_in_one_line(command, positionals, flag, capsys, tmp_path,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written; if it were, not into the checkout
    for value in BAD_VALUES:
        assert main([*command, f"{flag}={value}", *positionals]) == 1, value
        line = one_error_line(capsys)
        assert flag in line and ("must be" in line or "not a size" in line), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, flag, value, says", [
    ("pack", "--max-side", "0", "from 1 to 65535"),
    ("pack", "--short-side", "0", "from 1 to 65535"),
    ("pack", "--fps", "-5", "above 0"),
    ("pack", "--fps", "0", "above 0"),
    ("pack", "--shard-size", "0", "from 64 KiB to 16 GiB"),
    ("pack", "--workers", "-3", "from 1 to 4096"),
    ("pack", "--quality", "500", "from 1 to 100"),
    ("pack", "--shuffle-seed", "-1", "from 0 to 2**63 - 1"),
    ("pack", "--crf", "60", "from 0 to 51"),
    ("doctor", "--step-time", "0", "above 0"),
    ("sample", "--classes", "0", "from 1 to 100000"),
])
def test_the_range_is_in_the_message(command, flag, value, says, capsys, tmp_path):
    positionals = {"pack": [str(tmp_path / "src"), str(tmp_path / "dst")]}.get(command, [str(tmp_path / "x")])
    assert main([command, f"{flag}={value}", *positionals]) == 1
    assert says in one_error_line(capsys)


@pytest.mark.parametrize("options, needs", [
    (["--gop", "4"], "--video-mode video"),
    (["--crf", "30"], "--gop"),
    (["--video-mode", "video", "--crf", "30"], "--gop"),
    (["--fps", "5"], "--video-mode frames"),
    (["--short-side", "64"], "--video-mode frames"),
    (["--video-mode", "video", "--fps", "5"], "--video-mode frames"),
    (["--video-mode", "video", "--quality", "80"], "--crf"),
    (["--quality", "80"], "--max-side"),
    (["--video-mode", "frames", "--max-side", "100"], "--short-side"),
    (["--video-mode", "frames", "--verify-decode"], "applies to images"),
    (["--address", "ray://head:10001"], "--engine ray"),
])
def test_options_of_another_mode_are_refused_before_any_work(photos, tmp_path, capsys, options, needs):
    dst = tmp_path / "dst"
    assert main(["pack", str(photos), str(dst), *options]) == 1
    line = one_error_line(capsys)
    assert needs in line and options[-2 if options[-1][0] != "-" else -1] in line, line
    assert not dst.exists(), "refused before the destination is made"


def test_extensions_are_refused_for_a_path_list(tmp_path, capsys):
    listing = tmp_path / "list.csv"
    listing.write_text("a.jpg,0\n")
    assert main(["pack", str(listing), str(tmp_path / "dst"), "--extensions", "gif"]) == 1
    assert "--extensions" in one_error_line(capsys)


@pytest.mark.parametrize("arguments, named", [
    ({"max_side": 0}, "max_side=0"), ({"short_side": 0, "video_mode": "frames"}, "short_side=0"),
    ({"fps": -5.0, "video_mode": "frames"}, "fps=-5.0"), ({"fps": 0, "video_mode": "frames"}, "fps=0"),
    ({"fps": float("inf"), "video_mode": "frames"}, "fps=inf"), ({"shard_bytes": 0}, "shard_bytes=0"),
    ({"workers": -3}, "workers=-3"), ({"quality": 500, "max_side": 100}, "quality=500"),
    ({"shuffle_seed": -1}, "shuffle_seed=-1"), ({"max_side": 2.5}, "max_side=2.5"), ({"workers": True}, "workers=True"),
    ({"gop": 4}, "gop=4"), ({"quality": 80}, "quality=80"), ({"video_mode": "both"}, "video_mode='both'"),
    ({"extensions": "a/b"}, "extensions="), ({"extensions": []}, "extensions="),
])
def test_python_pack_checks_its_arguments_first(photos, tmp_path, arguments, named):
    dst = tmp_path / "dst"
    with pytest.raises(OptionError, match=named.replace("(", r"\(").replace("[", r"\[")) as info:
        stoker.pack(photos, dst, progress=False, **arguments)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    assert not dst.exists()


def test_readers_and_helpers_check_their_arguments(packed, tmp_path):
    from stoker.sample_data import make_sample_photos
    from stoker.storage.stage import stage

    for arguments in ({"block_bytes": 0}, {"max_open_shards": 0}, {"cache_ahead": -1},
                      {"cache_dir": tmp_path / "cache", "cache_limit": 0}):
        with pytest.raises(OptionError, match=f"{next(iter(arguments))}=|cache_limit="):
            stoker.ShardDataset(packed, **arguments)
    with pytest.raises(OptionError, match="fps=0"):
        stoker.VideoClipDataset(tmp_path / "not-even-there", fps=0)
    with pytest.raises(OptionError, match=r"count=-1 \(--count\)"):
        make_sample_photos(tmp_path / "photos", count=-1)
    with pytest.raises(OptionError, match="retries=-1"):
        stage(str(packed), tmp_path / "staged", retries=-1)
    with pytest.raises(OptionError, match="batch_size=0"):
        stoker.doctor(packed, batch_size=0)
    assert not (tmp_path / "photos").exists() and not (tmp_path / "staged").exists()


LOADER_OPTIONS = [
    ({"prefetch": -5}, "prefetch=-5: must be an integer from 1 to 1024"), ({"prefetch": 0}, "prefetch=0"),
    ({"batch_size": 0}, "batch_size=0: must be an integer from 1"), ({"batch_size": 2.5}, "batch_size=2.5"),
    ({"window": 0}, "window=0: must be an integer from 1"), ({"threads": 0}, "threads=0: must be an integer from 1"),
    ({"threads": True}, "threads=True"), ({"processes": -1}, "processes=-1: must be an integer from 0"),
    ({"mp_context": "thread"}, "mp_context='thread': must be one of 'fork', 'spawn', 'forkserver' or None"),
    ({"layout": "CHW"}, "layout='CHW': must be one of 'NCHW', 'NHWC' or None"),
    ({"order": "shuffled"}, "order='shuffled': must be one of 'quasi_random', 'random' or 'sequential'"),
    ({"decode": "tpu"}, "decode='tpu': must be one of 'cpu' or 'gpu'"),
    ({"on_error": "ignore"}, "on_error='ignore': must be one of 'raise', 'skip' or None"),
    ({"device": "gpu"}, "device='gpu': must be a torch.device"), ({"drop_last": "yes"}, "drop_last='yes'"),
    ({"seed": -1}, "seed=-1: must be an integer from 0 to 2**63 - 1"), ({"start_epoch": -1}, "start_epoch=-1"),
    ({"start_epoch": 2**31}, "start_epoch=2147483648: must be an integer from 0 to 2147483647"),
    ({"crop": "center"}, "crop='center': must be a stoker.CropSpec or None"),
    ({"transform": 5}, "transform=5: must be callable"),
    ({"rank": 2, "world_size": 2, "seed": 0}, "rank=2: must be an integer from 0 to 1 (world_size=2)"),
    ({"world_size": 0}, "world_size=0: must be an integer from 1"),
]


@pytest.mark.parametrize(("options", "says"), LOADER_OPTIONS)
def test_every_loader_option_is_checked_naming_it_and_what_it_takes(packed, options, says):
    with pytest.raises(OptionError) as refused:
        stoker.Loader(stoker.ShardDataset(packed), **{"batch_size": 8, **options})
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("options", "says"), [
    ({"window": 0}, "window=0"), ({"batch_size": 0}, "batch_size=0"), ({"seed": 1.5}, "seed=1.5"),
    ({"start_epoch": -2}, "start_epoch=-2"), ({"shuffle": "yes"}, "shuffle='yes': must be one of True or False"),
    ({"drop_last": 1}, "drop_last=1: must be one of False or True"), ({"readahead": None}, "readahead=None"),
    ({"num_replicas": 0}, "num_replicas=0: must be an integer from 1"),
])
def test_every_sampler_option_is_checked_naming_it(packed, options, says):
    with pytest.raises(OptionError, match=re.escape(says)):
        stoker.QuasiRandomSampler(stoker.ShardDataset(packed), **options)


def test_a_bad_option_from_the_real_command_exits_1_without_a_traceback(tmp_path):
    run = subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(tmp_path), str(tmp_path / "d"),
                          "--max-side", "0"], capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "--max-side" in run.stderr and "Traceback" not in run.stderr


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("arguments, named", [
    ({"kind": "centre"}, "kind='centre'"), ({"kind": None}, "kind=None"),
    ({"size": (0, 16)}, "size=(0, 16)"), ({"size": (16, -1)}, "size=(16, -1)"), ({"size": 224}, "size=224"),
    ({"size": (16,)}, "size=(16,)"), ({"size": (16, 16, 3)}, "size=(16, 16, 3)"), ({"size": (16.5, 16)}, "size=(16.5, 16)"),
    ({"size": ("16", "16")}, "size=('16', '16')"), ({"size": (True, 16)}, "size=(True, 16)"),
    ({"size": (16, 70000)}, "size=(16, 70000)"), ({"size": "16x16"}, "size='16x16'"),
    ({"scale": (0.9, 0.1)}, "scale=(0.9, 0.1)"), ({"scale": (0, 1)}, "scale=(0, 1)"), ({"scale": (0.5, 1.5)}, "scale=(0.5, 1.5)"),
    ({"scale": (NAN, 1.0)}, "scale=(nan, 1.0)"), ({"scale": (-0.1, 1.0)}, "scale=(-0.1, 1.0)"), ({"scale": 0.5}, "scale=0.5"),
    ({"ratio": (4 / 3, 3 / 4)}, "ratio=(1.3333333333333333, 0.75)"), ({"ratio": (-1, 1)}, "ratio=(-1, 1)"),
    ({"ratio": (0, 1)}, "ratio=(0, 1)"), ({"ratio": (1, INF)}, "ratio=(1, inf)"),
    ({"center_fraction": 0}, "center_fraction=0"), ({"center_fraction": 1.5}, "center_fraction=1.5"),
    ({"center_fraction": NAN}, "center_fraction=nan"), ({"center_fraction": -0.5}, "center_fraction=-0.5"),
    ({"center_fraction": "0.875"}, "center_fraction='0.875'"),
    ({"flip": 2}, "flip=2"), ({"flip": -0.1}, "flip=-0.1"), ({"flip": "yes"}, "flip='yes'"), ({"flip": NAN}, "flip=nan"),
    ({"flip": None}, "flip=None"),
    ({"exact": "yes"}, "exact='yes'"), ({"exact": 1}, "exact=1"), ({"exact": None}, "exact=None"),
    ({"kind": "random_resized", "exact": True}, "exact=True applies to 'center' and 'resize'"),
    ({"kind": "center", "exact": True, "interpolation": "nearest"}, "interpolation='nearest'"),
])
def test_crop_spec_checks_every_field_when_made(arguments, named):
    with pytest.raises(OptionError) as info:
        stoker.CropSpec(**arguments)
    message = str(info.value)
    assert message.startswith(named) and "\n" not in message, message
    assert "must be" in message or "applies" in message


def test_a_crop_spec_that_would_fail_every_sample_is_refused_at_once():
    # issue 40: accepted before, then every sample failed ("image does not decode (ZeroDivisionError)")
    with pytest.raises(OptionError, match=r"center_fraction=0: must be a number above 0 and at most 1"):
        stoker.CropSpec("center", size=(16, 16), center_fraction=0)


def test_crop_spec_keeps_what_is_in_range_as_plain_tuples():
    edge = stoker.CropSpec("center", size=[np.int64(1), 65535], center_fraction=1, flip=0)
    assert edge.size == (1, 65535) and all(type(side) is int for side in edge.size)
    assert {edge} == {stoker.CropSpec("center", size=(1, 65535), center_fraction=1.0, flip=0)}  # hashable, equal
    assert stoker.CropSpec(scale=[1, 1], ratio=(0.5, 0.5), flip=1.0).scale == (1.0, 1.0)
    assert stoker.CropSpec("resize", exact=True, flip=False).exact
