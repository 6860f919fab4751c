"""stoker.Loader: batches of decoded, cropped images from a ShardDataset, made by threads.

    order (pure function of seed, epoch) ──dealt to ranks──> batches of indices
        │  for each of the next ``prefetch`` batches: one preallocated uint8 tensor (B, H, W, 3)
        └─> thread pool (thread_batches.py): read member (pread) ─> decode at reduced DCT scale ─> crop, resize, flip
                          straight into the batch tensor (decoders and OpenCV release the GIL)
                          ─> optional per-sample transform
    __iter__ yields (images, labels) in order; images are NCHW views of NHWC memory (channels_last)

A VideoClipDataset, or a Mix of them, gives batches of clips the same way (stoker/loader/clips.py):
(B, T, H, W, 3), one crop and flip per clip.

By default no worker processes: nothing is pickled, copied between processes or started per
epoch. With ``processes=N`` (for per-sample transforms that hold the GIL) a torch DataLoader's
workers make the batches with the same code, into a ring of shared buffers (process_batches.py).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from stoker.augment.pipeline import Augment
from stoker.data.dataset import ShardDataset
from stoker.data.epoch import EpochPlan, Order, RankBatches
from stoker.data.mix import Mix
from stoker.data.passes import Passes, PassesReader
from stoker.data.readable import fetches_per_process, reads_ahead
from stoker.data.readahead import ReadsAhead
from stoker.env import warn_fallback_once
from stoker.errors import OptionError
from stoker.loader.arguments import check_crop, device_of, gpu_for_decoding, maker_type, plan_transform
from stoker.loader.batches import BatchMaker, OnError, SampleTransform, ThreadAugment
from stoker.loader.buffers import BatchRing
from stoker.loader.crops import CropSpec
from stoker.loader.opencv_threads import with_one_opencv_thread
from stoker.loader.process_batches import WorkerProcesses
from stoker.loader.sampler_views import LoaderBatchSampler, LoaderSampler
from stoker.loader.thread_batches import Made, made_in_threads
from stoker.loader.torchvision_plan import PerSample
from stoker.loader.workers import FirstBatches, WorkerChoice, available_cores, choose_workers
from stoker.ranges import DECODE, EPOCH, LAYOUT, MP_CONTEXT, ON_ERROR, ORDER, PREFETCH, PROCESSES, THREADS

if TYPE_CHECKING:
    from stoker.video.dataset import VideoClipDataset


_log = logging.getLogger(__name__)


class Loader(PassesReader):
    """Iterate ``(images, labels)`` batches of ``dataset`` (a ShardDataset), like a DataLoader.

    With a :class:`stoker.VideoClipDataset` (or a :class:`stoker.Mix` of them) the batches are
    clips, (B, T, H, W, 3) uint8 (with several clips per video, (B, clips, T, H, W, 3)): ``crop``
    cuts every frame of a clip the same way, each frame decoded at the smallest JPEG DCT scale the
    crop allows (frames mode). The frames of each clip are chosen as its data set's ``sampling``
    says, drawn from the loader's ``seed`` and epoch. ``layout`` defaults to the data set's (THWC, or TCHW for (B, T, 3, H, W)).

    ``crop`` says what every image becomes (see :class:`CropSpec`; default RandomResizedCrop to
    224x224 with flips). ``order``: ``quasi_random`` (default; blocks of a shard shuffled, read
    whole), ``random`` or ``sequential``. The same ``seed`` and epoch give the same order and the
    same crops whatever ``threads`` is. Without ``seed`` it is drawn from torch's global generator,
    as a DataLoader's RandomSampler draws its own: ``torch.manual_seed(s)`` before making the
    Loader repeats a run, and an unseeded run does not replay another's epochs (under DDP, rank 0's
    draw is sent to every rank over torch.distributed; without a process group, give ``seed``).

    Passes keep a DataLoader's contract (stoker/data/passes.py): every ``iter()`` is a whole pass
    over the current epoch from its start, unless :meth:`load_state_dict` loaded a state since the
    last pass began, which the pass then resumes at the next unseen batch (reading nothing of the
    epoch before it; see :mod:`stoker.state`). A pass handed out whole advances the epoch; a pass
    left early (a peek, Lightning's sanity check) does not, so the next one starts that epoch
    again. ``start_epoch`` and :meth:`set_epoch` (also ``loader.sampler.set_epoch``, as timm and
    Lightning call it) name the epoch of the next pass. ``len`` is a whole pass's batches on this
    rank, as a DataLoader's: a resumed pass gives the rest of them, and a trainer that counts its
    steps (Lightning) stops at ``len``. ``sampler``, ``batch_sampler``, ``dataset``,
    ``batch_size`` and ``drop_last`` are there as a DataLoader has them (sampler_views.py).

    Batches are ``layout`` NCHW (a view of channels_last memory) or NHWC; ``device`` copies them
    there through pinned memory. Under DDP (``rank`` and ``world_size`` default to
    torch.distributed's, else the RANK / WORLD_SIZE environment) the epoch's one global order (the
    same for any world size: :mod:`stoker.data.epoch`) is dealt to the ranks a batch at a time, in
    turn, so each step's global batch is a contiguous slice of it.
    Nothing is repeated: a short last global batch is split near-evenly over the ranks (with fewer
    samples left than ranks, the last ranks end one step early); ``drop_last`` drops it, so every
    rank yields the same number of batches. The state counts the epoch's samples across all ranks:
    rank 0's resumes every rank, on this world size or another, with the same global batch
    (``batch_size * world_size`` as saved) or the same per-rank ``batch_size``
    (docs/distributed.md); crops are drawn per batch from where it lies in the epoch's order.

    ``transform``: a torchvision pipeline (v1 or v2, e.g. your ImageFolder's ``T.Compose([...])``)
    is read as three parts (stoker/loader/torchvision_plan.py): its leading geometry becomes the
    fused crop, the ops stoker.augment has after it run batched (parameters drawn per batch, each
    image augmented by the thread that decoded it; on ``device``'s GPU when one is given), and the
    rest runs per sample as given. The batches are what the pipeline gives through a DataLoader
    (dtype, range, (B, C, H, W), normalisation); :meth:`explain` says what runs where and why.
    Any other callable runs on every sample after the crop: it gets a (3, H, W) uint8 tensor, or
    (T, 3, H, W) for a clip (what torchvision v2 transforms take), and returns a tensor; the
    batch is those tensors stacked, and ``layout`` no longer applies. A transform that holds the
    GIL (most Python code) serializes the threads: ``processes=N`` makes batches in N worker
    processes instead, each with ``threads`` threads (default 1; ``mp_context``: ``fork``,
    ``spawn`` or ``forkserver``; default the platform's). Given neither, the Loader chooses: threads
    (one more than the cores) for its first pass, and from then on worker processes where those
    threads used a fraction of the cores while the loop waited (the GIL's limit; see
    stoker/loader/workers.py); ``workers`` and :meth:`explain` say what it chose and why. The
    batches are the same whatever ``processes`` and ``threads`` are, except for what per-sample
    random ops draw with several threads in a process (from the global generators, in the order
    the threads run).

    ``decode="gpu"``: the threads only read bytes, and the GPU (``device``, default this rank's:
    see :func:`stoker.augment.default_device`) decodes each batch with nvJPEG and crops it there
    (stoker/loader/gpu_decode.py; needs CUDA and the ``gpu`` extra). Images nvJPEG cannot take
    are decoded on the CPU, with a warning.

    ``on_error`` (default: the data set's, as ShardDataset has it): ``raise`` stops at a damaged
    sample with a CorruptDataError naming shard and key; ``skip`` puts the next readable sample in
    its place (same crop), counts it in ``skipped`` and in :func:`stoker.watch`'s lines. JPEGs the
    fast decoders refuse are decoded by Pillow, so the Loader and ShardDataset agree on which
    images are good. Storage that fails (RemoteError) always raises.
    """

    def __init__(
        self,
        dataset: ShardDataset | Mix | VideoClipDataset,
        batch_size: int,
        *,
        crop: CropSpec | None = None,
        order: Order = "quasi_random",
        threads: int | None = None,
        prefetch: int = 2,
        seed: int | None = None,
        start_epoch: int = 0,
        drop_last: bool = False,
        window: int = 16,
        layout: Literal["NCHW", "NHWC"] | None = None,
        device: torch.device | str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        transform: SampleTransform | None = None,
        processes: int | None = None,
        mp_context: str | None = None,
        decode: Literal["cpu", "gpu"] = "cpu",
        on_error: OnError | None = None,
    ) -> None:
        self._maker_type = maker_type(dataset)  # first: anything the Loader cannot read is refused, saying so
        if dataset.transform is not None or getattr(dataset, "target_transform", None) is not None:
            raise OptionError("Loader decodes and crops itself and runs per-sample transforms after the crop: "
                              "pass Loader(transform=...) and a data set without transform/target_transform")
        self.order, self.decode = ORDER.check(order), DECODE.check(decode)
        on_error = ON_ERROR.check(on_error) or getattr(dataset, "on_error", "raise")
        if on_error == "skip" and decode == "gpu":
            raise OptionError("on_error='skip' needs decode='cpu': images are decoded on the GPU as a whole batch")
        if isinstance(dataset, Mix) and decode == "gpu":
            raise OptionError("decode='gpu' reads one ShardDataset: a stoker.Mix is decoded on the CPU (decode='cpu')")
        self.dataset = dataset
        self._transform_plan = plan_transform(self._maker_type, transform, check_crop(crop))
        self.crop = self._transform_plan.crop
        # One more thread than cores: a thread waiting on the disk then leaves no core idle. Measured
        # here (2 cores, HDD profile, cold cache) 3 threads gave ~1,320 img/s against ~1,210 for 2;
        # with a warm cache the two were within noise (2,036 and 1,999). With processes: threads
        # per process, 1 unless given.
        threads = None if threads is None else THREADS.check(threads)
        processes = None if processes is None else PROCESSES.check(processes)
        # Left to choose (neither given): threads first, then what the first batches measure (workers.py).
        self._first_batches = FirstBatches() if processes is None and threads is None and decode == "cpu" else None
        processes = processes or 0
        self.threads = threads or (1 if processes else available_cores() + 1)
        self.workers = WorkerChoice(processes, self.threads, "as given" if self._first_batches is None else
                                    "threads until the first batches are measured")
        self.prefetch = PREFETCH.check(prefetch)
        # clips: the data set's layout (images: NCHW)
        self.layout = LAYOUT.check(layout) or ("NHWC" if not isinstance(dataset, ShardDataset) and
                                               dataset.layout == "THWC" else "NCHW")
        self.device = device_of(device)
        if decode == "gpu":
            self.device = gpu_for_decoding(self._maker_type, self._transform_plan, processes, self.device)
        else:
            warn_fallback_once()  # JPEGs decoded whole: the region-decode extension is missing here
        self.processes = processes
        self.mp_context = MP_CONTEXT.check(mp_context)
        self.transform = transform
        needs_augment = bool(self._transform_plan.ops) or self._transform_plan.stage == "float"
        self._on_device = needs_augment and not self._transform_plan.per_sample and self.device is not None \
            and self.device.type != "cpu"
        self._in_threads_augment = needs_augment and not self._on_device
        self._thread_augment: ThreadAugment | None = None  # the threads' batched augmentation, made on first use
        self.on_error = on_error
        self.skipped = 0  # damaged samples skipped so far, in all passes
        self._ring: BatchRing | None = None  # the batch buffers, made on the first pass
        self._workers: WorkerProcesses | None = None  # with processes: kept from one whole pass to the next
        # Last: with no seed given under DDP, every rank's Loader sends or takes rank 0's drawn seed here.
        self._passes = Passes("Loader", dataset, self.order, window, seed=seed, start_epoch=start_epoch, rank=rank,
                              world_size=world_size, batch_size=batch_size, drop_last=drop_last)
        self.rank, self.world_size = self._passes.rank, self._passes.world_size
        self.batch_size, self.drop_last = self._passes.batch_size, self._passes.drop_last
        self._epoch_order = self._passes.epoch_order
        self.window = self._epoch_order.window
        if transform is not None:
            _log.info("%s", self.explain())

    @property
    def sampler(self) -> LoaderSampler:
        """As a DataLoader's: this rank's indices of a whole pass, whose ``set_epoch`` is the Loader's.
        Made when asked for: a view held by the Loader would keep it (its buffers, its worker
        processes) alive until the garbage collector finds the cycle."""
        return LoaderSampler(self.indices, self._rank_samples, self.set_epoch)

    @property
    def batch_sampler(self) -> LoaderBatchSampler:
        """As a DataLoader's: :attr:`sampler` cut into this rank's batches."""
        return LoaderBatchSampler(self.sampler, self.batch_size, self.drop_last, self.__len__)

    def explain(self) -> str:
        """What the next pass reads (epoch, where in it, seed and where the seed came from), and
        what the loader does with its ``transform``, step by step: fused into the decode, batched
        (and where), or per sample as given, each with the reason."""
        maker = self._batch_maker(self._passes.batches(self._passes.upcoming()[1]))
        if self._on_device:
            where = f"stoker.augment on {self.device}, whole batches"
        else:
            where = f"stoker.augment on the CPU, {maker.augment_route()}, parameters drawn per batch"
        if self.processes:
            where += f", in {self.processes} worker processes of {self.threads} thread{'s' * (self.threads > 1)} each"
        head = f"stoker.Loader({type(self.dataset).__name__}, batch_size={self.batch_size}): what runs where"
        passes = f"  next pass: {self._passes.describe_next()}"
        workers = f"  workers: {self.workers.describe()} ({self.workers.reason})"
        route = f"  read, decode, crop: {maker.decode_route()}"
        text = "\n".join((head, passes, workers, route, self._transform_plan.explain(where)))
        if self._transform_plan.per_sample and self.processes == 0:
            text += ("\n  note: random ops that run per sample draw from torch's and Python's global generators, as in "
                     "a DataLoader: not fixed by seed with threads; processes=N seeds them per batch")
        return text

    def __len__(self) -> int:
        """Batches of a whole pass over an epoch on this rank, as a DataLoader counts them: every
        pass that no loaded state starts gives these. A resumed pass gives the rest of them; a
        trainer that keeps its own count of the steps done (Lightning restores it from its
        checkpoint) and stops at ``len`` ends the epoch where the Loader does. After a resume that
        keeps the per-rank batch on more ranks, the rest of the epoch has more steps than that (see
        docs/distributed.md)."""
        return len(self._passes.batches(0))

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is (a :class:`stoker.state.Position`): the samples of the epoch's global
        sequence consumed by all ranks, so resuming from it yields exactly the batches not yet
        yielded, on this world size or another; after a pass left early, where it was left. Save it
        with the model's checkpoint, after the step that used the last batch: rank 0's serves every
        rank (ranks step together; at the epoch's last step, when the last ranks have ended one step
        early, only rank 0's is right)."""
        cursor = self._passes.cursor
        return self._passes.record(cursor.position, cursor.consumed).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next pass continues from a :meth:`state_dict`, saved by any rank of any world size:
        the rest of its epoch is dealt to this loader's ranks, with the same global batch
        (``batch_size * world_size`` as saved; each rank's batch changes) or the same per-rank
        ``batch_size``. A state saved for another data set, order (``order``, ``window``, the data
        set's blocks, ``drop_last``), with a batch size that keeps neither, or by another part is
        refused (StateError, saying what would work). The state's seed is taken (with a
        StateWarning when ``seed=`` was given and differs)."""
        saved, mode = self._passes.load(state)
        if saved.world_size != self.world_size or saved.batch_size != self.batch_size:
            _log.info("stoker.Loader: resuming a state of %d ranks x %d on %d ranks x %d (%s)", saved.world_size,
                      saved.batch_size, self.world_size, self.batch_size, mode)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A new pass (see the class's docstring); it begins when its first batch is asked for."""
        return self._pass(self._passes.begin())

    def _pass(self, number: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Pass ``number``'s batches: from where the cursor is when its first batch is asked for."""
        if self._first_batches is not None and self._first_batches.result is not None:
            self._choose_workers(*self._first_batches.result)
        cursor = self._passes.cursor
        if self._passes.latest(number):
            cursor.started()
        plan = self._passes.plan(cursor.epoch, cursor.position, cursor.consumed)
        # Whole blocks ahead of a fully random order would be read for one sample each: no hints there.
        ahead = reads_ahead(self.dataset, self._epoch_order, plan.share, hint_blocks=self.order != "random",
                            reads_here=self.processes == 0)
        # Hints go through a thread of their own: under a throttled disk posix_fadvise can block
        # while the kernel queues the reads, and the batch pipeline must not wait for that.
        hints = ThreadPoolExecutor(1, thread_name_prefix="stoker-loader-readahead")
        maker = self._batch_maker(plan.batches)
        make = self._in_processes if self.processes > 0 else self._in_threads
        batches = with_one_opencv_thread(make(maker, plan, hints, ahead))  # the pass runs its own threads
        try:
            for batch, (images, labels), skipped in batches:
                self.skipped += skipped
                if self._passes.latest(number):  # a newer iter() owns the cursor
                    cursor.position, cursor.consumed = plan.batches.samples_done(batch + 1), plan.consumed(batch + 1)
                    cursor.finished = batch + 1 == len(plan.batches)
                yield self._deliver(images, labels, maker.augment_step(plan.epoch, batch))
            if self._passes.latest(number):
                cursor.next_epoch()
        finally:
            batches.close()  # stops the threads or worker processes now, not when collected
            hints.shutdown(wait=True, cancel_futures=True)
            ahead.close()

    def _choose_workers(self, cores_used: float, waited: float) -> None:
        """Run the next passes as the first batches say (:func:`choose_workers`), and stop measuring."""
        self.workers = choose_workers(available_cores(), self.threads, cores_used, waited,
                                      fetches_per_process(self.dataset))
        self.processes, self.threads = self.workers.processes, self.workers.threads
        self._first_batches = None
        _log.info("stoker.Loader: %s (%s)", self.workers.describe(), self.workers.reason)

    def watch_note(self) -> str:
        """For :func:`stoker.watch`'s lines: the damaged samples skipped, when there were any."""
        return f"{self.skipped} damaged sample{'' if self.skipped == 1 else 's'} skipped" if self.skipped else ""

    def _batch_maker(self, batches: RankBatches) -> BatchMaker:
        """What makes the batches of a pass, keying its draws by where ``batches`` puts them in the epoch."""
        steps = self._transform_plan
        per_sample = PerSample(steps.per_sample, steps.given) if steps.per_sample else None
        args = (per_sample, self.seed, batches, self.on_error)
        dataset = self.dataset
        if self.decode == "gpu":
            from stoker.loader.gpu_decode import GpuBatchMaker

            # _gpu_for_decoding has refused video clips and a missing crop, and set the device
            assert isinstance(dataset, ShardDataset) and self.crop is not None and self.device is not None
            return GpuBatchMaker(dataset, self.crop, *args, device=self.device)
        augment = None
        if self._in_threads_augment:
            # One per seed, not per pass: worker processes are kept between passes whose makers are equal.
            if self._thread_augment is None or self._thread_augment.augment.seed != self.seed:
                dtype = torch.uint8 if steps.stage == "uint8" else steps.dtype
                self._thread_augment = ThreadAugment(Augment(*steps.ops, seed=self.seed, device="cpu",
                                                             backend="opencv", threads=1), dtype)
            augment = self._thread_augment
        if self._maker_type is BatchMaker:
            assert isinstance(dataset, (ShardDataset, Mix))  # _maker_type: images
            return BatchMaker(dataset, self.crop, *args, augment=augment)
        from stoker.loader.clips import ClipBatchMaker

        assert not isinstance(dataset, ShardDataset)  # _maker_type: clips, of a VideoClipDataset or a Mix of them
        assert self.crop is not None  # _plan_transform gives clips a crop (CropSpec() by default)
        return ClipBatchMaker(dataset, self.crop, *args, augment=augment)

    def _in_threads(self, maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor,
                    ahead: ReadsAhead) -> Generator[Made, None, None]:
        """Batches made by this process's threads (thread_batches.py), into the ring's buffers."""
        if self._ring is None and self.decode == "cpu":  # decode="gpu" makes its pixels on the GPU
            self._ring = BatchRing((self._rows(), *maker.buffer_shape()), self.prefetch + 1)
        return made_in_threads(maker, plan, hints, ahead, ring=self._ring, threads=self.threads,
                               prefetch=self.prefetch, batch_size=self.batch_size, first_batches=self._first_batches)

    def _in_processes(self, maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor,
                      ahead: ReadsAhead) -> Generator[Made, None, None]:
        """Batches made by ``processes`` worker processes into a shared ring (process_batches.py),
        kept from one whole pass to the next while they make batches this way."""
        workers = self._workers = WorkerProcesses.for_pass(self._workers, maker, self.batch_size, self._rows(),
                                                           self.processes, self.threads, self.prefetch, self.mp_context)
        hints.submit(ahead.advance, 0)
        for batch, made, skipped in workers.batches(plan.epoch, plan.share, range(len(plan.batches))):
            hints.submit(ahead.advance, (batch + workers.queued) * self.batch_size)
            yield batch, made, skipped

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The sample indices this rank reads in a whole pass over ``epoch`` (default: the current
        one, :attr:`epoch`) from its start, in order."""
        return self._passes.plan(self.epoch if epoch is None else EPOCH.check(epoch), 0).share

    def _rows(self) -> int:
        """The samples a batch buffer holds: ``batch_size``, or the epoch's where it has fewer (a
        DataLoader gives a batch of 10**7 over 100 samples as one of 100)."""
        return min(self.batch_size, len(self._epoch_order))

    def _rank_samples(self) -> int:
        """This rank's samples in a whole pass (``len(loader.sampler)``)."""
        return self._passes.batches(0).samples

    def _deliver(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch as the user gets it: NCHW view, on ``device``, augmented there (``step``: the
        batch's draw of the augmentation's parameters)."""
        steps = self._transform_plan
        if (self.layout == "NCHW" or steps.stage == "float") and not steps.per_sample:
            images = images.movedim(-1, -3)  # NCHW view of NHWC memory: torch.channels_last (per frame of a clip)
        if self.device is not None and self.device.type != "cpu":
            if images.device.type == "cpu":  # not decoded on the GPU already (decode="gpu")
                images = images.pin_memory().to(self.device, non_blocking=True)
            labels = labels.pin_memory().to(self.device, non_blocking=True)
        if self._on_device:
            dtype = torch.float32 if steps.stage == "uint8" else steps.dtype
            images = Augment(*steps.ops, seed=self.seed, device=self.device, dtype=dtype, backend="torch",
                             layout="NCHW")(images, step=step)
            if steps.stage == "uint8":  # the pipeline's batches are uint8: rounded back
                images = images.mul_(255).round_().to(torch.uint8)
        return images, labels

