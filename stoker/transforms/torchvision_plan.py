"""A torchvision transform pipeline (v1 or v2) read as the parts stoker.Loader makes faster.

    Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(.4, .4, .4), ToTensor(), Normalize(m, s)])
      leading geometry          -> CropSpec: each JPEG decoded at a reduced DCT scale, cropped, resized, flipped
      recognised ops after it   -> stoker.augment ops, parameters drawn once per batch
      from the first op that is not recognised (or whose settings are not) to the end
                                -> per sample, exactly as given, on what it would get from ImageFolder

:func:`plan_transform` is pure: it reads only the transforms' class names, modules, class
hierarchy and attributes (kinds.py: torchvision's classes, subclasses that keep their
behaviour, timm's equivalents), so nothing here imports torchvision or timm (a user who passes
none need not have them). Results are what the pipeline gives through a DataLoader over
ImageFolder: same dtype, range, shape and normalisation; random ops drawn from the same ranges
with the same structure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

from stoker.decode.crops import RESAMPLE_FILTERS, CropSpec, Interpolation
from stoker.errors import OptionError
from stoker.transforms.batched_ops import BatchedOps, Stage
from stoker.transforms.kinds import describe, flatten, interpolations, kind_name, kind_of, pair, two

Given = Literal["pil", "tensor", "tv_image"]  # what the per-sample part is handed


@dataclass(frozen=True)
class Step:
    """What became of one transform of the pipeline: ``where`` it runs and why."""

    transform: str
    where: Literal["decode", "batch", "per sample"]
    why: str


@dataclass(frozen=True)
class TransformPlan:
    """The pipeline split into the fused crop (None: whole images, everything per sample), the
    batched ``ops`` (stoker.augment), and the ``per_sample`` rest (run as given, handed ``given``);
    ``stage`` is what the image is after the ops (``uint8``: rounded back from the augmentation);
    ``dtype`` the batch's dtype."""

    crop: CropSpec | None
    ops: tuple = ()
    stage: Stage = "uint8"
    dtype: torch.dtype = torch.uint8
    per_sample: tuple[Callable, ...] = ()
    given: Given = "tensor"
    steps: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()

    def explain(self, batched_where: str) -> str:
        """What runs where and why, a section per place; ``batched_where``: where the batched ops run."""
        sections = (("decode", f"fused into the decode: {self.crop}" if self.crop else "fused into the decode"),
                    ("batch", f"batched: {batched_where}"), ("per sample", "per sample, as given"))
        lines = []
        for where, title in sections:
            steps = [step for step in self.steps if step.where == where]
            lines.append(f"  {title}:" + ("" if steps else " nothing"))
            lines += [f"    {step.transform}: {step.why}" for step in steps]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append("  output: the per-sample results, stacked" if self.per_sample else
                     f"  output: {self.dtype} (B, 3, H, W), channels_last memory")
        return "\n".join(lines)


@dataclass(frozen=True)
class PerSample:
    """The per-sample part of a pipeline: ``transforms`` in order, on what they would get through a
    DataLoader over ImageFolder (``given``: a PIL image, a tensor, or a v2 tensor image), so each
    runs exactly as given. Picklable (worker processes) when the transforms are."""

    transforms: tuple[Callable, ...]
    given: Given

    def __call__(self, image: Any) -> torch.Tensor:
        """Run the transforms on ``image``: a (3, H, W) tensor (a view into the batch) or a PIL image."""
        if isinstance(image, torch.Tensor) and self.given == "pil":
            from PIL import Image

            image = Image.fromarray(image.movedim(-3, -1).numpy())
        elif isinstance(image, torch.Tensor) and self.given == "tv_image":
            from torchvision import tv_tensors  # a v2 pipeline: torchvision is there

            image = tv_tensors.Image(image)
        for transform in self.transforms:
            image = transform(image)
        if isinstance(image, np.ndarray):  # timm's ToNumpy: the DataLoader's collate makes it a tensor
            image = torch.from_numpy(image)
        if not isinstance(image, torch.Tensor):
            raise TypeError(f"the transform gave {type(image).__name__}, not a tensor; a batch is made of tensors "
                            "(end the pipeline with ToTensor() or PILToTensor())")
        return image


def is_torchvision(transform: Any) -> bool:
    """A transform of torchvision (v1 or v2) or one that is a torchvision op (kinds.py:
    a subclass that keeps its behaviour, timm's equivalents), or a torch Sequential of them."""
    return kind_name(transform) is not None or (
        isinstance(transform, torch.nn.Sequential) and any(is_torchvision(t) for t in transform))


def plan(transform: Any, crop: CropSpec | None) -> TransformPlan:
    """What the Loader does with ``transform`` (None, a torchvision pipeline, or any callable)
    and its own ``crop`` (None: the default, or the pipeline's)."""
    if transform is None:
        return TransformPlan(crop or CropSpec())
    if is_torchvision(transform):
        return plan_transform(transform, crop)
    why = "not a torchvision transform: it gets each (3, H, W) uint8 crop, as given"
    return TransformPlan(crop or CropSpec(), per_sample=(transform,), given="tensor",
                         steps=(Step(describe(transform), "per sample", why),))


def plan_transform(transform: Any, crop: CropSpec | None) -> TransformPlan:
    """Split a torchvision ``transform`` into crop, batched ops and per-sample rest. ``crop``: the
    Loader's own CropSpec, if given; then the pipeline must not crop too. ValueError names what
    cannot be honoured."""
    transforms = flatten(transform)
    lead, fused_crop, steps = _leading_geometry(transforms)
    if fused_crop is not None and crop is not None:
        raise OptionError(f"the crop is given twice: as Loader(crop={crop}) and as {describe(transforms[0])} in the "
                         "transform; give one of them")
    crop = crop or fused_crop
    if crop is None:
        why = ("the pipeline does not start with a crop stoker can fuse (RandomResizedCrop or timm's "
               "RandomResizedCropAndInterpolation, Resize(short side) + CenterCrop, Resize((h, w)); not timm's "
               "ResizeKeepRatio, which rounds differently): each image is decoded whole and the pipeline runs on it as given")
        return TransformPlan(None, per_sample=tuple(transforms), given="pil",
                             steps=tuple(Step(describe(t), "per sample", why) for t in transforms))
    middle = BatchedOps()
    position = lead
    while position < len(transforms) and middle.add(transforms[position], last=position == len(transforms) - 1):
        position += 1
    steps += [_step(t, "batch", why) for t, why in middle.taken]
    rest = tuple(transforms[position:])
    if rest:
        steps.append(Step(describe(rest[0]), "per sample", middle.stop_reason))
        steps += [Step(describe(t), "per sample", "after a transform that runs per sample, all do, in order")
                  for t in rest[1:]]
        if middle.ops and middle.stage == "pil":
            middle.notes.append("the batched ops' results are rounded to uint8 and handed on as PIL images")
        given: Given = "pil" if middle.stage == "pil" else "tv_image" if middle.tv_image else "tensor"
        stage: Stage = "uint8" if middle.stage == "pil" else middle.stage
        return TransformPlan(crop, tuple(middle.ops), stage, middle.dtype, rest, given, tuple(steps), tuple(middle.notes))
    if middle.stage == "pil":
        raise OptionError("the transform ends with PIL images, which a DataLoader cannot batch either: end it with "
                         "PILToTensor() (uint8) or ToTensor() (float in [0, 1])")
    return TransformPlan(crop, tuple(middle.ops), middle.stage, middle.dtype, (), "tensor", tuple(steps),
                         tuple(middle.notes))


def _step(transform: Any, where: Literal["decode", "batch", "per sample"], why: str) -> Step:
    """``transform``'s step, its ``why`` led by how it was recognised where it is not torchvision's own."""
    kind = kind_of(transform)
    return Step(describe(transform), where, f"{kind.why}; {why}" if kind and kind.why else why)


def _leading_geometry(transforms: list[Any]) -> tuple[int, CropSpec | None, list[Step]]:
    """How many leading transforms make the crop, the CropSpec, and their steps. Recognised:
    flips around one of RandomResizedCrop, Resize(short side) + CenterCrop, Resize((h, w))."""
    flip, spec, short, used, steps = 0.0, None, None, 0, []
    resample: Interpolation = "bilinear"  # the filter of the Resize before a CenterCrop
    for position, t in enumerate(transforms):
        kind = kind_name(t)
        if kind == "RandomHorizontalFlip":
            flip = flip + t.p - 2 * flip * t.p  # flipped in the end: exactly one of the flips happened
            why = f"a flip drawn per image with p={t.p}"
        elif kind == "RandomResizedCrop" and spec is None and short is None:
            spec = CropSpec("random_resized", pair(t.size) or (int(t.size), int(t.size)), two(t.scale), two(t.ratio))
            why = _resampling_note(t)
        elif kind == "Resize" and spec is None and short is None and getattr(t, "max_size", None) is None:
            resample = _pillow_filter(t)
            if pair(t.size) is None:
                short = int(t.size if isinstance(t.size, int) else list(t.size)[0])
            else:
                spec = CropSpec("resize", pair(t.size) or (0, 0), exact=True, interpolation=resample)
            why = _resampling_note(t)
        elif kind == "CenterCrop" and short is not None and spec is None:
            size = pair(t.size) or (int(t.size), int(t.size))
            if min(size) > short:
                break  # larger than the resized image both ways: not fused
            spec = CropSpec("center", size, center_fraction=min(size) / short, exact=True, interpolation=resample)
            why = "the central crop of the resized image" + (
                "; padded with zeros where the resized image is smaller, as CenterCrop pads" if max(size) > short else "")
        else:
            break
        steps.append(_step(t, "decode", why))
        used = position + 1
    if spec is None:  # no crop, or a Resize(short side) alone: images of different sizes
        return 0, None, []
    return used, replace(spec, flip=True if flip == 0.5 else flip), steps


def _pillow_filter(resize: Any) -> Interpolation:
    """The Pillow filter the exact path resizes with for ``resize``: its own, or bilinear for one
    Pillow's resample has not (nearest)."""
    return next((m for m in RESAMPLE_FILTERS if m in interpolations(resize)), "bilinear")


def _resampling_note(transform: Any) -> str:
    modes = interpolations(transform)
    if kind_name(transform) == "Resize":
        mode = _pillow_filter(transform)
        how = f"decoded whole, resized with Pillow's antialiased {mode} filter and cropped, as torchvision's PIL path"
    else:
        mode = "bilinear"
        how = ("decoded at the smallest JPEG DCT scale the crop allows, then resized bilinearly "
               "(an axis shrinking 2x or more halved first)")
    if len(modes) > 1:
        how += f"; {' or '.join(modes)} drawn per image (timm's 'random') is approximated by {mode} for every image"
    elif modes[0] != mode:
        how += f"; {modes[0]} interpolation is approximated by that"
    if getattr(transform, "antialias", True) is False:
        how += "; antialias=False does not apply (ImageFolder's PIL images are always resized with antialiasing)"
    return how
