"""Does the doctor predict what its remedies give? Three constructed cases and any folder, each
run with ``stoker doctor --prove``: the verdict against the case's known bottleneck, and for each
proved remedy the predicted img/s against the one measured, with their ratio (target: within 15%).

  decode     large photos (the sample photos enlarged to 2000x1500, JPEG q90), standard transform
  transform  the sample photos (500x375), RandomResizedCrop + flip + a costly per-sample stage
             after the crop (a Gaussian blur, ``--blur-passes`` times) + to tensor
  storage    the sample photos, loose, on a spinning disk: run under ../shared/hdd-profile
  folder     any image folder (``--path``), e.g. data the tests have not seen; no expected verdict

    .venv/bin/python bench/doctor.py decode transform
    ../shared/hdd-profile -- .venv/bin/python bench/doctor.py storage
    .venv/bin/python bench/doctor.py folder --path /data/heldout
    .venv/bin/python bench/doctor.py decode --quick --count 40      # a smoke test (seconds)

Data are made once under ``--data`` (default bench-data/doctor), on the disk the storage case
throttles; the doctor's sample pack goes there too, so its cold reads are that disk's.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from pathlib import Path

from PIL import Image, ImageFilter

import stoker
from stoker.doctor.standard import RandomHorizontalFlip, RandomResizedCrop, ToUint8Tensor
from stoker.sample_data import make_sample_photos

from _common import header

TOLERANCE = 0.15
EXPECTED = {"decode": "decode", "transform": "transform", "storage": "storage", "folder": None}


class Blur:
    """A costly stage after the crop: a Gaussian blur, ``passes`` times over."""

    def __init__(self, passes: int) -> None:
        self.passes = passes

    def __call__(self, image: Image.Image) -> Image.Image:
        for _ in range(self.passes):
            image = image.filter(ImageFilter.GaussianBlur(6))
        return image

    def __repr__(self) -> str:
        return f"Blur(6) x {self.passes}"


class CostlyAfterCrop:
    """RandomResizedCrop(224) + flip + Blur + to tensor, stage by stage like a torchvision Compose."""

    def __init__(self, passes: int) -> None:
        self.transforms = [RandomResizedCrop(224), RandomHorizontalFlip(), Blur(passes), ToUint8Tensor()]

    def __call__(self, image):
        for stage in self.transforms:
            image = stage(image)
        return image

    def __repr__(self) -> str:
        return " + ".join(map(repr, self.transforms))


def large_photos(src: Path, dst: Path, side: int = 2000) -> Path:
    """``src``'s photos enlarged to ``side`` x 3/4 ``side`` (JPEG q90), made once."""
    for path in sorted(src.rglob("*.jpg")):
        target = dst / path.relative_to(src)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        Image.open(path).convert("RGB").resize((side, side * 3 // 4), Image.BICUBIC).save(out, "JPEG", quality=90)
        target.write_bytes(out.getvalue())
    return dst


def run_case(case: str, path: Path, args: argparse.Namespace) -> dict:
    """One doctor run with --prove; its verdict and proofs, printed and returned."""
    transform = CostlyAfterCrop(args.blur_passes) if case == "transform" else None
    report = stoker.doctor(path, transform=transform, step_time=args.step_time, batch_size=args.batch_size,
                           quick=args.quick, prove=True)
    expected = EXPECTED[case]
    verdict = report.bottleneck
    right = expected is None or verdict == expected
    print(f"\n## {case}: {path} ({report.target['num_samples']:,} images) in {report.seconds:.0f} s")
    print(f"verdict: {verdict}" + (f" (expected {expected}: {'right' if right else 'WRONG'})" if expected else ""))
    print(f"  {'remedy':60} {'predicted':>9} {'measured':>9} {'ratio':>6}  within {TOLERANCE:.0%}")
    rows = []
    for proof in report.proof or []:
        within = abs(proof.ratio - 1) <= TOLERANCE
        rows.append({**proof.to_dict(), "within": within})
        verdict_mark = "yes" if within else "NO"
        print(f"  {proof.name[:60]:60} {proof.expected:9,.0f} {proof.measured:9,.0f} {proof.ratio:6.2f}  {verdict_mark}")
        print(f"     {proof.setup}")
    for note in report.notes:
        print(f"  note: {note}")
    result = {"case": case, "path": str(path), "verdict": verdict, "expected": expected, "right": right, "proof": rows}
    print("json: " + json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", choices=sorted(EXPECTED))
    parser.add_argument("--data", type=Path, default=Path("bench-data/doctor"))
    parser.add_argument("--path", type=Path, help="the folder of the 'folder' case")
    parser.add_argument("--count", type=int, default=2000, help="sample photos per case (storage: 5x this)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--step-time", type=float, default=0.05, help="the sleep that stands for the GPU's step")
    parser.add_argument("--blur-passes", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="the doctor's --quick budget (a smoke test)")
    args = parser.parse_args()
    header("stoker doctor --prove: predicted against measured")
    args.data.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(args.data.resolve())  # the sample pack on the data's disk
    results = []
    for case in args.cases:
        if case == "folder":
            if args.path is None:
                parser.error("the folder case needs --path")
            path = args.path
        elif case == "storage":
            path = make_sample_photos(args.data / "storage", count=5 * args.count, num_classes=100, progress=True)
        else:
            photos = make_sample_photos(args.data / "photos", count=args.count, num_classes=10, progress=True)
            path = large_photos(photos, args.data / "large") if case == "decode" else photos
        results.append(run_case(case, path, args))
    proofs = [row for result in results for row in result["proof"]]
    print(f"\nverdicts right: {sum(r['right'] for r in results)} of {len(results)}; predictions within {TOLERANCE:.0%}: "
          f"{sum(p['within'] for p in proofs)} of {len(proofs)}")


if __name__ == "__main__":
    main()
