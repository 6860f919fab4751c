"""The allowed range of every numeric option, in one place: the CLI's argument types and the
Python functions that take the same values check them with the same :class:`Range`, before any
work starts, and say the range in the message. Options that take one of a few values (``order``,
``layout``, ...) are a :class:`Choice`, checked the same way.

    SHARD_BYTES.check(shard_bytes)                       # Python: OptionError naming shard_bytes= and --shard-size
    p.add_argument("--shard-size", type=SHARD_BYTES.argument(parse_size))   # CLI: argparse's one-line error
    ORDER.check(order)                                   # OptionError: order='x': must be one of 'quasi_random', ...
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker.errors import OptionError

_BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``low < value`` when ``above``), an integer unless ``integer``
    is False (then any finite number, and ``inf`` where ``high`` is ``inf``: no limit); ``name`` is
    the Python argument, ``flag`` the CLI option."""

    name: str
    flag: str  # "" for arguments the CLI does not take
    low: float
    high: float
    integer: bool = True
    above: bool = False
    unit: str = ""

    def describe(self) -> str:
        """The range in words, e.g. ``an integer from 1 to 100 (percent)``."""
        low = self._show(self.low)
        kind = "a size" if self.unit == "bytes" else "an integer" if self.integer else "a number"
        if math.isinf(self.high):
            bounds = f"above {low}" if self.above else f"at least {low}"
        else:
            high = self._show(self.high)
            bounds = f"above {low} and at most {high}" if self.above else f"from {low} to {high}"
        unit = f" ({self.unit})" if self.unit and self.unit != "bytes" else ""
        return f"{kind} {bounds}{unit}" + (" or inf" if math.isinf(self.high) else "")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a number of the right kind inside the range (bools are not numbers here)."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if self.integer else numbers.Real):
            return False
        if not math.isfinite(value) and value != self.high:  # inf only where the range has no upper bound
            return False
        too_low = value <= self.low if self.above else value < self.low  # numbers.Real defines only < and <=
        return not too_low and value <= self.high

    def check(self, value: Any) -> Any:
        """``value`` when it is in range; OptionError naming the argument, the option and the range."""
        if not self.accepts(value):
            flag = f" ({self.flag})" if self.flag else ""
            raise OptionError(f"{self.name}={value!r}{flag}: must be {self.describe()}")
        return value

    def argument(self, convert: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
        """An argparse ``type=``: the text converted (``int``/``float``, or ``convert``) and checked."""

        def parse(text: str) -> Any:
            try:
                value = convert(text) if convert else (int if self.integer else float)(text)
            except ValueError:
                value = None
            if value is None or not self.accepts(value):
                raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}")
            return value

        parse.__name__ = self.name
        return parse

    def _show(self, bound: float) -> str:
        if self.unit == "bytes":
            return next((f"{bound / size:g} {name}" for size, name in _BYTE_UNITS if bound >= size), f"{bound:g} bytes")
        if bound >= 1e15:
            return f"2**{round(math.log2(bound + 1))} - 1"
        return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"  # 2147483648, not 2.14748e+09


@dataclass(frozen=True)
class Choice:
    """One of ``values``, of the same type (True is not 1, 1 is not True); ``name`` is the Python argument."""

    name: str
    values: tuple[Any, ...]

    def describe(self) -> str:
        """The values in words, e.g. ``one of 'NCHW', 'NHWC' or None``."""
        shown = [repr(value) for value in self.values]
        return f"one of {', '.join(shown[:-1])} or {shown[-1]}" if len(shown) > 1 else shown[0]

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is one of the values (a hashable of the same type)."""
        return any(type(value) is type(choice) and value == choice for choice in self.values)

    def check(self, value: Any) -> Any:
        """``value`` when it is one of the values; OptionError naming the argument and the values."""
        if not self.accepts(value):
            raise OptionError(f"{self.name}={value!r}: must be {self.describe()}")
        return value


_SEED_MAX = 2**63 - 1  # numpy takes any non-negative seed; this keeps it an int64 wherever it is stored

# stoker pack / stoker.pack(...)
SHARD_BYTES = Range("shard_bytes", "--shard-size", 64 << 10, 16 << 30, unit="bytes")  # the index counts in 32 bits
PACK_WORKERS = Range("workers", "--workers", 1, 4096)
SHUFFLE_SEED = Range("shuffle_seed", "--shuffle-seed", 0, _SEED_MAX)
MAX_SIDE = Range("max_side", "--max-side", 1, 65535, unit="pixels")
QUALITY = Range("quality", "--quality", 1, 100, unit="JPEG quality")
FPS = Range("fps", "--fps", 0, 1000, integer=False, above=True, unit="frames per second")
SHORT_SIDE = Range("short_side", "--short-side", 1, 65535, unit="pixels")
GOP = Range("gop", "--gop", 1, 10000, unit="frames between keyframes")
CRF = Range("crf", "--crf", 0, 51, unit="x264 quality: 0 lossless, 51 coarsest")

# stoker sample / make_sample_photos(...)
SAMPLE_COUNT = Range("count", "--count", 0, 10_000_000, unit="photos")
SAMPLE_CLASSES = Range("num_classes", "--classes", 1, 100_000)
SAMPLE_SEED = Range("seed", "--seed", 0, _SEED_MAX)

# stoker doctor / stoker.doctor(...)
STEP_TIME = Range("step_time", "--step-time", 0, 86400, integer=False, above=True, unit="seconds per batch")
DOCTOR_BATCH = Range("batch_size", "--batch-size", 1, 1 << 16)
DOCTOR_WORKERS = Range("workers", "--workers", 0, 1024)
DOCTOR_SIZE = Range("size", "--size", 1, 65535, unit="pixels")
DOCTOR_NODES = Range("nodes", "--nodes", 1, 1 << 20)
DOCTOR_RANKS = Range("ranks_per_node", "--ranks-per-node", 1, 4096)

# stoker bench loader / bench_loader(...)
BENCH_COUNT = Range("count", "--count", 1, 10_000_000, unit="photos")
BENCH_REPEAT = Range("repeat", "--repeat", 1, 100)
BENCH_BATCH = Range("batch", "--batch", 1, 1 << 16)
# bench/autotune.py: the per-response rate of its scenario d (ShapedLink's stream_rate)
BENCH_STREAM_MBIT = Range("stream_mbit", "--stream-mbit", 0, 1e6, integer=False, above=True, unit="Mbit/s")

# Loader, QuasiRandomSampler, Augment and their saved states (no CLI options)
SEED = Range("seed", "", 0, _SEED_MAX)
EPOCH = Range("epoch", "", 0, 2**31 - 1)  # Augment's step is (epoch << 32) + batch: an int64
START_EPOCH = Range("start_epoch", "", EPOCH.low, EPOCH.high)
BATCH_SIZE = Range("batch_size", "", 1, 1 << 31)
WINDOW = Range("window", "", 1, 1 << 31)
WORLD_SIZE = Range("world_size", "", 1, 1 << 20)
NODES = Range("nodes", "", 1, WORLD_SIZE.high)
PARTITIONS = Range("partitions", "", 1, 1 << 20)
ORDER = Choice("order", ("quasi_random", "random", "sequential"))
DROP_LAST = Choice("drop_last", (False, True))

# stoker.Loader(...) (no CLI options)
THREADS = Range("threads", "", 1, 4096)
PROCESSES = Range("processes", "", 0, 1024)
PREFETCH = Range("prefetch", "", 1, 1024, unit="batches made ahead")
LAYOUT = Choice("layout", ("NCHW", "NHWC", None))
DECODE = Choice("decode", ("cpu", "gpu"))
ON_ERROR = Choice("on_error", ("raise", "skip", None))
# ShardDataset(...)
DATASET_DECODE = Choice("decode", ("pil", "rgb", "tensor", "raw"))
DATASET_ON_ERROR = Choice("on_error", ("raise", "skip"))
MP_CONTEXT = Choice("mp_context", (*multiprocessing.get_all_start_methods(), None))
TUNE = Choice("tune", (True, False))
ECHO = Choice("echo", (None, "auto"))

# ShardDataset(...) and ShardSet (no CLI options)
BLOCK_BYTES = Range("block_bytes", "", 4 << 10, 1 << 30, unit="bytes")
MAX_OPEN_SHARDS = Range("max_open_shards", "", 1, 1 << 20)
CACHE_LIMIT = Range("cache_limit", "", 1, 1 << 60, unit="bytes")
CACHE_AHEAD = Range("cache_ahead", "", 0, 1 << 20, unit="shards")
READS_IN_FLIGHT = Range("reads_in_flight", "", 1, 1024)
READ_TIMEOUT = Range("read_timeout", "", 0, math.inf, integer=False, above=True, unit="seconds")

# CropSpec(...) (no CLI options): each side of ``size``, each end of ``scale`` and ``ratio``
CROP_SIDE = Range("size", "", 1, 65535, unit="pixels")
CROP_SCALE = Range("scale", "", 0, 1, integer=False, above=True, unit="of the image's area")
CROP_RATIO = Range("ratio", "", 0, 65535, integer=False, above=True, unit="width / height")
CENTER_FRACTION = Range("center_fraction", "", 0, 1, integer=False, above=True, unit="of the short side")
FLIP_P = Range("flip", "", 0, 1, integer=False, unit="probability")

# VideoClipDataset(...)
CLIP_FPS = Range("fps", "", 0, 1000, integer=False, above=True, unit="frames per second")

# stoker.storage.stage(...)
RETRIES = Range("retries", "", 0, 100)
BACKOFF = Range("backoff", "", 0, 3600, integer=False, unit="seconds")

# stoker.ShardDatasink(...): the rows Ray Data gives each write task, which writes them as one shard
ROWS_PER_SHARD = Range("rows_per_shard", "", 1, 1 << 30, unit="rows")
