"""A torchvision transform pipeline (v1 or v2) read as the parts stoker.Loader makes faster.

    Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(.4, .4, .4), ToTensor(), Normalize(m, s)])
      leading geometry          -> CropSpec: each JPEG decoded at a reduced DCT scale, cropped, resized, flipped
      recognised ops after it   -> stoker.augment ops, parameters drawn once per batch
      from the first op that is not recognised (or whose settings are not) to the end
                                -> per sample, exactly as given, on what it would get from ImageFolder

:func:`plan_transform` is pure: it reads only the transforms' class names, modules and
attributes, so nothing here imports torchvision (a user who passes none need not have it).
Results are what the pipeline gives through a DataLoader over ImageFolder: same dtype, range,
shape and normalisation; random ops drawn from the same ranges with the same structure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import torch

import stoker.augment as A
from stoker.loader.crops import CropSpec

Stage = Literal["pil", "uint8", "float"]  # what the image is at a point of the pipeline
Given = Literal["pil", "tensor", "tv_image"]  # what the per-sample part is handed
_GEOMETRIC = ("RandomHorizontalFlip", "RandomVerticalFlip", "RandomRotation", "RandomAffine")
_WITH_PROBABILITY = ("ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", *_GEOMETRIC)
_INTERPOLATIONS = ("bilinear", "nearest")


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
        if not isinstance(image, torch.Tensor):
            raise TypeError(f"the transform gave {type(image).__name__}, not a tensor; a batch is made of tensors "
                            "(end the pipeline with ToTensor() or PILToTensor())")
        return image


def is_torchvision(transform: Any) -> bool:
    """A transform of torchvision (v1 or v2), or a torch Sequential of them, known by its class's module."""
    return _kind(transform) is not None or (
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
                         steps=(Step(_name(transform), "per sample", why),))


def plan_transform(transform: Any, crop: CropSpec | None) -> TransformPlan:
    """Split a torchvision ``transform`` into crop, batched ops and per-sample rest. ``crop``: the
    Loader's own CropSpec, if given; then the pipeline must not crop too. ValueError names what
    cannot be honoured."""
    transforms = _flatten(transform)
    lead, fused_crop, steps = _leading_geometry(transforms)
    if fused_crop is not None and crop is not None:
        raise ValueError(f"the crop is given twice: as Loader(crop={crop}) and as {_name(transforms[0])} in the "
                         "transform; give one of them")
    crop = crop or fused_crop
    if crop is None:
        why = ("the pipeline does not start with a crop stoker can fuse (RandomResizedCrop, Resize(short side) + "
               "CenterCrop, Resize((h, w))): each image is decoded whole and the pipeline runs on it as given")
        return TransformPlan(None, per_sample=tuple(transforms), given="pil",
                             steps=tuple(Step(_name(t), "per sample", why) for t in transforms))
    middle = _Middle()
    position = lead
    while position < len(transforms) and middle.add(transforms[position]):
        position += 1
    steps += middle.steps
    rest = tuple(transforms[position:])
    if rest:
        steps.append(Step(_name(rest[0]), "per sample", middle.stop_reason))
        steps += [Step(_name(t), "per sample", "after a transform that runs per sample, all do, in order")
                  for t in rest[1:]]
        if middle.ops and middle.stage == "pil":
            middle.notes.append("the batched ops' results are rounded to uint8 and handed on as PIL images")
        given: Given = "pil" if middle.stage == "pil" else "tv_image" if middle.tv_image else "tensor"
        stage: Stage = "uint8" if middle.stage == "pil" else middle.stage
        return TransformPlan(crop, tuple(middle.ops), stage, middle.dtype, rest, given, tuple(steps), tuple(middle.notes))
    if middle.stage == "pil":
        raise ValueError("the transform ends with PIL images, which a DataLoader cannot batch either: end it with "
                         "PILToTensor() (uint8) or ToTensor() (float in [0, 1])")
    return TransformPlan(crop, tuple(middle.ops), middle.stage, middle.dtype, (), "tensor", tuple(steps),
                         tuple(middle.notes))


def _flatten(transform: Any) -> list[Any]:
    """The pipeline as a flat list: Compose and Sequential opened, recursively."""
    if _kind(transform) == "Compose" or isinstance(transform, torch.nn.Sequential):
        inner = transform.transforms if _kind(transform) == "Compose" else list(transform)
        return [t for part in inner for t in _flatten(part)]
    return [transform]


def _kind(transform: Any) -> str | None:
    """The torchvision class name of ``transform``, None for anything else."""
    return type(transform).__name__ if type(transform).__module__.startswith("torchvision.transforms") else None


def _name(transform: Any) -> str:
    text = repr(transform)
    return text if len(text) <= 120 else text[:117] + "..."


def _pair(size: Any) -> tuple[int, int] | None:
    """(h, w) of a torchvision size, None for a single number (a short side)."""
    if isinstance(size, int):
        return None
    size = list(size)
    return None if len(size) == 1 else (int(size[0]), int(size[1]))


def _two(values: Any) -> tuple[float, float]:
    """A torchvision (low, high) range, list or tuple, as two floats."""
    low, high = values
    return float(low), float(high)


def _interpolation(transform: Any) -> str:
    mode = getattr(transform, "interpolation", "bilinear")
    return str(getattr(mode, "value", mode)).lower()


def _leading_geometry(transforms: list[Any]) -> tuple[int, CropSpec | None, list[Step]]:
    """How many leading transforms make the crop, the CropSpec, and their steps. Recognised:
    flips around one of RandomResizedCrop, Resize(short side) + CenterCrop, Resize((h, w))."""
    flip, spec, short, used, steps = 0.0, None, None, 0, []
    for position, t in enumerate(transforms):
        kind = _kind(t)
        if kind == "RandomHorizontalFlip":
            flip = flip + t.p - 2 * flip * t.p  # flipped in the end: exactly one of the flips happened
            why = f"a flip drawn per image with p={t.p}"
        elif kind == "RandomResizedCrop" and spec is None and short is None:
            spec = CropSpec("random_resized", _pair(t.size) or (int(t.size), int(t.size)), _two(t.scale), _two(t.ratio))
            why = _resampling_note(t)
        elif kind == "Resize" and spec is None and short is None and getattr(t, "max_size", None) is None:
            if _pair(t.size) is None:
                short = int(t.size if isinstance(t.size, int) else list(t.size)[0])
            else:
                spec = CropSpec("resize", _pair(t.size) or (0, 0), exact=True)
            why = _resampling_note(t)
        elif kind == "CenterCrop" and short is not None and spec is None:
            size = _pair(t.size) or (int(t.size), int(t.size))
            if max(size) > short:
                break  # torchvision pads a crop larger than the resized image: not fused
            spec = CropSpec("center", size, center_fraction=min(size) / short, exact=True)
            why = "the central crop of the resized image"
        else:
            break
        steps.append(Step(_name(t), "decode", why))
        used = position + 1
    if spec is None:  # no crop, or a Resize(short side) alone: images of different sizes
        return 0, None, []
    return used, replace(spec, flip=True if flip == 0.5 else flip), steps


def _resampling_note(transform: Any) -> str:
    mode = _interpolation(transform)
    if _kind(transform) == "Resize":
        how = "decoded whole, resized with Pillow's antialiased bilinear filter and cropped, as torchvision's PIL path"
    else:
        how = ("decoded at the smallest JPEG DCT scale the crop allows, then resized bilinearly "
               "(an axis shrinking 2x or more halved first)")
    if mode != "bilinear":
        how += f"; {mode} interpolation is approximated by that"
    if getattr(transform, "antialias", True) is False:
        how += "; antialias=False does not apply (ImageFolder's PIL images are always resized with antialiasing)"
    return how


class _Middle:
    """The ops after the crop, added one by one while stoker.augment can run them."""

    def __init__(self) -> None:
        self.ops: list = []
        self.steps: list[Step] = []
        self.notes: list[str] = []
        self.stage: Stage = "pil"
        self.dtype = torch.uint8
        self.tv_image = False  # a v2 ToImage ran: the per-sample rest gets tv_tensors.Image
        self.stop_reason = ""

    def add(self, t: Any) -> bool:
        """Take ``t`` into the batched part, or say (False, ``stop_reason``) why not."""
        kind = _kind(t)
        if kind is None:
            return self._stop("not a torchvision transform: run as given")
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            return self._stop(f"{kind} has no batched counterpart in stoker.augment")
        if kind in _GEOMETRIC and any(_photometric(op) for op in self.ops):
            return self._stop("a geometric op after a photometric one is not fused (the one sampling pass comes first)")
        result = handler(t)
        if isinstance(result, str):
            return self._stop(result)
        op, why = result
        self.steps.append(Step(_name(t), "batch", why))
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
        ranges: dict[str, Any] = {name: _two(getattr(t, name)) if getattr(t, name) is not None else 0.0
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
        sigma = _two(t.sigma) if isinstance(t.sigma, Sequence) else (float(t.sigma), float(t.sigma))
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
        mode = _interpolation(t)
        if mode not in _INTERPOLATIONS:
            return f"{mode} interpolation is not fused (stoker.augment samples bilinear or nearest)"
        if isinstance(t.fill, dict):
            return "a fill per type is not fused"
        unit = 255.0 if self.stage != "float" else 1.0  # PIL and uint8 fills are in 0..255
        fill = tuple(float(v) / unit for v in t.fill) if isinstance(t.fill, Sequence) else float(t.fill or 0) / unit
        center = _two(t.center) if t.center is not None else None
        return A.Affine(**params, center=center, interpolation=cast(Literal["bilinear", "nearest"], mode), fill=fill), \
            f"same ranges, {mode}, fill {t.fill}, centre {'the image centre' if center is None else center}"

    def _RandomApply(self, t: Any) -> tuple[Any, str] | str:
        inner = [part for given in t.transforms for part in _flatten(given)]
        kind = _kind(inner[0]) if len(inner) == 1 else None
        result = getattr(self, f"_{kind}")(inner[0]) if kind in _WITH_PROBABILITY else None
        if result is None or isinstance(result, str):
            return "RandomApply is fused only around one op that has a probability in stoker.augment"
        op, why = result
        return replace(op, p=op.p * float(t.p)), f"{why}; applied with probability {t.p}"


def _photometric(op: Any) -> bool:
    return isinstance(op, A.ColorJitter | A.Grayscale | A.GaussianBlur | A.Normalize)
