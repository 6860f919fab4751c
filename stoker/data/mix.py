"""Mix: a weighted mixture of packed data sets, read as one (each batch stratified to the weights).

    Mix({"web": a, "books": b}, weights={"web": 0.7, "books": 0.3})
      index space: a's samples, then b's (offsets); labels: a's, then b's shifted past a's classes
      an epoch: MixOrder (mix_plan.py), an EpochOrder: each rank's batch stratified, each source read in
      its own I/O-friendly order (epoch.py's sequence of that source, one shuffle per pass)

stoker.Loader and QuasiRandomSampler read a Mix as they read a ShardDataset; the Loader's native
decode path reads it too (:meth:`Mix.image_reads` gives every source's samples as arrays). The sources
are all image sets (ShardDataset) or all video clip sets (stoker.VideoClipDataset): a Mix of clip
sets is read as one clip set, the Loader's Clips (loader/clips.py) taking each clip from its source.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, Protocol

import numpy as np
import torch
import torch.utils.data

from stoker.data.dataset import ImageReads, ShardDataset
from stoker.data.epoch import Order, rank_batches
from stoker.data.mix_plan import EXHAUSTED, Exhausted, MixOrder, MixSpec, exact_weights
from stoker.data.readahead import Lookahead, block_bounds_of, open_blocks
from stoker.data.readers import ReadBuffer
from stoker.data.shards import ShardSet
from stoker.errors import CorruptDataError, OptionError, StokerError


class ClipSet(Protocol):
    """What Mix reads of a video clip set, a :class:`stoker.VideoClipDataset` (named by what it
    has: stoker.video imports this layer, so this layer does not import it)."""

    @property
    def root(self) -> str: ...
    @property
    def shards(self) -> ShardSet: ...
    @property
    def transform(self) -> Any: ...
    @property
    def classes(self) -> list[str]: ...
    @property
    def targets(self) -> np.ndarray: ...
    @property
    def clip_len(self) -> int: ...
    @property
    def clips_per_video(self) -> int: ...
    @property
    def layout(self) -> str: ...
    def key(self, index: int) -> str: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...


class Mix(torch.utils.data.Dataset):
    """A weighted mixture of ShardDatasets, or of VideoClipDatasets, read as one data set by
    stoker.Loader, or by a DataLoader with a QuasiRandomSampler (give it the DataLoader's ``batch_size``).

    ``weights``: each source's share of every batch (any positive numbers; normalized; default:
    proportional to the sources' sizes). Every batch is stratified: its count of source i differs
    from w_i x its size by less than one sample; that holds for each rank's batch, the shorter
    ones at the end of an epoch included. ``epoch_size``: samples per epoch (default: the sources'
    sizes summed), kept as stated whatever the batch size and world size (the last global batch
    may be short and is split over the ranks, as for one data set; ``drop_last`` drops it).
    ``exhausted``: what a source that runs out within an epoch does: ``"repeat"`` (default) goes
    on with its next pass, shuffled anew; ``"end"`` ends the epoch early, at the largest length
    where every source's share stays below its size (so no sample is read twice in an epoch,
    whatever the batches). Each source keeps its own I/O-friendly order (its blocks shuffled, read
    whole), and each epoch starts every source on a new shuffle. The order of an epoch is a pure
    function of seed, epoch and the batches it is read in (:class:`stoker.data.mix_plan.MixOrder`),
    so it resumes exactly, on this world size or another, from a state that counts each source's
    samples consumed.

    Indices: the sources' samples one after another (``offsets``). Labels: one class space, the
    sources' classes one after another, named ``"<source>/<class>"`` (``classes``); a source with
    no labels is one class, its name. So a classifier trains on the union as it is, and
    :meth:`label_source` / :meth:`source_label` say which source a label (a batch's label tensor)
    came from and what its label was there. Items are the sources' items with the label shifted.

    Video clip sets mix as image sets do (``clips``: True): the Loader gives their batches of
    clips, each clip cut as its own source says (its sampling, stride, fps, frames or video
    mode); the sources give clips of one shape and layout (``clip_len``, ``clips_per_video``,
    ``layout``). Image sets and clip sets do not mix (no batch holds both).
    """

    def __init__(self, sources: Mapping[str, ShardDataset | ClipSet], weights: Mapping[str, float] | None = None, *,
                 epoch_size: int | None = None, exhausted: Exhausted = "repeat") -> None:
        if not sources:
            raise OptionError("Mix needs at least one source")
        for name, source in sources.items():
            if not isinstance(name, str) or not name:
                raise OptionError(f"Mix's sources are named by non-empty strings, got {name!r}")
            if not isinstance(source, ShardDataset) and not is_clip_set(source):
                raise TypeError(f"Mix source {name!r} is a {type(source).__name__}: Mix mixes ShardDatasets "
                                "or VideoClipDatasets")
            if isinstance(source, ShardDataset) and source.target_transform is not None:
                raise OptionError(f"Mix source {name!r} has a target_transform: Mix shifts each source's labels into "
                                 "one class space, so give none (transform the Mix's labels instead)")
            if len(source) == 0:
                raise StokerError(f"{source.root}: Mix source {name!r} has no samples")
        self.names = tuple(sources)
        self.sources = tuple(sources.values())
        self.clips = _one_kind(sources)
        self.layout = _clip_layout(sources) if self.clips else None  # the clips' (THWC or TCHW), one for all
        given = dict(weights) if weights is not None else {n: len(s) for n, s in sources.items()}
        if set(given) != set(self.names):
            raise OptionError(f"Mix's weights name {sorted(given)}, its sources {sorted(self.names)}: name each once")
        for name, w in given.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise OptionError(f"Mix weight of {name!r} must be a positive number, got {w!r}")
        self._exact = exact_weights([given[n] for n in self.names])
        # Shares from the exact ratios (Python's int / int rounds correctly): a float sum of the given
        # weights overflows (1e308 each) and would make every share 0.0.
        self.weights = {n: w / sum(self._exact) for n, w in zip(self.names, self._exact)}
        if exhausted not in EXHAUSTED:
            raise OptionError(f"exhausted must be 'repeat' or 'end', got {exhausted!r}")
        self.exhausted = exhausted
        sizes = [len(s) for s in self.sources]
        if epoch_size is not None and (isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 1):
            raise OptionError(f"epoch_size must be a positive number of samples, got {epoch_size!r}")
        self.epoch_size = epoch_size if epoch_size is not None else sum(sizes)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._label_counts = [_class_count(name, s) for name, s in zip(self.names, self.sources)]
        self._unlabeled = np.array([not s.classes and bool((s.targets < 0).all()) for s in self.sources])
        self.label_offsets = np.concatenate([[0], np.cumsum(self._label_counts)]).astype(np.int64)
        images = [s for s in self.sources if isinstance(s, ShardDataset)]  # none in a Mix of clip sets
        self.on_error = "skip" if images and all(s.on_error == "skip" for s in images) else "raise"
        self.restart_rows = any(s.restart_rows for s in images)  # JPEGs without a table decode as usual
        self.root = f"Mix({', '.join(f'{n}={s.root}' for n, s in zip(self.names, self.sources))})"
        self._bounds: list[np.ndarray] | None = None

    @property
    def transform(self) -> Any:
        """The sources' transforms where any has one (the Loader refuses them: it crops itself), else None."""
        given = tuple(s.transform for s in self.sources)
        return given if any(t is not None for t in given) else None

    target_transform = None  # refused per source: labels are shifted into one space

    def spec(self) -> MixSpec:
        """The numbers that decide this mix's epochs (see :mod:`stoker.data.mix_plan`)."""
        return MixSpec(tuple(len(s) for s in self.sources), self._exact, self.epoch_size, self.exhausted)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(source number, index in that source) of mix index ``index``."""
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a Mix of {n} samples")
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return source, index - int(self.offsets[source])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        index = int(index)
        source, local = self.locate(index + len(self) if index < 0 else index)
        sample, label, *rest = self.sources[source][local]  # a clip set's items end with the frames used
        return (sample, self.mix_label(source, label), *rest)

    def mix_label(self, source: int, label: int) -> int:
        """Source ``source``'s label ``label`` as this mix's label."""
        return int(self._labels(source, np.array([label]))[0])

    def _labels(self, source: int, labels: np.ndarray) -> np.ndarray:
        """Source ``source``'s ``labels`` as mix labels: shifted past the earlier sources' classes."""
        return (0 if self._unlabeled[source] else labels) + self.label_offsets[source]

    def source_of(self, indices: np.ndarray | int) -> np.ndarray:
        """The source number (position in ``names``) of each mix index."""
        return np.searchsorted(self.offsets, np.asarray(indices, np.int64), side="right") - 1

    def label_source(self, labels: np.ndarray | torch.Tensor) -> np.ndarray:
        """The source number of each mix label (a batch's label tensor, say): ``names[n]`` is its name."""
        return np.searchsorted(self.label_offsets, _array(labels), side="right") - 1

    def source_label(self, labels: np.ndarray | torch.Tensor) -> np.ndarray:
        """Each mix label as its source had it (-1 for a source without labels)."""
        labels = _array(labels)
        source = self.label_source(labels)
        return np.where(self._unlabeled[source], -1, labels - self.label_offsets[source])

    @property
    def classes(self) -> list[str]:
        """Class names of the mix's labels: ``"<source>/<class>"``, a source without labels its name alone."""
        names: list[str] = []
        for name, source, count in zip(self.names, self.sources, self._label_counts):
            if source.classes:
                names += [f"{name}/{c}" for c in source.classes]
            elif self._unlabeled[self.names.index(name)]:
                names.append(name)
            else:
                names += [f"{name}/{i}" for i in range(count)]
        return names

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self) -> np.ndarray:
        """Every sample's mix label (int64), from the sources' indexes."""
        return np.concatenate([self._labels(i, s.targets) * np.ones(len(s), np.int64)
                               for i, s in enumerate(self.sources)]).astype(np.int64)

    def key(self, index: int) -> str:
        """``"<source>/<key>"`` of mix sample ``index``."""
        source, local = self.locate(int(index))
        return f"{self.names[source]}/{self.sources[source].key(local)}"

    def read_image(self, index: int, into: ReadBuffer | None = None) -> tuple[bytes | memoryview, int]:
        """The stored image bytes of mix sample ``index`` and its mix label (see :meth:`ShardDataset.read_image`)."""
        source, local = self.locate(int(index))
        data, label = self._image_set(source).read_image(local, into)
        return data, self.mix_label(source, label)

    def decode_error(self, index: int, error: Exception) -> CorruptDataError:
        """The error for mix sample ``index``'s image not decoding: it names its source's shard and key."""
        source, local = self.locate(int(index))
        return self._image_set(source).decode_error(local, error)

    def _image_set(self, source: int) -> ShardDataset:
        """Source ``source``, whose images are read (a Mix of clip sets is read clip by clip)."""
        found = self.sources[source]
        if not isinstance(found, ShardDataset):
            raise TypeError(f"{self.root}: a Mix of video clip sets has no images to read: stoker.Loader reads its clips")
        return found

    @contextmanager
    def image_reads(self, indices: np.ndarray) -> Iterator[ImageReads]:
        """Where the image bytes of mix samples ``indices`` are, as arrays (see
        :meth:`ShardDataset.image_reads`), every source's shard files held open meanwhile. Where some
        sources check reads and others do not, the others' samples are left to the usual read."""
        indices = np.asarray(indices, np.int64)
        n = len(indices)
        verify = [s.shards.verify for s in self.sources]
        reads = ImageReads(np.full(n, -1, np.int32), np.zeros(n, np.uint64), np.zeros(n, np.uint64),
                           np.zeros(n, np.uint64) if any(verify) else None, np.zeros(n, np.int64), np.zeros(n, bool))
        source_of = self.source_of(indices)
        with ExitStack() as held:
            for source in np.unique(source_of):
                if reads.checksums is not None and not verify[source]:
                    continue
                mine = np.flatnonzero(source_of == source)
                part = held.enter_context(self._image_set(int(source)).image_reads(indices[mine] - self.offsets[source]))
                reads.fds[mine], reads.offsets[mine], reads.sizes[mine] = part.fds, part.offsets, part.sizes
                if reads.checksums is not None and part.checksums is not None:
                    reads.checksums[mine] = part.checksums
                reads.labels[mine] = self._labels(int(source), part.labels)
                reads.covered[mine] = part.covered
            yield reads

    # -- orders --------------------------------------------------------------------------------------------

    def bounds(self) -> list[np.ndarray]:
        """Each source's block boundaries (see :func:`stoker.data.readahead.block_bounds_of`)."""
        if self._bounds is None:
            self._bounds = [block_bounds_of(s.shards) for s in self.sources]
        return self._bounds

    def windows(self, window: int) -> list[int]:
        """Blocks each source keeps open at once (see :func:`stoker.data.readahead.open_blocks`)."""
        return [open_blocks(s.shards, window) for s in self.sources]

    def epoch_order(self, order: Order, window: int) -> MixOrder:
        """The mix's :class:`stoker.data.epoch.EpochOrder`: what a reader's epochs follow (see
        :class:`stoker.data.mix_plan.MixOrder`), each source in ``order`` with ``window`` blocks open."""
        return MixOrder(self.spec(), self.offsets, tuple(self.bounds()), tuple(self.windows(window)), order, window,
                        self.names, tuple(s.shards.starts for s in self.sources))

    def epoch_counts(self, batch_size: int, world_size: int = 1, drop_last: bool = False) -> dict[str, int]:
        """Samples of each source in a whole epoch read in batches of ``batch_size`` on ``world_size`` ranks."""
        chunks = rank_batches(self.spec().length(), start=0, world_size=world_size, rank=0, batch_size=batch_size,
                              drop_last=drop_last).chunks()
        counts = self.epoch_order("sequential", 1).counts(0, chunks, None)
        return {name: int(n) for name, n in zip(self.names, counts.sum(axis=0))}

    # -- what a resume state records ------------------------------------------------------------------------

    def digest(self) -> str:
        """Which data sets are mixed, under which names: a resume state's ``dataset``."""
        parts = [f"{name}={source.shards.manifest.digest()}" for name, source in zip(self.names, self.sources)]
        return "mix:" + hashlib.blake2b(";".join(parts).encode(), digest_size=16).hexdigest()

    def describe(self) -> str:
        """How the sources are mixed, as a resume state records it (another value: a new mix)."""
        weights = " ".join(f"{name}={self.weights[name]:.6g}" for name in self.names)
        exact = ":".join(map(str, self._exact))
        return f"weights {weights} (exactly {exact}); epoch_size {self.epoch_size}; exhausted {self.exhausted}"

    def lookahead(self, order: np.ndarray, window: int, hint_blocks: bool = True, reads_here: bool = True,
                  trail: int = 0, home: list[np.ndarray] | None = None) -> MixLookahead:
        """Reading ahead of ``order`` (mix indices): each source's own (see :class:`Lookahead`)."""
        return MixLookahead(self, order, window, hint_blocks, reads_here, trail, home)

    def __repr__(self) -> str:
        weights = ", ".join(f"{n!r}: {w:.3g}" for n, w in self.weights.items())
        return f"Mix({{{weights}}}, samples={len(self)}, epoch_size={self.epoch_size}, exhausted={self.exhausted!r})"


class MixLookahead:
    """A :class:`Lookahead` per source over its part of a mixed order: each source's blocks are
    hinted (or its shards staged) in the order that source's samples come up."""

    def __init__(self, mix: Mix, order: np.ndarray, window: int, hint_blocks: bool = True,
                 reads_here: bool = True, trail: int = 0, home: list[np.ndarray] | None = None) -> None:
        self.mix = mix
        source_of = mix.source_of(order)
        self.positions = [np.flatnonzero(source_of == i) for i in range(len(mix.sources))]
        self.window, self.windows = window, mix.windows(window)
        self.parts = [Lookahead(s.shards, b, order[p] - mix.offsets[i], w, hint_blocks, reads_here, trail,
                                None if home is None else home[i])
                      for i, (s, b, w, p) in enumerate(zip(mix.sources, mix.bounds(), self.windows, self.positions))]

    def advance(self, position: int) -> None:
        """The reader is about to read ``order[position:]``: each source from its own position."""
        for part, mine in zip(self.parts, self.positions):
            part.advance(int(np.searchsorted(mine, position)))

    def set_depth(self, blocks: int) -> None:
        """Read ``blocks`` blocks ahead from now on, each source in proportion to its own window."""
        for part, window in zip(self.parts, self.windows):
            part.set_depth(max(1, round(blocks * window / self.window)))

    def arrival_order(self, indices: np.ndarray) -> np.ndarray:
        """Positions of ``indices`` in the order their bytes arrive: each source's in its own
        arrival order, the sources spread evenly through the result."""
        source_of = self.mix.source_of(indices)
        place = np.zeros(len(indices))
        for i, part in enumerate(self.parts):
            mine = np.flatnonzero(source_of == i)
            if len(mine):
                ranked = mine[part.arrival_order(indices[mine] - self.mix.offsets[i])]
                place[ranked] = (2 * np.arange(len(mine)) + 1) / (2 * len(mine))
        return np.lexsort((source_of, place))

    def close(self) -> None:
        """Stop every source's staging."""
        for part in self.parts:
            part.close()


def is_clip_set(source: object) -> bool:
    """Whether ``source`` is a stoker.VideoClipDataset (none exists before its module is imported,
    so looked up there, not imported: stoker.video, and PyAV, stay out of this layer)."""
    video = sys.modules.get("stoker.video.dataset")
    return video is not None and isinstance(source, video.VideoClipDataset)


def _one_kind(sources: Mapping[str, ShardDataset | ClipSet]) -> bool:
    """Whether ``sources`` are video clip sets (else image sets): one kind, or a TypeError naming each."""
    clips = [name for name, source in sources.items() if is_clip_set(source)]
    if clips and len(clips) < len(sources):
        images = [name for name in sources if name not in clips]
        raise TypeError(f"Mix mixes sources of one kind: {images} are image sets (ShardDataset), {clips} video clip "
                        "sets (VideoClipDataset); a batch holds images or clips, not both")
    return bool(clips)


def _clip_layout(sources: Mapping[str, ShardDataset | ClipSet]) -> str:
    """The layout of clip sets ``sources``, which must give clips of one shape (a batch stacks them)."""
    shapes = {name: (s.clip_len, s.clips_per_video, s.layout) for name, s in sources.items()
              if not isinstance(s, ShardDataset)}
    if len(set(shapes.values())) > 1:
        given = ", ".join(f"{name}: clip_len={n}, clips_per_video={c}, layout={lay}" for name, (n, c, lay) in shapes.items())
        raise OptionError(f"Mix's clip sets give clips of different shapes ({given}): a batch stacks them, so give "
                         "every source the same clip_len, clips_per_video and layout")
    return next(iter(shapes.values()))[2]


def _class_count(name: str, source: ShardDataset | ClipSet) -> int:
    """How many mix labels ``source`` takes: its classes, else its largest label + 1, else (no labels) one."""
    if source.classes:
        return len(source.classes)
    targets = source.targets
    if (targets < 0).all():
        return 1
    if (targets < 0).any():
        raise StokerError(f"{source.root}: Mix source {name!r} has negative labels: Mix shifts each source's labels "
                          "into one class space of labels 0, 1, ...")
    return int(targets.max()) + 1


def _array(labels: np.ndarray | torch.Tensor) -> np.ndarray:
    return labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels, np.int64)
