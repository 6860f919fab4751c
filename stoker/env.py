"""What this installation runs on: stoker's version and each optional fast path, with its version.

``stoker env`` (and ``stoker --version``) print :func:`report`; the Loader warns once per process
(:func:`warn_fallback_once`) and ``stoker doctor`` adds a note (:func:`fallback_notes`) when JPEGs
are decoded the slower way, so a missing fast path is never silent.

Probing stays under a second: what imports quickly is imported (the region-decode extension,
simplejpeg, OpenCV), the rest is looked up in the installed packages' metadata. Measured here,
importing torch takes ~1.7 s, Ray and s3fs ~1.5 s each. This module imports nothing of stoker's
but its version, so every layer may use it.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import importlib
import importlib.metadata
import importlib.util
import platform
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from stoker.version import __version__

REGION_DECODE = "stoker.decode._jpeg_region"
EXACT_RESIZE = "stoker.decode._resample"
PHOTOMETRIC = "stoker.augment._photometric"
FIX = ("install stoker's wheel, which carries libjpeg-turbo (`make wheel`, then pip install dist/stoker-*.whl), "
       "or install libjpeg-turbo's headers (libjpeg-turbo8-dev, libjpeg62-turbo-dev or libjpeg-turbo-devel) and "
       "reinstall stoker from source")


class FallbackWarning(RuntimeWarning):
    """stoker runs a slower path than it could: a fast path's module is missing here."""


@dataclass(frozen=True)
class Part:
    """One optional fast path: whether it works here, its version, and what it gives or how to get it."""

    name: str
    available: bool
    version: str
    note: str


def parts() -> list[Part]:
    """Every optional fast path, probed now. Counting GPUs initialises the CUDA driver in this
    process, as torch.cuda does: a process forked after it cannot use CUDA."""
    return [_region_decode(), _exact_resize(), _photometric(), _simplejpeg(), _opencv(),
            _installed("PyAV", "av", "video data sets (pack --video-mode, VideoClipDataset)", "video"),
            _gpu_decode(),
            _installed("Ray", "ray", "stoker pack --engine ray", "ray"),
            _installed("s3fs", "s3fs", "s3:// data sets", "s3")]


def report() -> str:
    """What ``stoker env`` prints: stoker's and Python's versions, then one line per fast path."""
    lines = [f"stoker {__version__}, Python {platform.python_version()} ({platform.system()} {platform.machine()})"]
    for part in parts():
        lines.append(f"  {part.name:14} {'yes' if part.available else 'no':3}  {part.version:28} {part.note}")
    return "\n".join(lines)


def region_decode_error() -> str | None:
    """Why the region-decode extension does not import here, or ``None`` when it does."""
    return _import_error(REGION_DECODE)


@functools.cache
def _import_error(name: str) -> str | None:
    """Why the extension module ``name`` does not import here, or ``None`` when it does."""
    try:
        _import_extension(name)
    except ImportError as e:
        return f"{name} did not import: {e}"
    return None


def fallback_notes() -> list[str]:
    """One line per fast path the Loader cannot use here: what it does instead, the cause and the fix."""
    error = region_decode_error()
    if error is None:
        return []
    return [f"JPEGs are decoded whole by simplejpeg instead of only each crop's region (measured on the sample "
            f"photos: ~13% fewer img/s): {error}. Fix: {FIX}"]


_warned = False


def warn_fallback_once() -> None:
    """Warn (:class:`FallbackWarning`) about the slower paths, once per process, at the caller's caller."""
    global _warned
    if _warned:
        return
    _warned = True
    for note in fallback_notes():
        warnings.warn(f"stoker.Loader: {note}", FallbackWarning, stacklevel=3)


def _import_extension(name: str) -> ModuleType:
    """The extension module ``name`` (of stoker.loader or stoker.augment), imported through the import
    system's finders."""
    package = name.rpartition(".")[0]
    if package in sys.modules:
        return importlib.import_module(name)
    # Not through the package: the __init__ of stoker.loader and of stoker.augment imports torch, ~1.7 s
    # of `stoker env`'s time.
    folder = [str(Path(__file__).with_name(package.rpartition(".")[2]))]
    for finder in sys.meta_path:
        spec = finder.find_spec(name, folder) if hasattr(finder, "find_spec") else None
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _region_decode() -> Part:
    error = region_decode_error()
    if error is not None:
        return Part("region decode", False, "", f"JPEGs decoded whole by simplejpeg: {error}. Fix: {FIX}")
    module = _import_extension(REGION_DECODE)
    return Part("region decode", True, f"libjpeg-turbo {module.LIBJPEG_TURBO_VERSION} (API {module.JPEG_LIB_VERSION})",
                "decodes only the rows and columns each crop needs")


def _exact_resize() -> Part:
    return _compiled_part(EXACT_RESIZE, "exact resize", "Resize + CenterCrop resized whole by Pillow (~3x the time) where "
                          "the region-decode extension's chunk call does not make the sample",
                          "torchvision's Resize + CenterCrop pixels, computed for the crop alone")


def _photometric() -> Part:
    return _compiled_part(PHOTOMETRIC, "photometric", "ColorJitter, grayscale and Normalize run per image through "
                          "OpenCV, holding the GIL between calls",
                          "ColorJitter, grayscale and Normalize for a chunk of crops, without the GIL")


def _compiled_part(module: str, name: str, without: str, what: str) -> Part:
    """The line of an extension that needs only a C compiler: what runs instead where it is missing, and why."""
    error = _import_error(module)
    if error is not None:
        return Part(name, False, "", f"{without}: {error}. Fix: reinstall stoker with a C compiler")
    return Part(name, True, "", what)


def _simplejpeg() -> Part:
    try:
        import simplejpeg
    except ImportError as e:
        return Part("simplejpeg", False, "", f"did not import: {e}")
    return Part("simplejpeg", True, simplejpeg.__version__, "whole-image JPEG decode at a reduced DCT scale")


def _opencv() -> Part:
    try:
        import cv2
    except ImportError as e:
        return Part("OpenCV", False, "", f"did not import: {e}")
    framework = re.search(r"Parallel framework:\s*(\S+)", cv2.getBuildInformation())
    threads = f"{framework.group(1) if framework else 'no parallel framework'}, {cv2.getNumThreads()} threads"
    return Part("OpenCV", True, f"{cv2.__version__}, {threads}", "resize and flip (the Loader sets 1 thread: it runs its own)")


def _installed(name: str, distribution: str, gives: str, extra: str) -> Part:
    version = _version(distribution)
    if version is None:
        return Part(name, False, "", f"for {gives}: pip install 'stoker[{extra}]'")
    return Part(name, True, version, gives)


def _gpu_decode() -> Part:
    """torchvision, a CUDA build of torch and a visible GPU: what ``Loader(decode="gpu")`` needs (nvJPEG
    comes with torchvision's CUDA build)."""
    torchvision, cuda, gpus = _version("torchvision"), _torch_cuda(), _cuda_devices()
    missing = []
    if torchvision is None:
        missing.append("torchvision: pip install 'stoker[gpu]'")
    if cuda is None:
        missing.append(f"a CUDA build of torch (this is torch {_version('torch')})")
    elif gpus == 0:
        missing.append("a CUDA GPU (none visible)")
    version = f"torchvision {torchvision}, CUDA {cuda}" if torchvision and cuda else ""
    if missing:
        return Part("GPU decode", False, version, f"decode=\"gpu\" needs {'; '.join(missing)}")
    return Part("GPU decode", True, version, f"decode=\"gpu\": nvJPEG on {gpus} GPU{'s' if gpus > 1 else ''}")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_cuda() -> str | None:
    """The CUDA version torch was built for, read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "cuda" for t in targets):
                return node.value.value if isinstance(node.value.value, str) else None
    return None


def _cuda_devices() -> int:
    """CUDA devices visible to this process, counted by the driver (libcuda) without importing torch."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value
