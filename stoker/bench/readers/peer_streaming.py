"""Peer reader: MosaicML Streaming 0.13.0 (venv bench-envs/streaming, made by bench/peer-envs.sh).

prepare: ``MDSWriter`` (no compression, default 64 MB shards) with columns ``jpeg: bytes`` (the
original file bytes) and ``label: int``, in folder order (Streaming shuffles at read time).

run: the documented local setup: ``StreamingDataset(local=..., shuffle=True, batch_size=--batch)``
with its defaults (``py1e`` shuffle, ``random`` batching), subclassed so that ``__getitem__``
decodes with Pillow and does RandomResizedCrop + horizontal flip (``_pillow_crop``, torchvision's
algorithm and defaults, as the DataLoader baselines run it) to uint8 HWC, read by
``StreamingDataLoader`` with ``--workers`` processes. Output: uint8 (B, size, size, 3) tensors and
int64 labels. The order is the same in every run (Streaming's default ``shuffle_seed``).

``import streaming`` imports torchvision (``streaming.vision``), which this venv must not have (it
would pull a CUDA torch), and transformers (``streaming.text``, ``StreamingDataLoader``), a large
install: neither is used here, so stub modules stand in for the names it imports.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import _epochs
import numpy as np
from _pillow_crop import random_resized_crop_of


def stub_imports() -> None:
    """``import streaming`` imports torchvision (for ``streaming.vision``) and transformers (for
    ``streaming.text`` and two ``isinstance`` checks in ``StreamingDataLoader``), neither used by this
    reader: stand-ins for what it names."""
    names = {"torchvision.datasets": "VisionDataset", "torchvision.transforms.functional": "to_tensor",
             "transformers.feature_extraction_utils": "BatchFeature", "transformers.tokenization_utils_base": "BatchEncoding",
             "transformers.models.auto.tokenization_auto": "AutoTokenizer"}
    missing = {module.split(".")[0] for module in names if importlib.util.find_spec(module.split(".")[0]) is None}
    for module, attribute in names.items():
        parts = module.split(".")
        if parts[0] not in missing:
            continue
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
                sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        setattr(sys.modules[module], attribute, type(attribute, (), {}))


stub_imports()
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402


class CroppedDataset(StreamingDataset):
    def __init__(self, *, size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crop_size = size

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        sample = super().__getitem__(index)
        return random_resized_crop_of(sample["jpeg"], self.crop_size), int(sample["label"])


def main() -> None:
    args = _epochs.parse_args(__doc__.splitlines()[0])
    if args.action == "prepare":
        if (args.work / "index.json").exists():
            return
        paths, labels = _epochs.image_folder(args.photos)
        with MDSWriter(out=str(args.work), columns={"jpeg": "bytes", "label": "int"}, exist_ok=True) as writer:
            for path, label in zip(paths, labels):
                writer.write({"jpeg": path.read_bytes(), "label": label})
        return
    clean_stale_shared_memory()
    loader: StreamingDataLoader | None = None

    def make_epoch(epoch: int) -> Iterator[Any]:
        nonlocal loader
        if loader is None:  # built inside the first epoch's timing, as the other readers
            dataset = CroppedDataset(size=args.size, local=str(args.work), shuffle=True, batch_size=args.batch)
            loader = StreamingDataLoader(dataset, batch_size=args.batch, num_workers=args.workers, drop_last=False)
        yield from loader  # every pass over the loader is Streaming's next epoch

    _epochs.report_epochs(make_epoch, args)


if __name__ == "__main__":
    main()
