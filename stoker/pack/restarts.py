"""``stoker pack --restart-rows``: sequential JPEGs transcoded losslessly with restart markers.

A reader that knows where each MCU row's entropy-coded data starts decodes only the rows (and
the parts of rows) its crop needs: the Loader's region decode (stoker/decode/_jpeg_region.c).
The transcode and its check run in C (``_jpeg_restart.c``); images it does not transcode are
stored as they are, and the reason is counted.
"""

from __future__ import annotations

import ctypes
import sys
from collections import Counter
from collections.abc import Callable

from stoker.errors import PackError

transcode: Callable[[bytes, float], bytes] | None
try:  # built where libjpeg's headers were found (see setup.py)
    from stoker.pack._jpeg_restart import NotTranscodable, transcode
except ImportError:
    transcode = None

TRANSCODED = "transcoded"
# Each image's output may be at most this much larger than its source (markers, DC values coded
# whole at each restart, the offset table); otherwise restarts are coarser, or none.
MAX_GROWTH = 0.02


def check_available() -> None:
    """Raise PackError when this installation cannot transcode (no libjpeg headers at build time)."""
    if transcode is None:
        raise PackError("--restart-rows needs stoker's libjpeg extension (stoker.pack._jpeg_restart), which was not "
                        "built: install libjpeg-turbo's headers (libjpeg-turbo8-dev, libjpeg62-turbo-dev or "
                        "libjpeg-turbo-devel) and reinstall stoker")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_tuned = False


def keep_freed_memory() -> None:
    """Let glibc keep freed memory for reuse in this (pack worker) process. libjpeg allocates each
    image's coefficient arrays anew (~0.6 MB per 500x375 photo, twice: the source and the read-back
    check) and frees them; by default glibc maps such blocks fresh and unmaps them, so every
    transcode page-faulted them in again: measured here 3.3-3.6 ms per photo, 2.4-2.5 ms with
    this (a busy machine; rough). Costs at most 64 MiB of freed memory kept by the process."""
    global _tuned
    if _tuned or not sys.platform.startswith("linux"):
        return
    _tuned = True
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc; musl has none
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 16 << 20)
        mallopt(_M_TRIM_THRESHOLD, 64 << 20)


def with_restart_markers(data: bytes, image_format: str) -> tuple[bytes, str]:
    """The bytes to store and what happened: ``TRANSCODED``, or why the image is stored as it is
    (a short reason shared by many images, for the pack's counts)."""
    assert transcode is not None, "check_available() first"
    if image_format != "JPEG":  # MPO: its APP2 offsets point at images after the first one's end
        return data, f"not a plain JPEG ({image_format})"
    try:
        return transcode(data, MAX_GROWTH), TRANSCODED
    except NotTranscodable as e:
        return data, str(e)
    except ValueError:  # libjpeg's warnings count as errors: the source is not clean enough to prove equal
        return data, "JPEG that libjpeg reads only with warnings"


def summarize(counts: Counter) -> dict[str, object]:
    """The manifest's record of a restart-rows pack: images transcoded, kept, and why kept."""
    kept = {reason: n for reason, n in sorted(counts.items(), key=lambda item: -item[1]) if reason != TRANSCODED}
    return {"transcoded": counts.get(TRANSCODED, 0), "kept": sum(kept.values()), "kept_reasons": kept}
