"""One Loader configuration of bench/autotune.py, run in a fresh process (imports, the Loader's
threads and caches start from nothing, as in a training script), reported as one JSON line.

    python -m stoker.bench.autotune_run '{"data": "bench-data/...", "loader": {"threads": 3}, ...}'

The spec (:class:`Spec`) names the data set (a folder or a URL with its storage options and
ShardDataset arguments), the Loader's arguments, the pipeline (the Loader's default crop, or the
standard train Compose) and how long to read. The Loader reads pass after pass until ``seconds``
have passed and :data:`WARM_BATCHES` batches came after the warm-up (a busy machine's slow start
still leaves a warm rate); the JSON line gives the seconds from the data set's opening to the first batch, the
img/s of the batches after ``warm_after`` seconds, and what the Loader ran with at the end (and
how many decisions its tuner made).
With ``hog_at``, another process spins on one core from that many seconds on.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from stoker.data.dataset import ShardDataset
from stoker.loader import Loader

# The fewest batches a run reads after its warm-up, whatever its seconds.
WARM_BATCHES = 3


@dataclass(frozen=True)
class Spec:
    """What one run reads, with which Loader, for how long (seconds from the data set's opening)."""

    data: str
    loader: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] = field(default_factory=dict)
    storage_options: dict[str, Any] | None = None
    pipeline: str | None = None  # "train": the standard train Compose as the Loader's transform
    batch: int = 256
    seconds: float = 10.0
    warm_after: float = 5.0
    hog_at: float | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def warm_batches(ends: list[tuple[float, int]], warm_after: float) -> tuple[float, list[tuple[float, int]]]:
    """Where the warm part of a run starts (the end of the last batch by ``warm_after`` seconds, or
    of the first batch, where that came later) and the batches after it; ``ends``: (seconds,
    images) of each batch, in order."""
    anchor = max([t for t, _ in ends if t <= warm_after] or [ends[0][0]])
    return anchor, [(t, n) for t, n in ends if t > anchor]


def warm_rate(ends: list[tuple[float, int]], warm_after: float) -> float:
    """Images/s of the batches after the warm-up (:func:`warm_batches`); NaN where none came."""
    anchor, after = warm_batches(ends, warm_after)
    return sum(n for _, n in after) / (after[-1][0] - anchor) if after else float("nan")


def done(ends: list[tuple[float, int]], spec: Spec) -> bool:
    """Whether a run has read long enough: ``spec.seconds``, and :data:`WARM_BATCHES` batches after its warm-up."""
    return bool(ends) and ends[-1][0] >= spec.seconds and len(warm_batches(ends, spec.warm_after)[1]) >= WARM_BATCHES


def ran_with(loader: Loader) -> dict[str, Any]:
    """What the Loader ran its batches with at the end (the tuner's last decision, else its fixed
    workers and batches ahead), and how many decisions its tuner made (the latest ones kept)."""
    if loader.decisions:
        return {"ran_with": loader.decisions[-1].settings.describe(), "decisions": len(loader.decisions)}
    return {"ran_with": f"{loader.workers.describe()}, prefetch {loader.prefetch}", "decisions": 0}


def run(spec: Spec) -> dict[str, Any]:
    """Read as the spec says; the figures of :mod:`stoker.bench.autotune_run`'s JSON line."""
    transform = None
    if spec.pipeline is not None:
        from stoker.bench.pipelines import pipeline

        transform = pipeline(spec.pipeline, 224)
    hog = None
    start = time.perf_counter()
    dataset = ShardDataset(spec.data, storage_options=spec.storage_options, **spec.dataset)
    loader = Loader(dataset, spec.batch, transform=transform, seed=0, **spec.loader)
    ends: list[tuple[float, int]] = []
    try:
        while not done(ends, spec):
            for _, labels in loader:
                now = time.perf_counter() - start
                ends.append((now, len(labels)))
                if hog is None and spec.hog_at is not None and now >= spec.hog_at:
                    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                if done(ends, spec):
                    break
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return {"first_batch_s": ends[0][0], "warm_images_per_s": warm_rate(ends, spec.warm_after),
            "images": sum(n for _, n in ends), "seconds": ends[-1][0], **ran_with(loader)}


def main() -> None:
    print(json.dumps(run(Spec(**json.loads(sys.argv[1])))), flush=True)


if __name__ == "__main__":
    main()
