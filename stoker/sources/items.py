"""Map-style Datasets given through the Python API (torchvision's, timm's, a user's own): listed by
index, each item read by ``__getitem__`` in the pack's workers.

A Dataset that lists its image files (torchvision's DatasetFolder and its subclasses: ``samples``
and ``classes``; timm's ImageDataset: ``reader.samples`` and ``reader.class_to_idx``) and reads
them with the usual image loader is listed as those files instead: their bytes are packed as they
are, with the Dataset's labels and class names.

Otherwise an item is ``image``, ``(image, label)`` or a dict holding both (``image`` and ``label`` as
Hugging Face items have them, or the keys the user names). The image may be encoded bytes or a
``{"bytes", "path"}`` dict (kept as they are, or read from the path), a PIL image, or a uint8
array or tensor (HW, HWC or CHW), which are stored as JPEG (quality ``DATASET_JPEG_QUALITY``;
PNG for modes JPEG cannot hold).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from stoker.errors import OptionError, PackError
from stoker.format import NO_LABEL
from stoker.sources.columns import SourceOptions
from stoker.sources.inputs import BadInput, Read, read_regular_file
from stoker.sources.listing import Source, content_digest, make_keys

DATASET_JPEG_QUALITY = 90
IMAGE_KEYS = ("image", "img", "jpg", "png")  # dict items: where the image is (Hugging Face: "image")
LABEL_KEYS = ("label", "labels", "cls")


@dataclass(frozen=True)
class DatasetItems:
    """Items of a map-style Dataset; a ref is the index. ``image_key`` and ``label_key`` name the
    entries of dict items (None: the usual names); with ``unlabelled`` no label is taken. The
    dataset goes to each worker process once (Ray: once into its object store), not with every job."""

    dataset: Any
    image_key: str | None = None
    label_key: str | None = None
    unlabelled: bool = False
    named = False

    def name(self, ref: int) -> str:
        return f"{type(self.dataset).__name__}[{ref}]"

    def read(self, refs: Sequence[int]) -> Iterator[Read]:
        for index in refs:
            try:
                item = self.dataset[index]
            except Exception as e:  # noqa: BLE001 -- the user's __getitem__ may raise anything
                yield BadInput(f"__getitem__ raised {type(e).__name__}: {e}")
                continue
            try:
                image, label = self._image_and_label(item)
                yield encoded(image), None if self.unlabelled else _label(label)
            except BadInput as e:
                yield e
            except (OSError, ValueError, TypeError) as e:  # Pillow refusing to encode what it was given
                yield BadInput(f"cannot encode the image ({type(e).__name__}: {e})")

    def mean_size(self, refs: Sequence[int]) -> float:
        sizes = [len(read[0]) for read in self.read(refs[:: max(1, len(refs) // 32)]) if not isinstance(read, BadInput)]
        return float(np.mean(sizes)) if sizes else 1.0

    def _image_and_label(self, item: Any) -> tuple[Any, Any]:
        if isinstance(item, dict):
            image = _entry(item, self.image_key, IMAGE_KEYS)
            if image is None:
                raise BadInput(f"the item is a dict without an image entry ({self.image_key or ', '.join(IMAGE_KEYS)}); "
                               f"it has {sorted(map(str, item))}")
            return image, _entry(item, self.label_key, LABEL_KEYS)
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise BadInput(f"the item is a {type(item).__name__} of {len(item)}; expected (image, label)")
            return item[0], item[1]
        return item, None


def _entry(item: dict, key: str | None, usual: tuple[str, ...]) -> Any:
    if key is not None:
        return item.get(key)
    return next((item[k] for k in usual if k in item), None)


def encoded(image: Any) -> bytes:
    """The image as encoded bytes: bytes as they are, a ``{"bytes", "path"}`` dict's bytes or its
    file's; PIL images and uint8 arrays/tensors encoded."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, dict):  # a Hugging Face Image(decode=False) value
        if image.get("bytes"):
            return bytes(image["bytes"])
        if image.get("path"):
            return read_regular_file(image["path"])
        raise BadInput("the image is a dict with neither bytes nor a path")
    if not isinstance(image, Image.Image):
        image = Image.fromarray(_hwc_uint8(image))
    out = io.BytesIO()
    if image.mode in ("RGB", "L", "CMYK"):
        image.save(out, format="JPEG", quality=DATASET_JPEG_QUALITY)
    else:
        image.save(out, format="PNG")
    return out.getvalue()


def _hwc_uint8(image: Any) -> np.ndarray:
    array = image.numpy() if hasattr(image, "numpy") else np.asarray(image)
    if array.dtype != np.uint8:
        raise BadInput(f"image array of {array.dtype}: expected uint8 (or PIL images, or encoded bytes)")
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[2] not in (1, 3):
        array = array.transpose(1, 2, 0)  # CHW, as torchvision tensors are
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise BadInput(f"image array of shape {tuple(array.shape)}: expected HW, HWC or CHW with 1 or 3 channels")
    return np.ascontiguousarray(array)


def _label(label: Any) -> int | None:
    if label is None:
        return None
    try:
        return int(label)
    except (TypeError, ValueError):
        raise BadInput(f"label {label!r} is not an integer") from None


def list_dataset(dataset: Any, options: SourceOptions) -> Source:
    """A map-style Dataset's files where it lists them (see :func:`listed_files`), else its indices:
    labels come with the items when they are read, class names from its ``classes`` attribute (as
    torchvision's datasets have). Refused: an empty Dataset, one
    whose items change from one read to the next (a random transform inside ``__getitem__``
    would be packed once, frozen), and one whose items hold no label unless ``options.unlabelled``."""
    options.refuse_except(("image_column", "label_column", "unlabelled"), "a map-style Dataset")
    name = type(dataset).__name__
    count = len(dataset)
    if count == 0:
        raise PackError(f"{name}: the Dataset is empty")
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    if (files := listed_files(dataset)) is not None and not (options.image_column or options.label_column):
        return _file_source(kind, *files, options)
    inputs = DatasetItems(dataset, options.image_column, options.label_column, options.unlabelled)
    missing = _missing_label(dataset, name, options)
    classes = None if options.unlabelled else getattr(dataset, "classes", None)
    _read_twice_alike(inputs)
    identity = [kind, count, content_digest(inputs, count), options.given()]
    return Source("dataset", Path(kind), list(range(count)), [f"{i:09d}" for i in range(count)],
                  np.full(count, NO_LABEL, dtype=np.int64), list(classes) if classes else None,
                  inputs=inputs, identity=identity, missing_labels=missing)


# The image loaders of torchvision's DatasetFolder that open a file as it is (converted to RGB)
_FILE_LOADERS = ("default_loader", "pil_loader", "accimage_loader")
# The __getitem__ of the Datasets whose items are their listed files as they are (module, class)
_FILE_ITEMS = {("torchvision.datasets.folder", "DatasetFolder"), ("timm.data.dataset", "ImageDataset")}


def listed_files(dataset: Any) -> tuple[list[str], list[int], list[str]] | None:
    """(paths, labels, class names) of a Dataset whose items are its listed image files as they are:
    torchvision's DatasetFolder (``samples``, ``classes``, its standard ``loader``) and timm's
    ImageDataset (``reader.samples``, ``reader.class_to_idx``), or a subclass of either that keeps
    their ``__getitem__``, with no transform of any kind; None for any other (its items are read)."""
    if not _items_are_files(dataset):
        return None
    samples, classes = getattr(dataset, "samples", None), getattr(dataset, "classes", None)
    loader = getattr(dataset, "loader", None)
    if samples is None or (loader is not None and getattr(loader, "__name__", "") not in _FILE_LOADERS):
        reader = getattr(dataset, "reader", None)
        samples, to_index = getattr(reader, "samples", None), getattr(reader, "class_to_idx", None)
        classes = sorted(to_index, key=lambda name: to_index[name]) if isinstance(to_index, dict) else None
    if not isinstance(samples, (list, tuple)) or not samples or len(samples) != len(dataset):
        return None
    if not all(isinstance(s, (tuple, list)) and len(s) == 2 and isinstance(s[0], (str, Path)) for s in samples):
        return None
    try:
        labels = [int(label) for _, label in samples]
    except (TypeError, ValueError):
        return None
    return [str(path) for path, _ in samples], labels, list(classes) if classes else []


def _items_are_files(dataset: Any) -> bool:
    """Whether ``dataset``'s items are its files as they are: its ``__getitem__`` is one of
    ``_FILE_ITEMS``' (not a subclass's own) and it has no transform, target_transform or transforms."""
    if any(getattr(dataset, name, None) is not None for name in ("transform", "target_transform", "transforms")):
        return False
    owner = next((cls for cls in type(dataset).__mro__ if "__getitem__" in vars(cls)), None)
    return owner is not None and (owner.__module__, owner.__qualname__) in _FILE_ITEMS


def _file_source(kind: str, paths: list[str], labels: list[int], classes: list[str], options: SourceOptions) -> Source:
    """The Source of a Dataset's listed files: their bytes read as they are; the identity holds the
    paths, labels and each file's size and modification time, so a changed file is packed again."""
    stamps = hashlib.sha256()
    for path in paths:
        try:
            info = os.stat(path)
            stamps.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
        except OSError:  # read, and rejected with its reason, by the pack
            stamps.update(f"{path}\0missing\n".encode())
    count = len(paths)
    values = np.full(count, NO_LABEL, np.int64) if options.unlabelled else np.array(labels, np.int64)
    root = os.path.commonpath(paths) if count > 1 else os.path.dirname(paths[0])
    identity = [kind, count, stamps.hexdigest(), hashlib.sha256(values.tobytes()).hexdigest(), options.given()]
    return Source("dataset_files", Path(kind), paths, make_keys([os.path.relpath(p, root) for p in paths]), values,
                  None if options.unlabelled else (classes or None), identity=identity)


def _missing_label(dataset: Any, name: str, options: SourceOptions) -> str:
    """Why the first item holds no label (else ""); OptionError where the named keys are not its."""
    try:
        item = dataset[0]
    except Exception:  # noqa: BLE001 -- the pack names it among the rejected inputs
        return ""
    if isinstance(item, dict):
        keys = ", ".join(sorted(map(str, item)))
        for option, key in (("image_column", options.image_column), ("label_column", options.label_column)):
            if key is not None and key not in item:
                raise OptionError(f"{option}={key!r} (--{option.replace('_', '-')}): {name}'s items have no key "
                                  f"{key!r}; their keys: {keys}")
        if options.unlabelled or options.label_column or any(k in item for k in LABEL_KEYS):
            return ""
        return (f"its items are dicts without a label key ({', '.join(LABEL_KEYS)}); their keys: {keys}; name it "
                "with --label-column (label_column=)")
    given = options.image_column or options.label_column
    if given:
        raise OptionError(f"image_column and label_column (--image-column, --label-column) name the keys of dict "
                          f"items; {name}'s items are not dicts but {type(item).__name__}")
    if options.unlabelled or (isinstance(item, (tuple, list)) and len(item) == 2):
        return ""
    return f"its items ({type(item).__name__}) hold no label (expected (image, label) or a dict with a label)"


def _read_twice_alike(inputs: DatasetItems) -> None:
    """Refuse a Dataset whose item 0 differs from one read to the next: a random transform inside
    ``__getitem__`` would be packed once, frozen."""
    first, again = inputs.read([0, 0])
    if not isinstance(first, BadInput) and not isinstance(again, BadInput) and first != again:
        raise PackError(f"{inputs.name(0)}: the item differs from one read to the next (a random transform inside "
                        "__getitem__?); stoker packs each item once: give the Dataset without its random transforms "
                        "and apply them when reading (stoker.loader_for(..., transform=T) or ShardDataset(transform=T))")
