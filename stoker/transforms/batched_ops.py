"""The transforms after a pipeline's crop that stoker.augment runs batched, translated into its ops.

Each recognised transform (kinds.py) has a method named after it that returns the
stoker.augment op (or None: a conversion that changes only the stage and dtype) and why, or the
reason it is not fused; the first transform not taken, and all after it, run per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, cast

import torch

import stoker.augment as A
from stoker.transforms.kinds import flatten, interpolations, kind_name, two

Stage = Literal["pil", "uint8", "float"]  # what the image is at a point of the pipeline
_GEOMETRIC = ("RandomHorizontalFlip", "RandomVerticalFlip", "RandomRotation", "RandomAffine")
_WITH_PROBABILITY = ("ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", *_GEOMETRIC)
_INTERPOLATIONS = ("bilinear", "nearest")


class BatchedOps:
    """The ops after the crop, added one by one while stoker.augment can run them: ``ops``, what
    the image is after them (``stage``, ``dtype``), and what became of each transform taken (``taken``:
    (transform, why)) or why the first one left was not (``stop_reason``)."""

    def __init__(self) -> None:
        self.ops: list = []
        self.taken: list[tuple[Any, str]] = []
        self.notes: list[str] = []
        self.stage: Stage = "pil"
        self.dtype = torch.uint8
        self.tv_image = False  # a v2 ToImage ran: the per-sample rest gets tv_tensors.Image
        self.stop_reason = ""
        self._last = False  # the transform being added is the pipeline's last

    def add(self, t: Any, last: bool) -> bool:
        """Take ``t`` (``last``: the pipeline's last transform) into the batched part, or say (False,
        ``stop_reason``) why not."""
        kind = kind_name(t)
        if kind is None:
            return self._stop("not a torchvision op stoker can tell (a class of its own, or a subclass that overrides "
                              "a method): run as given")
        self._last = last
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            return self._stop(f"{kind} has no batched counterpart in stoker.augment")
        if kind in _GEOMETRIC and any(_photometric(op) for op in self.ops):
            return self._stop("a geometric op after a photometric one is not fused (the one sampling pass comes first)")
        result = handler(t)
        if isinstance(result, str):
            return self._stop(result)
        op, why = result
        self.taken.append((t, why))
        if op is not None:
            self.ops.append(op)
        return True

    def _stop(self, reason: str) -> bool:
        self.stop_reason = reason
        return False

    # converting ops: they change the stage and the dtype
    def _ToTensor(self, t: Any) -> tuple[None, str] | str:
        if self.stage != "pil":
            return "ToTensor takes PIL images (it fails on tensors, as it would in the DataLoader)"
        self.stage, self.dtype = "float", torch.float32
        return None, "uint8 -> float32 in [0, 1]"

    def _PILToTensor(self, t: Any) -> tuple[None, str] | str:
        if self.stage != "pil":
            return "PILToTensor takes PIL images"
        self.stage = "uint8"
        return None, "uint8 (3, H, W)"

    def _ToUnscaledTensor(self, t: Any) -> tuple[None, str] | str:
        if self.stage != "pil" or t.dtype != torch.uint8:
            return f"PIL images to {t.dtype} values in 0..255: not fused"
        self.stage = "uint8"
        return None, "uint8 (3, H, W)"

    def _ToNumpy(self, t: Any) -> tuple[None, str] | str:
        if self.stage != "pil" or not self._last:
            return "ToNumpy is fused only at the end of the pipeline, after the PIL images"
        self.stage = "uint8"
        return None, "uint8 (3, H, W): the batch a DataLoader's collate stacks"

    def _ToImage(self, t: Any) -> tuple[None, str]:
        self.stage, self.tv_image = ("uint8" if self.stage == "pil" else self.stage), True
        return None, "a tensor image, dtype kept"

    def _ToPureTensor(self, t: Any) -> tuple[None, str]:
        self.tv_image = False
        return None, "no change to the pixels"

    def _ToDtype(self, t: Any) -> tuple[None, str] | str:
        if isinstance(t.dtype, dict):
            return "ToDtype with a dtype per type is not fused"
        if self.stage == "pil" and ".v2" not in type(t).__module__:
            return "ConvertImageDtype takes tensors (it fails on PIL images, as it would in the DataLoader)"
        if self.stage == "pil":
            return None, "no change: v2 passes PIL images through"
        if not t.dtype.is_floating_point:
            return "ToDtype to an integer dtype is not fused"
        if self.stage == "uint8" and not getattr(t, "scale", True):
            return "ToDtype(scale=False) keeps 0..255 values; not fused"
        self.stage, self.dtype = "float", t.dtype
        return None, f"-> {t.dtype} in [0, 1]"

    _ConvertImageDtype = _ToDtype  # scale=True always

    def _Normalize(self, t: Any) -> tuple[A.Normalize, str] | str:
        if self.stage != "float":
            return "Normalize takes float tensors"
        return A.Normalize(tuple(map(float, t.mean)), tuple(map(float, t.std))), "per channel, as given"

    # random ops: the same ranges, drawn per sample from the batch's own numbers
    def _ColorJitter(self, t: Any) -> tuple[A.ColorJitter, str]:
        ranges: dict[str, Any] = {name: two(getattr(t, name)) if getattr(t, name) is not None else 0.0
                                  for name in ("brightness", "contrast", "saturation", "hue")}
        return A.ColorJitter(**ranges), "same factor ranges, a random order of the four per sample as torchvision"

    def _RandomGrayscale(self, t: Any) -> tuple[A.Grayscale, str]:
        return A.Grayscale(p=float(t.p)), "luma in all three channels, per sample"

    def _Grayscale(self, t: Any) -> tuple[A.Grayscale, str] | str:
        if t.num_output_channels != 3:
            return "Grayscale(num_output_channels=1) changes the channel count: not fused"
        return A.Grayscale(p=1.0), "luma in all three channels"

    def _GaussianBlur(self, t: Any) -> tuple[A.GaussianBlur, str] | str:
        kx, ky = (t.kernel_size, t.kernel_size) if isinstance(t.kernel_size, int) else t.kernel_size
        if kx != ky:
            return "a non-square blur kernel is not fused"
        sigma = two(t.sigma) if isinstance(t.sigma, Sequence) else (float(t.sigma), float(t.sigma))
        return A.GaussianBlur(int(kx), sigma, p=1.0), f"kernel {kx}, sigma drawn in {sigma} per sample, reflected borders"

    def _RandomHorizontalFlip(self, t: Any) -> tuple[A.HorizontalFlip, str]:
        return A.HorizontalFlip(p=float(t.p)), "per sample"

    def _RandomVerticalFlip(self, t: Any) -> tuple[A.VerticalFlip, str]:
        return A.VerticalFlip(p=float(t.p)), "per sample"

    def _RandomRotation(self, t: Any) -> tuple[A.Affine, str] | str:
        if t.expand:
            return "RandomRotation(expand=True) gives each image its own size: not fused"
        return self._affine(t, degrees=tuple(map(float, t.degrees)))

    def _RandomAffine(self, t: Any) -> tuple[A.Affine, str] | str:
        low, high = map(float, t.degrees)
        shear = tuple(map(float, t.shear)) if t.shear is not None else 0.0
        return self._affine(t, degrees=(-high, -low),  # F.affine's angle is clockwise, RandomRotation's is not
                            translate=tuple(map(float, t.translate)) if t.translate is not None else None,
                            scale=tuple(map(float, t.scale)) if t.scale is not None else None, shear=shear)

    def _affine(self, t: Any, **params: Any) -> tuple[A.Affine, str] | str:
        mode = interpolations(t)[0]
        if mode not in _INTERPOLATIONS:
            return f"{mode} interpolation is not fused (stoker.augment samples bilinear or nearest)"
        if isinstance(t.fill, dict):
            return "a fill per type is not fused"
        unit = 255.0 if self.stage != "float" else 1.0  # PIL and uint8 fills are in 0..255
        fill = tuple(float(v) / unit for v in t.fill) if isinstance(t.fill, Sequence) else float(t.fill or 0) / unit
        center = two(t.center) if t.center is not None else None
        return A.Affine(**params, center=center, interpolation=cast(Literal["bilinear", "nearest"], mode), fill=fill), \
            f"same ranges, {mode}, fill {t.fill}, centre {'the image centre' if center is None else center}"

    def _RandomApply(self, t: Any) -> tuple[Any, str] | str:
        inner = [part for given in t.transforms for part in flatten(given)]
        kind = kind_name(inner[0]) if len(inner) == 1 else None
        result = getattr(self, f"_{kind}")(inner[0]) if kind in _WITH_PROBABILITY else None
        if result is None or isinstance(result, str):
            return "RandomApply is fused only around one op that has a probability in stoker.augment"
        op, why = result
        return replace(op, p=op.p * float(t.p)), f"{why}; applied with probability {t.p}"


def _photometric(op: Any) -> bool:
    """Whether ``op`` changes colours (those come after the one geometric sampling pass)."""
    return isinstance(op, A.ColorJitter | A.Grayscale | A.GaussianBlur | A.Normalize)
