"""Frame tables and exact clip decoding on generated videos whose frames carry their index."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.video import FrameTable, VideoError, clip_indices, decode_frames, scan_video
from tests.videos import frame_number, make_video

# name -> (frames, make_video keyword arguments)
KINDS = {
    "cfr_bframes.mp4": (60, {"options": {"bf": "3"}}),
    "one_keyframe.mp4": (150, {"options": {"g": "150", "bf": "3", "sc_threshold": "0"}}),
    "vfr.mkv": (60, {"vfr_ms": [20, 20, 70]}),
    "no_count.mkv": (40, {}),
    "one_frame.mp4": (1, {}),
    "with_audio.mp4": (50, {"audio": True}),
    "mpeg4_bframes.avi": (60, {"codec": "mpeg4", "options": {"bf": "2", "g": "12"}}),
    "mpeg4_bframes.mp4": (60, {"codec": "mpeg4", "options": {"bf": "2", "g": "12"}}),
    "short_gop.mp4": (40, {"options": {"g": "4", "keyint_min": "4", "sc_threshold": "0"}}),
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    return {name: (make_video(folder / name, frames, **kwargs), frames) for name, (frames, kwargs) in KINDS.items()}


@pytest.mark.parametrize("name", list(KINDS))
def test_the_table_counts_every_frame_that_decodes(videos, name):
    path, frames = videos[name]
    table = scan_video(path)
    assert len(table) == frames and table.keyframe[0]
    assert np.all(np.diff(table.pts) > 0)
    if name == "no_count.mkv":
        assert table.header_frames == 0  # the container does not say; the table still knows
    if name == "one_keyframe.mp4":
        assert int(table.keyframe.sum()) == 1
    if name == "vfr.mkv":
        assert len(set(np.round(np.diff(table.seconds), 3))) == 2  # 20 ms and 70 ms gaps


@pytest.mark.parametrize("name", list(KINDS))
def test_every_decoded_frame_is_the_frame_asked_for(videos, name):
    path, frames = videos[name]
    table = scan_video(path)
    rng = np.random.default_rng(0)
    asks = [np.arange(frames), rng.integers(0, frames, 8), np.sort(rng.integers(0, frames, 8)), [frames - 1, 0]]
    for ask in asks:
        got = decode_frames(path, table, np.asarray(ask))
        assert got.shape == (len(ask), 48, 64, 3) and got.dtype == np.uint8
        assert [frame_number(image) for image in got] == list(ask)
    from_bytes = decode_frames(path.read_bytes(), table, np.array([frames // 2]))
    assert frame_number(from_bytes[0]) == frames // 2


@pytest.mark.parametrize("name", list(KINDS))
def test_frames_decoded_from_indexed_packets_are_the_frames_asked_for(videos, name):
    path, frames = videos[name]
    data = path.read_bytes()
    table = scan_video(data)
    if name == "mpeg4_bframes.avi":
        assert table.packets is None  # not seekable: decoded from the start through the container
    else:
        assert table.packets is not None and len(table.packets.pts) == frames
    rng = np.random.default_rng(1)
    # runs within a group of pictures, jumps to later keyframes, repeats and a backward order
    asks = [np.arange(frames), rng.integers(0, frames, 8), np.arange(0, frames, 7), [frames - 1, 0, frames // 2]]
    whole = decode_frames(path, scan_video(path), np.arange(frames))  # through the container
    for ask in asks:
        got = decode_frames(data, table, np.asarray(ask))
        assert [frame_number(image) for image in got] == list(ask)
        assert np.array_equal(got, whole[np.asarray(ask)])  # pixel for pixel, not just the number


def test_a_table_cut_to_a_span_starts_decoding_at_a_keyframe_of_the_file(videos):
    path, frames = videos["short_gop.mp4"]
    data = path.read_bytes()
    full = scan_video(data)
    kept = np.arange(6, frames)  # starts between keyframes 4 and 8
    table = FrameTable.from_json(full.to_json(kept))
    assert not table.keyframe[0] and table.packets is not None
    got = decode_frames(data, table, np.array([0, 1, 5]))
    assert [frame_number(image) for image in got] == [6, 7, 11]


def test_far_apart_frames_seek_again_instead_of_decoding_everything(videos):
    path, _ = videos["cfr_bframes.mp4"]
    table = scan_video(path)
    assert table.keyframe.sum() >= 1
    got = decode_frames(path, table, np.array([0, 59]))
    assert [frame_number(image) for image in got] == [0, 59]


def test_truncated_and_garbage_files_are_rejected_with_a_reason(videos, tmp_path):
    path, _ = videos["cfr_bframes.mp4"]
    data = path.read_bytes()
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoError, match=r"truncated\.mp4: "):
        scan_video(truncated)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    with pytest.raises(VideoError, match=r"garbage\.mp4: not a readable video"):
        scan_video(garbage)


@pytest.mark.parametrize("sampling", ["random", "uniform", "segments"])
def test_clip_indices_have_the_shape_and_stay_in_range(sampling):
    rng = np.random.default_rng(0)
    for frames in (1, 5, 100):
        picks = clip_indices(frames, 8, 2, sampling, clips=3, rng=rng)
        assert picks.shape == (3, 8) and picks.min() >= 0 and picks.max() <= frames - 1
        assert np.all(np.diff(picks, axis=1) >= 0)  # frames in time order


def test_short_videos_repeat_their_last_frame():
    picks = clip_indices(5, 8, 1, "random", clips=1, rng=np.random.default_rng(0))
    assert picks.tolist() == [[0, 1, 2, 3, 4, 4, 4, 4]]
    assert clip_indices(1, 4, 2, "uniform", 1, np.random.default_rng(0)).tolist() == [[0, 0, 0, 0]]


def test_segments_take_one_frame_from_each_equal_part():
    picks = clip_indices(80, 8, 1, "segments", clips=50, rng=np.random.default_rng(1))
    assert np.all(picks // 10 == np.arange(8))


def test_fps_sampling_follows_the_frame_times_of_a_variable_rate_video(videos):
    table = scan_video(videos["vfr.mkv"][0])
    seconds = table.seconds
    picks = clip_indices(len(table), 6, 1, "uniform", 1, np.random.default_rng(0), seconds=seconds, fps=10.0)[0]
    instants = (seconds[-1] - 0.5) / 2 + np.arange(6) / 10  # a uniform single clip sits in the middle
    assert np.all(seconds[picks] <= instants + 1e-9)  # each pick is on screen at its instant:
    assert np.all(seconds[np.minimum(picks + 1, len(table) - 1)] > instants)  # the next frame starts later
    assert len(set(np.diff(seconds[picks]).round(3))) > 1  # gaps follow the variable frame times
