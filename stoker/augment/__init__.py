"""Batched augmentation with random parameters per sample, on the GPU or the CPU (see pipeline.py)."""

from stoker.augment.color import ColorJitter, GaussianBlur, Grayscale, Normalize
from stoker.augment.device import default_device
from stoker.augment.geometry import Affine, CenterCrop, HorizontalFlip, RandomResizedCrop, Resize, Rotate, VerticalFlip
from stoker.augment.pipeline import Augment

__all__ = ["Affine", "Augment", "CenterCrop", "ColorJitter", "GaussianBlur", "Grayscale", "HorizontalFlip", "Normalize",
           "RandomResizedCrop", "Resize", "Rotate", "VerticalFlip", "default_device"]
