"""Video clips per second, and wrong frames: the usual readers on the original files against stoker.

Speed: generated natural-looking videos (a slow pan over a real photograph with sensor noise,
H.264 at x264's defaults: long GOP, B-frames; 25 fps) in two class folders. Each method reads
clips of 8 frames at stride 2 from a random start (the start drawn from the header's frame
count, as a hand-written Dataset does), in batches of 16 clips:

  (a) PyAV on the original files: open, seek to the keyframe before the start, decode forward;
  (b) OpenCV VideoCapture, one CAP_PROP_POS_FRAMES seek per clip;
  (c) decord 0.6 VideoReader.get_batch (unmaintained), and torchcodec if it imports;
  (d) stoker frames mode (``stoker pack --video-mode frames``);
  (e) stoker video mode (``--video-mode video``), as stored and re-encoded with ``--gop 8``.

(a)-(e) run through a DataLoader with 2 worker processes, one clip per item; the Loader rows run
stoker.Loader (threads, whole batches, no worker processes) on the same packs, with the frames
passed through at full size, and once cutting a RandomResizedCrop to 112x112 (frames decoded at
reduced DCT scale). Prints clips/s, the ratio to (a), bytes on disk against the originals, and
for re-encoded video the PSNR of its frames against the original's decode.

Wrong frames: small videos whose frames carry their index in their pixels (tests/videos.py):
B-frames in MP4, an MKV remux (no frame count in the header), variable frame rate, MPEG-4 with
B-frames in AVI. Each reader is asked for 30 clips per file; a frame is wrong when the index it
carries is not the index asked for.

    .venv/bin/python bench/video.py                    # 48 videos of 10 s at 320x240
    .venv/bin/python bench/video.py --size 640x480
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av
import cv2
import numpy as np
import torch.utils.data
from PIL import Image

import stoker
from stoker.loader import CropSpec
from stoker.sample_data import make_sample_photos
from stoker.video import decode_frames, scan_video

from _common import header

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/videos.py: the numbered-frame videos
from tests.videos import frame_number, make_video  # noqa: E402

CLIP, STRIDE, BATCH = 8, 2, 16
NOISE = 4.0  # standard deviation of the per-pixel noise, in 8-bit levels
ClipReader = Callable[[str, list[int]], list[np.ndarray]]


def make_videos(root: Path, count: int, size: tuple[int, int], seconds: int) -> list[Path]:
    """``count`` pans over real photographs, in two class folders (made once)."""
    photos = sorted(make_sample_photos(root.parent / "video-photos", count=count, num_classes=1, seed=3).rglob("*.jpg"))
    paths = []
    for i, photo in enumerate(photos[:count]):
        path = root / f"class_{i % 2}" / f"video_{i:03d}.mp4"
        paths.append(path)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        width, height = size
        image = Image.open(photo).convert("RGB").resize((width * 2, height * 2))
        frames = seconds * 25
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=25)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            rng = np.random.default_rng(i)
            for t in range(frames):
                x = int(t / frames * width)
                y = int(t / frames * height / 2)
                crop = np.asarray(image.crop((x, y, x + width, y + height)), dtype=np.float32)
                # Sensor noise: without it a smooth pan compresses to ~80 kbit/s, far below real
                # footage, and every blow-up (JPEG frames, short GOPs) looks many times worse.
                noisy = np.clip(crop + rng.normal(0, NOISE, crop.shape), 0, 255).astype(np.uint8)
                container.mux(stream.encode(av.VideoFrame.from_ndarray(noisy, format="rgb24")))
            container.mux(stream.encode())
    return paths


def pyav_clip(path: str, wanted: list[int]) -> list[np.ndarray]:
    """(a): seek to the time of the first frame, decode forward, index frames by time x rate."""
    with av.open(path) as container:
        stream = container.streams.video[0]
        step = 1 / float(stream.average_rate)
        container.seek(int(wanted[0] * step / stream.time_base), stream=stream, backward=True)
        got = {}
        for frame in container.decode(stream):
            index = round(float(frame.pts * stream.time_base) / step)
            if index in wanted:
                got[index] = frame.to_ndarray(format="rgb24")
            if index >= wanted[-1]:
                break
    return [got[i] for i in wanted if i in got]


def opencv_clip(path: str, wanted: list[int]) -> list[np.ndarray]:
    """(b): one CAP_PROP_POS_FRAMES seek, then read forward (grab only the frames skipped)."""
    capture = cv2.VideoCapture(path)
    capture.set(cv2.CAP_PROP_POS_FRAMES, wanted[0])
    got = []
    for index in range(wanted[0], wanted[-1] + 1):
        if not capture.grab():
            break
        if index in wanted:
            got.append(cv2.cvtColor(capture.retrieve()[1], cv2.COLOR_BGR2RGB))
    capture.release()
    return got


def decord_clip(path: str, wanted: list[int]) -> list[np.ndarray]:
    """(c): decord's VideoReader (one thread: the DataLoader's workers are the parallelism)."""
    import decord

    return list(decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1).get_batch(wanted).asnumpy())


def optional_readers() -> dict[str, ClipReader | str]:
    """(c): decord and torchcodec where they import, else why not."""
    readers: dict[str, ClipReader | str] = {}
    try:
        import decord  # noqa: F401

        readers["(c) decord 0.6 get_batch"] = decord_clip
    except ImportError as e:
        readers["(c) decord"] = f"not importable ({e})"
    try:
        from torchcodec.decoders import VideoDecoder

        readers["(c) torchcodec get_frames_at"] = lambda path, wanted: list(
            VideoDecoder(path, dimension_order="NHWC").get_frames_at(wanted).data.numpy())
    except Exception as e:  # noqa: BLE001 - a wheel without its CUDA libraries raises OSError
        readers["(c) torchcodec"] = f"not importable ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    return readers


class OriginalClips(torch.utils.data.Dataset):
    """Clips of the original files by ``read``, from a random start within the header's frame count."""

    def __init__(self, paths: list[Path], read: ClipReader) -> None:
        self.read = read
        self.paths = [str(p) for p in paths]
        self.frames = []
        for path in self.paths:
            with av.open(path) as container:
                self.frames.append(container.streams.video[0].frames or 250)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        start = random.randrange(max(1, self.frames[i] - CLIP * STRIDE))
        return torch.from_numpy(np.stack(self.read(self.paths[i], list(range(start, start + CLIP * STRIDE, STRIDE)))))


def dataloader_rate(dataset: torch.utils.data.Dataset, passes: int) -> float:
    """Clips/s in batches of 16 from a DataLoader with 2 workers, after the first batch."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=_clips,
                                         sampler=list(range(len(dataset))) * passes)
    iterator = iter(loader)
    next(iterator)  # workers started
    start = time.perf_counter()
    n = sum(len(batch) for batch in iterator)
    return n / (time.perf_counter() - start)


def loader_rate(dataset: stoker.VideoClipDataset, crop: CropSpec, passes: int) -> float:
    """Clips/s from stoker.Loader (threads), after the first batch."""
    loader = stoker.Loader(dataset, batch_size=BATCH, crop=crop)
    batches = (clips for _ in range(passes) for clips, _ in loader)
    next(batches)
    start = time.perf_counter()
    n = sum(len(clips) for clips in batches)
    return n / (time.perf_counter() - start)


def _clips(items: list) -> torch.Tensor:
    """A batch (B, T, H, W, 3) of clips: the clip alone, whether items are clips or (clip, label, frames)."""
    return torch.stack([item[0] if isinstance(item, tuple) else item for item in items])


def psnr(dataset: stoker.VideoClipDataset, paths: list[Path]) -> float:
    """Mean PSNR (dB) of every 10th frame of each re-encoded video against the original's decode."""
    by_key = {f"{p.parent.name}/{p.stem}": p for p in paths}
    errors = []
    for i in range(len(dataset)):
        video = dataset.open_video(i)
        frames = np.arange(0, len(video.table), 10)
        ours = dataset.decode_video(video, frames).astype(np.float64)
        original = by_key[video.key]
        theirs = decode_frames(original, scan_video(original), frames).astype(np.float64)
        errors.append(np.mean((ours - theirs) ** 2))
    return float(10 * np.log10(255**2 / np.mean(errors)))


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def tricky_videos(root: Path) -> dict[str, tuple[Path, int]]:
    """Numbered-frame videos that trip readers up: name -> (path, frames that decode)."""
    folder = root / "src" / "tricky"  # one class folder, packed below
    folder.mkdir(parents=True, exist_ok=True)
    made = {
        "MP4, H.264 with B-frames": (make_video(folder / "bframes.mp4", 120, options={"bf": "3"}), 120),
        "MKV, variable frame rate": (make_video(folder / "vfr.mkv", 120, vfr_ms=[20, 20, 70]), 120),
        "AVI, MPEG-4 with B-frames": (make_video(folder / "mpeg4.avi", 120, codec="mpeg4",
                                                 options={"bf": "2", "g": "12"}), 120),
    }
    remux = folder / "remux.mkv"  # the MP4's packets in Matroska: the header holds no frame count
    with av.open(str(made["MP4, H.264 with B-frames"][0])) as src, av.open(str(remux), "w") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                dst.mux(packet)
    made["MKV remux of the MP4"] = (remux, 120)
    return made


def wrong_frames(readers: dict[str, ClipReader], root: Path, clips: int = 30) -> None:
    """Print, per reader and file, the frames that carry another index than the one asked for."""
    videos = tricky_videos(root)
    print(f"\nwrong frames of {clips} clips ({CLIP} frames, stride {STRIDE}) per file; '-' = the reader failed")
    print("| reader | " + " | ".join(videos) + " |")
    print("|---|" + "---|" * len(videos))
    starts = np.random.default_rng(0).integers(0, 120 - CLIP * STRIDE, clips)
    for name, read in readers.items():
        cells = []
        for path, _ in videos.values():
            try:
                wrong = 0
                for start in starts:
                    wanted = list(range(int(start), int(start) + CLIP * STRIDE, STRIDE))
                    got = [frame_number(image) for image in read(str(path), wanted)]
                    wrong += sum(g != w for g, w in zip(got, wanted)) + CLIP - len(got)  # missing frames count
                cells.append(f"{wrong} / {clips * CLIP}")
            except Exception as e:  # noqa: BLE001 - a reader that fails is a result
                cells.append(f"- ({type(e).__name__})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for mode in ("frames", "video"):  # stoker: the same files packed; frames named by the dataset's own indices
        dst = root / f"packed-{mode}"
        if not (dst / "stoker.json").exists():
            stoker.pack(root / "src", dst, video_mode=mode, workers=1, progress=False)
        dataset = stoker.VideoClipDataset(dst, CLIP, STRIDE, clips_per_video=clips, seed=0)
        by_key = {dataset.key(i): i for i in range(len(dataset))}
        cells = []
        for path, _ in videos.values():
            clip, _, frames = dataset[by_key[f"tricky/{path.stem}"]]
            got = np.array([[frame_number(image.numpy()) for image in one] for one in clip])
            cells.append(f"{int((got != frames.numpy()).sum())} / {clips * CLIP}")
        print(f"| stoker {mode} mode | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/video"))
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--passes", type=int, default=8, help="clips per video in each measurement")
    parser.add_argument("--only", action="append", default=[],
                        help="measure only the rows whose name holds this text ((a) always; repeatable)")
    args = parser.parse_args()
    header(f"video clips/s: {args.count} videos of {args.seconds} s at {args.size}, clips of {CLIP} at stride {STRIDE}")
    width, height = (int(v) for v in args.size.split("x"))
    src = args.data / f"src-{args.size}-noise{NOISE:g}"
    paths = make_videos(src, args.count, (width, height), args.seconds)
    packs = {}
    for mode, gop, crf in (("frames", None, 23), ("video", None, 23), ("video", 8, 23), ("video", 8, 27)):
        dst = args.data / f"{mode}{gop or ''}{f'-crf{crf}' if gop else ''}-{args.size}-{args.count}-noise{NOISE:g}"
        if not (dst / "stoker.json").exists():
            listing = src / f"first-{args.count}.csv"  # the first --count videos (the folder may hold more)
            listing.write_text("".join(f"{p.relative_to(src)},{p.parent.name}\n" for p in paths))
            stoker.pack(listing, dst, video_mode=mode, gop=gop, crf=crf, workers=os.cpu_count(), progress=False)
        packs[(mode, gop, crf)] = dst
    readers = {"(a) PyAV, seek per clip": pyav_clip, "(b) OpenCV, CAP_PROP_POS_FRAMES per clip": opencv_clip}
    readers.update(optional_readers())
    full = CropSpec("resize", size=(height, width), flip=False)
    small = CropSpec(size=(112, 112))
    clips = lambda key: stoker.VideoClipDataset(packs[key], CLIP, STRIDE)  # noqa: E731
    rows: list[tuple[str, Callable[[], float] | str, Path]] = [
        (name, (lambda r=read: dataloader_rate(OriginalClips(paths, r), args.passes)) if callable(read) else read, src)
        for name, read in readers.items()]
    for label, key in (("(d) stoker frames mode", ("frames", None, 23)), ("(e) stoker video mode", ("video", None, 23)),
                       ("(e) stoker video mode, --gop 8", ("video", 8, 23)),
                       ("(e) stoker video mode, --gop 8 --crf 27", ("video", 8, 27))):
        rows.append((f"{label}, VideoClipDataset", lambda k=key: dataloader_rate(clips(k), args.passes), packs[key]))
        if key[0] == "frames" or key[1]:
            rows.append((f"{label}, Loader", lambda k=key: loader_rate(clips(k), full, args.passes), packs[key]))
    rows.append(("(d) stoker frames mode, Loader, RandomResizedCrop 112", lambda: loader_rate(
        clips(("frames", None, 23)), small, args.passes), packs[("frames", None, 23)]))
    original = sum(p.stat().st_size for p in paths)
    print(f"| method | clips/s | vs (a) | bytes vs original ({original / 1e6:.1f} MB) |")
    print("|---|---|---|---|")
    base = None
    for name, measure, folder in rows:
        if args.only and not name.startswith("(a)") and not any(text in name for text in args.only):
            continue
        if isinstance(measure, str):
            print(f"| {name} | {measure} | | |")
            continue
        rate = measure()
        base = base or rate
        stored = folder_bytes(folder) if folder != src else original
        print(f"| {name} | {rate:.1f} | {rate / base:.1f}x | {stored / original:.2f} |", flush=True)
    if args.only:
        return
    for crf in (23, 27):
        print(f"PSNR of the --gop 8 --crf {crf} frames against the original's: "
              f"{psnr(clips(('video', 8, crf)), paths):.1f} dB")
    with tempfile.TemporaryDirectory() as tmp:
        wrong_frames({name: read for name, read in readers.items() if callable(read)}, Path(tmp))


if __name__ == "__main__":
    main()
