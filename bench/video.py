"""Video clips per second: decoding the original files on the fly against stoker's two modes.

Generated natural-looking videos (a slow pan over a real photograph with sensor noise, H.264 at
the encoder's default long GOP with B-frames, 25 fps) in two class folders. Each method reads clips of 8
frames at stride 2 from a random start, in batches of 16 clips, through a DataLoader with 2
worker processes:

  (a) PyAV on the original files: open, seek to the keyframe before the start, decode forward
      (what a hand-written video Dataset does);
  (d) stoker frames mode (``stoker pack --video-mode frames``) + VideoClipDataset;
  (e) stoker video mode (``--video-mode video``) + VideoClipDataset, as stored and with
      ``--gop 8`` (re-encoded: a keyframe every 8 frames, no B-frames).

Prints clips/s, the ratio to (a), bytes on disk against the originals, and for the re-encoded
video the PSNR of its frames against the original's. One run, 2 cores.

    .venv/bin/python bench/video.py                    # 24 videos of 10 s at 320x240
    .venv/bin/python bench/video.py --size 640x480
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import av
import numpy as np
import torch.utils.data
from PIL import Image

import stoker
from stoker.sample_data import make_sample_photos
from stoker.video import decode_frames, scan_video

from _common import header

CLIP, STRIDE, BATCH = 8, 2, 16
NOISE = 4.0  # standard deviation of the per-pixel noise, in 8-bit levels


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


class OnTheFly(torch.utils.data.Dataset):
    """(a): PyAV on the original file, one seek per clip, decode forward."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with av.open(str(self.paths[i])) as container:
            stream = container.streams.video[0]
            frames = stream.frames or 250
            start = random.randrange(max(1, frames - CLIP * STRIDE))
            wanted = set(range(start, start + CLIP * STRIDE, STRIDE))
            step = 1 / float(stream.average_rate)
            container.seek(int(start * step / stream.time_base), stream=stream, backward=True)
            got = []
            for frame in container.decode(stream):
                index = round(float(frame.pts * stream.time_base) / step)
                if index in wanted:
                    got.append(frame.to_ndarray(format="rgb24"))
                if index >= max(wanted) or len(got) == CLIP:
                    break
        return torch.from_numpy(np.stack(got[:CLIP]))


def clips_per_second(dataset: torch.utils.data.Dataset, passes: int) -> float:
    """Clips/s in batches of 16 from a DataLoader with 2 workers, after the first batch."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=_clips,
                                         sampler=list(range(len(dataset))) * passes)
    iterator = iter(loader)
    next(iterator)  # workers started
    start = time.perf_counter()
    n = sum(len(batch) for batch in iterator)
    return n / (time.perf_counter() - start)


def _clips(items: list) -> torch.Tensor:
    """A batch (B, T, H, W, 3) of clips: the clip alone, whether items are clips or (clip, label, frames)."""
    return torch.stack([item[0] if isinstance(item, tuple) else item for item in items])


def psnr(dataset: stoker.VideoClipDataset, paths: list[Path]) -> float:
    """Mean PSNR (dB) of every 10th frame of each re-encoded video against the original's decode."""
    by_key = {f"{p.parent.name}/{p.stem}": p for p in paths}
    errors = []
    for i in range(len(dataset)):
        shard, local = dataset.shards.locate(i)
        reader = dataset.shards.reader(shard)
        members = {reader.index.fields[int(m["field"])]: m for m in reader.index.sample_members(local)}
        table_json = json.loads(bytes(reader.read_member(local, members["frames.json"])))
        stored = bytes(reader.read_member(local, members["mp4"]))
        frames = np.arange(0, len(table_json["pts"]), 10)
        original = by_key[reader.index.key(local)]
        ours = decode_frames(stored, scan_video(stored), frames).astype(np.float64)
        theirs = decode_frames(original, scan_video(original), frames).astype(np.float64)
        errors.append(np.mean((ours - theirs) ** 2))
    return float(10 * np.log10(255**2 / np.mean(errors)))


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/video"))
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--passes", type=int, default=4, help="clips per video in each measurement")
    args = parser.parse_args()
    header(f"video clips/s: {args.count} videos of {args.seconds} s at {args.size}, clips of {CLIP} at stride {STRIDE}")
    size = tuple(int(v) for v in args.size.split("x"))
    src = args.data / f"src-{args.size}-noise{NOISE:g}"
    paths = make_videos(src, args.count, size, args.seconds)
    original = folder_bytes(src)
    packed = {}
    for name, mode, gop in (("(d) stoker frames mode", "frames", None), ("(e) stoker video mode", "video", None),
                            ("(e) stoker video mode, --gop 8", "video", 8)):
        dst = args.data / f"{mode}{gop or ''}-{args.size}-noise{NOISE:g}"
        if not (dst / "stoker.json").exists():
            stoker.pack(src, dst, video_mode=mode, gop=gop, workers=os.cpu_count(), progress=False)
        packed[name] = dst
    rows = {"(a) PyAV on the originals, seek per clip": OnTheFly(paths)}
    rows.update({name: stoker.VideoClipDataset(dst, CLIP, STRIDE) for name, dst in packed.items()})
    rates = {name: clips_per_second(dataset, args.passes) for name, dataset in rows.items()}
    base = next(iter(rates.values()))
    print(f"| method | clips/s | vs (a) | bytes vs original ({original / 1e6:.1f} MB) |")
    print("|---|---|---|---|")
    for (name, rate), dst in zip(rates.items(), [src, *packed.values()], strict=True):
        print(f"| {name} | {rate:.1f} | {rate / base:.1f}x | {folder_bytes(dst) / original:.2f} |")
    print(f"PSNR of the --gop 8 frames against the original's: {psnr(rows['(e) stoker video mode, --gop 8'], paths):.1f} dB")


if __name__ == "__main__":
    main()
