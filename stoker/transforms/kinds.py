"""Reading a transform without importing torchvision or timm: which torchvision op it is (by its
class alone), and its attributes as plain values.

    torchvision's own classes (v1 and v2)        -> their name, by their module
    a subclass of one that changes no behaviour  -> its torchvision base (it defines nothing but
                                                    ``__init__`` and ``__repr__``: the base's
                                                    methods run on the attributes the plan reads)
    timm's transforms that are a torchvision op  -> that op, by their name (below); tests/test_timm.py
                                                    checks each against torchvision pixel for pixel

A user's subclass that overrides a method, or any other class, is not recognised: the plan runs it
per sample, exactly as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_TORCHVISION = "torchvision.transforms"
_TIMM = "timm.data"
# What a subclass may define and still behave as its torchvision base.
_NO_BEHAVIOUR = frozenset({"__init__", "__repr__", "extra_repr", "__module__", "__qualname__", "__doc__", "__dict__",
                           "__weakref__", "__annotations__", "__firstlineno__", "__static_attributes__",
                           "__orig_bases__", "__parameters__", "__slots__"})


@dataclass(frozen=True)
class Kind:
    """The op ``name`` a transform is (a torchvision class name, or ToNumpy / ToUnscaledTensor for
    timm's conversions that torchvision has no class for); ``why``: how that was decided, where the
    transform is not torchvision's own class ("" for those)."""

    name: str
    why: str = ""


# timm's transforms whose behaviour on the PIL images a pipeline's crop hands them is an op's, by name
_TIMM_KINDS = {
    "RandomResizedCropAndInterpolation": Kind("RandomResizedCrop", "timm's RandomResizedCropAndInterpolation: "
                                              "torchvision's box rule (10 tries, the same fallback) and F.resized_crop"),
    "MaybeToTensor": Kind("ToTensor", "timm's MaybeToTensor: ToTensor on PIL images"),
    "MaybePILToTensor": Kind("PILToTensor", "timm's MaybePILToTensor: PILToTensor on PIL images"),
    "ToNumpy": Kind("ToNumpy", "timm's ToNumpy: uint8 (3, H, W) arrays, which a DataLoader's collate stacks into a "
                               "uint8 tensor batch"),
    "ToTensor": Kind("ToUnscaledTensor", "timm's ToTensor: PILToTensor, then a cast keeping 0..255"),
}


def _timm_kind(transform: Any) -> Kind | None:
    name = type(transform).__name__
    fill = getattr(transform, "fill", None)
    if name == "CenterCropOrPad" and transform.padding_mode == "constant" and not any(
            fill if isinstance(fill, list | tuple) else [fill]):
        return Kind("CenterCrop", "timm's CenterCropOrPad with zero padding: CenterCrop")
    return _TIMM_KINDS.get(name)


def kind_of(transform: Any) -> Kind | None:
    """The torchvision op ``transform`` is, or None where it is none that stoker can tell."""
    cls = type(transform)
    if cls.__module__.startswith(_TORCHVISION):
        return Kind(cls.__name__)
    if cls.__module__.startswith(_TIMM) and (timm := _timm_kind(transform)) is not None:
        return timm
    for depth, base in enumerate(cls.__mro__):
        if base.__module__.startswith(_TORCHVISION):
            own = {name for c in cls.__mro__[:depth] for name in vars(c)} - _NO_BEHAVIOUR
            if own:
                return None
            return Kind(base.__name__, f"{cls.__name__}: a subclass of torchvision's {base.__name__} that changes "
                                       "none of its methods")
    return None


def kind_name(transform: Any) -> str | None:
    """The name of the torchvision op ``transform`` is, None for anything else."""
    kind = kind_of(transform)
    return kind.name if kind else None


def flatten(transform: Any) -> list[Any]:
    """The pipeline as a flat list: Compose and Sequential opened, recursively."""
    if kind_name(transform) == "Compose" or isinstance(transform, torch.nn.Sequential):
        inner = transform.transforms if kind_name(transform) == "Compose" else list(transform)
        return [t for part in inner for t in flatten(part)]
    return [transform]


def describe(transform: Any) -> str:
    """The transform as explain() names it: its repr, cut at 120 characters."""
    text = repr(transform)
    return text if len(text) <= 120 else text[:117] + "..."


def pair(size: Any) -> tuple[int, int] | None:
    """(h, w) of a torchvision size, None for a single number (a short side)."""
    if isinstance(size, int):
        return None
    size = list(size)
    return None if len(size) == 1 else (int(size[0]), int(size[1]))


def two(values: Any) -> tuple[float, float]:
    """A torchvision (low, high) range, list or tuple, as two floats."""
    low, high = values
    return float(low), float(high)


def interpolations(transform: Any) -> tuple[str, ...]:
    """The transform's interpolation, lower case: one mode, or timm's pair drawn per image ('random')."""
    mode = getattr(transform, "interpolation", "bilinear")
    return tuple(str(getattr(m, "value", m)).lower() for m in (mode if isinstance(mode, list | tuple) else [mode]))
