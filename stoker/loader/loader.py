"""stoker.Loader: a DataLoader's batches, made by threads (or worker processes) that read each
sample, decode only what its crop needs and crop it straight into reused batch buffers.

The Loader checks its options (arguments.py, stoker/ranges.py), takes its plan (plan.py: every
decision about its passes, made once) and runs each pass: the batch engine the plan calls for
(engine.py, batches.py) in threads (thread_batches.py) or worker processes (process_batches.py),
each batch delivered as the plan says (delivery.py). docs/architecture.md, "How a batch is made",
follows one batch from the plan to the pixels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from stoker.data.dataset import ShardDataset
from stoker.data.epoch import EpochPlan, Order
from stoker.data.mix import Mix
from stoker.data.passes import Passes, PassesReader
from stoker.data.readable import reads_ahead, storage_lines_of, storage_of
from stoker.data.readahead import ReadsAhead
from stoker.decode.crops import CropSpec
from stoker.env import warn_fallback_once
from stoker.errors import OptionError
from stoker.loader.arguments import check_crop, check_transform, describe, device_of
from stoker.loader.batches import BatchMaker, Made, OnError, SampleTransform
from stoker.loader.buffers import BatchRing
from stoker.loader.delivery import deliver
from stoker.loader.engine import engine_for
from stoker.loader.opencv_threads import with_one_opencv_thread
from stoker.loader.plan import Options, machine, plan_loader
from stoker.loader.process_batches import WorkerProcesses
from stoker.loader.sampler_views import LoaderBatchSampler, LoaderSampler
from stoker.loader.served import ServedBatches
from stoker.loader.thread_batches import made_in_threads
from stoker.loader.tuning import Tuning, batch_bytes
from stoker.loader.workers import WorkerChoice
from stoker.ranges import DECODE, ECHO, EPOCH, LAYOUT, MP_CONTEXT, ON_ERROR, ORDER, PREFETCH, PROCESSES, THREADS, TUNE
from stoker.tune.settings import ECHO_BATCHES
from stoker.tune.tuner import Decision

if TYPE_CHECKING:
    from stoker.video.dataset import VideoClipDataset


_log = logging.getLogger(__name__)


class Loader(PassesReader):
    """Iterate ``(images, labels)`` batches of ``dataset`` like a DataLoader: a ShardDataset, a
    :class:`stoker.Mix` of them, or a :class:`stoker.VideoClipDataset` or a Mix of those (batches of
    clips, (B, T, H, W, 3) uint8 or (B, clips, T, H, W, 3), every frame of a clip cut alike, its
    frames drawn from the loader's seed and epoch; ``layout`` defaults to the clips', THWC or TCHW).

    Each sample is read, decoded at the smallest JPEG DCT scale its ``crop`` allows (a
    :class:`CropSpec`; default RandomResizedCrop to 224x224 with flips), cropped, resized and
    flipped straight into the batch by ``threads`` threads, or by ``processes`` worker processes of
    ``threads`` each (``mp_context``: ``fork``, ``spawn`` or ``forkserver``). Given neither, threads
    (one more than the cores), then what the tuner finds (``workers`` says which and why).
    ``decode="gpu"``: the threads read bytes and nvJPEG decodes and crops each batch on ``device``
    (default: this rank's GPU; the ``gpu`` extra). Every such decision is in the Loader's plan
    (stoker/loader/plan.py; a tuner's decision makes a new one); :meth:`explain` says it.

    ``transform``: a torchvision pipeline (v1, v2, timm's) gives the batches it gives through a
    DataLoader over ImageFolder: its leading geometry fused into the decode, the stoker.augment ops
    after it batched (on ``device``'s GPU when one is given), the rest per sample as given. Any
    other callable gets each crop as a (3, H, W) uint8 tensor ((T, 3, H, W) for a clip), and the
    batch is the results stacked. Batches are ``layout`` NCHW (a view of channels_last memory) or
    NHWC, copied to ``device`` when given. ``order``: ``quasi_random`` (default; blocks of a shard
    read whole), ``random`` or ``sequential``. The same ``seed`` and epoch give the same order and
    crops whatever the threads and processes; without ``seed`` it is drawn from torch's global
    generator, as a RandomSampler draws its own (under DDP, rank 0's draw is sent to every rank:
    making the Loader is then a collective call, so make it on every rank, in the same order as the
    other stoker readers, or give ``seed=``; a Loader made on rank 0 alone waits for the others).

    Passes keep a DataLoader's contract (stoker/data/passes.py): every ``iter()`` is a whole pass
    over the current epoch from its start, unless :meth:`load_state_dict` loaded a state since the
    last pass began, which the pass resumes; a pass handed out whole advances the epoch, one left
    early does not; ``start_epoch`` and :meth:`set_epoch` name the next pass's epoch; ``len`` is a
    whole pass's batches on this rank. ``sampler``, ``batch_sampler``, ``dataset``, ``batch_size``
    and ``drop_last`` are there as a DataLoader has them. Under DDP (``rank``, ``world_size``:
    torch.distributed's, else RANK / WORLD_SIZE) the epoch is dealt to the ranks a batch at a time:
    on one node from one global order; on several ``nodes`` (default: torchrun's LOCAL_WORLD_SIZE)
    each rank's batches come from its node's ``partitions`` of whole shards (default: a few per
    node), so that each node reads its share; ``drop_last`` drops a short last global batch; rank
    0's state resumes every rank, on any world size and node count (docs/distributed.md). ``on_error`` (default: the data set's):
    ``raise`` a CorruptDataError naming shard and key, or ``skip`` to the next readable sample
    (counted in ``skipped``).

    ``tune`` (default True): the Loader measures itself while it runs and, at batch boundaries,
    changes its threads or worker processes, ``prefetch``, the blocks read ahead and an object
    store's reads in flight and their size, keeping a change only when measured faster
    (stoker/tune, loader/tuning.py; ``decisions`` and :meth:`explain` list them, stoker.watch shows
    them); arguments given are kept as given, and no batch changes. ``echo="auto"``: the tuner may
    also serve echoes of recent batches while no fresh one is ready, once nothing else helps. The
    user guide's section 5 says all of it at length.
    """

    def __init__(
        self,
        dataset: ShardDataset | Mix | VideoClipDataset,
        batch_size: int,
        *,
        crop: CropSpec | None = None,
        order: Order = "quasi_random",
        threads: int | None = None,
        prefetch: int | None = None,
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
        tune: bool = True,
        echo: Literal["auto"] | None = None,
        nodes: int | None = None,
        partitions: int | None = None,
    ) -> None:
        data = describe(dataset)  # first: anything the Loader cannot read is refused, saying so
        self.dataset, self.order, self.decode = dataset, ORDER.check(order), DECODE.check(decode)
        self.transform = check_transform(transform)
        self.on_error: OnError = ON_ERROR.check(on_error) or getattr(dataset, "on_error", "raise")
        self.tune, self.echo = TUNE.check(tune), ECHO.check(echo)
        if echo is not None and not tune:
            raise OptionError("echo='auto' lets the tuner echo batches while the input lags: it needs tune=True")
        options = Options(check_crop(crop), transform, None if threads is None else THREADS.check(threads),
                          None if processes is None else PROCESSES.check(processes), self.decode, device_of(device),
                          LAYOUT.check(layout), self.on_error, None if prefetch is None else PREFETCH.check(prefetch),
                          tune, echo, window, hints=self.order != "random")
        self.mp_context = MP_CONTEXT.check(mp_context)
        # Every decision about the passes (plan.py); the tuner's decisions, or with tune=False a
        # measured first pass, replace it with a new one.
        self._plan = plan_loader(data, options, machine(self.decode))
        self.crop, self.layout, self.device = self._plan.crop, self._plan.layout, self._plan.device
        if self.decode == "cpu":
            warn_fallback_once()  # JPEGs decoded whole: the region-decode extension is missing here
        self._tuning: Tuning | None = None  # made on the first pass, which knows a batch's bytes
        self._noted: set[Decision] = set()  # the decisions stoker.watch has shown
        self.skipped = 0  # damaged samples skipped so far, in all passes
        self._ring: BatchRing | None = None  # the batch buffers, made on the first pass
        self._workers: WorkerProcesses | None = None  # with processes: kept from one whole pass to the next
        # Last: with no seed given under DDP, every rank's Loader sends or takes rank 0's drawn seed here.
        self._passes = Passes("Loader", dataset, self.order, window, seed=seed, start_epoch=start_epoch, rank=rank,
                              world_size=world_size, batch_size=batch_size, drop_last=drop_last, nodes=nodes,
                              partitions=partitions)
        self.rank, self.world_size = self._passes.rank, self._passes.world_size
        self.batch_size, self.drop_last = self._passes.batch_size, self._passes.drop_last
        self._epoch_order = self._passes.epoch_order
        self.window = self._epoch_order.window
        if transform is not None:
            _log.info("%s", self.explain())

    @property
    def workers(self) -> WorkerChoice:
        """The worker processes and threads the next pass runs, and why: the plan's."""
        return self._plan.workers

    @property
    def prefetch(self) -> int:
        """The batches the next one made ahead of the loop (the plan's settings: given, or tuned)."""
        return self._plan.settings.prefetch

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """The tuner's latest decisions, each with the measurement behind it (explain() lists them)."""
        return self._plan.decisions

    @property
    def processes(self) -> int:
        """The worker processes the next pass runs (0: threads in the loop's process)."""
        return self._plan.workers.processes

    @property
    def threads(self) -> int:
        """The threads the next pass runs in each process."""
        return self._plan.workers.threads

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
        """What the next pass reads (epoch, where in it, seed and where the seed came from), where
        its bytes come from and where the node keeps them, and what the loader does with its
        ``transform``, step by step: fused into the decode, batched (and where), or per sample as
        given, each with the reason."""
        head = f"stoker.Loader({type(self.dataset).__name__}, batch_size={self.batch_size}): what runs where"
        storage = "".join(f"\n  storage: {line}" for line in storage_lines_of(self.dataset))
        return self._plan.explain(head, "\n".join([f"  next pass: {self._passes.describe_next()}{storage}",
                                                    *self._passes.describe_placement()]))

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
        tuning = self._tuning
        if tuning is not None and tuning.first_pass is not None and self._plan.measuring:
            self._plan = self._plan.measured(*tuning.first_pass)  # tune=False: the choice measured, a new plan
            _log.info("stoker.Loader: %s (%s)", self.workers.describe(), self.workers.reason)
        plan = self._passes.start(number)
        maker = engine_for(self._plan, self.dataset, self.seed, plan.batches, self.on_error)
        if tuning is None:
            tuning = self._tuning = Tuning(self._plan, storage_of(self.dataset),
                                           batch_bytes(self._rows(), maker.buffer_shape()))
        # Whole blocks ahead of a fully random order would be read for one sample each: no hints there.
        ahead = reads_ahead(self.dataset, self._epoch_order, plan.share, hint_blocks=self.order != "random",
                            reads_here=self.processes == 0, trail=self._most_prefetch() * self.batch_size,
                            home=self._passes.home_shards())
        ahead.set_depth(self._plan.settings.readahead)
        # Hints go through a thread of their own: under a throttled disk posix_fadvise can block
        # while the kernel queues the reads, and the batch pipeline must not wait for that.
        hints = ThreadPoolExecutor(1, thread_name_prefix="stoker-loader-readahead")
        made = with_one_opencv_thread(self._made(maker, plan, hints, ahead))  # the pass runs its own threads
        served = ServedBatches(made, lambda: self._plan.settings.echo, self.seed + plan.epoch, self)
        try:
            while True:
                asked = time.perf_counter()
                batch = served.next()
                if batch is None:
                    break
                if batch.made is not None:
                    number_in_pass, (images, labels), skipped = batch.made
                    self.skipped += skipped
                    self._passes.progress(number, plan, number_in_pass + 1)
                    delivered = deliver(self._plan, images, labels, self.seed,
                                        maker.augment_step(plan.epoch, number_in_pass))
                    served.keep(delivered)
                else:
                    assert batch.echo is not None
                    delivered = batch.echo
                self._plan = tuning.served(self._plan, len(delivered[1]), batch.made is not None,
                                           time.perf_counter() - asked, ahead)
                yield delivered
            if self._passes.latest(number):
                self._passes.cursor.next_epoch()
        finally:
            served.close()
            made.close()  # stops the threads or worker processes now, not when collected
            hints.shutdown(wait=True, cancel_futures=True)
            ahead.close()

    def _made(self, maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor,
              ahead: ReadsAhead) -> Generator[Made, None, None]:
        """The pass's batches in order, in runs: each made by threads or by worker processes as the
        plan says when the run starts; a decision for the other (or, with processes, for other
        counts) ends the run after the batches it handed out, and the next run makes the rest."""
        start = 0
        while start < len(plan.batches):
            numbers = range(start, len(plan.batches))
            if self._plan.settings.processes:
                run = self._in_processes(maker, plan, hints, ahead, numbers)
            else:
                if self._workers is not None and not self._workers.running:
                    self._workers.close()  # back to threads: the worker processes are let go
                    self._workers = None
                run = self._in_threads(maker, plan, hints, ahead, numbers)
            for made in run:
                start = made[0] + 1
                yield made

    def watch_note(self) -> str:
        """For :func:`stoker.watch`'s lines: the tuner's decisions since the last line (each with
        the measurement behind it), and the damaged samples skipped, when there were any."""
        notes = [f"tuner: {decision.describe()}" for decision in self._plan.decisions if decision not in self._noted]
        self._noted = set(self._plan.decisions)
        if self.skipped:
            notes.append(f"{self.skipped} damaged sample{'' if self.skipped == 1 else 's'} skipped")
        return "; ".join(notes)

    def _most_prefetch(self) -> int:
        """The most batches the pass may make ahead of the loop: the tuner's bound, else ``prefetch``."""
        return (self._tuning.most_prefetch if self._tuning is not None else None) or self.prefetch

    def _in_threads(self, maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor, ahead: ReadsAhead,
                    numbers: range) -> Generator[Made, None, None]:
        """Batches ``numbers`` made by this process's threads (thread_batches.py), into the ring's
        buffers: room for as many batches ahead as the tuner may ask, and the batches echoes are
        drawn from (buffers are made only when first needed)."""
        assert self._tuning is not None
        if self._ring is None:  # (decode="gpu": buffers of no bytes, its pixels are made on the GPU)
            most = self._most_prefetch()
            # With echoes: the batches they are drawn from, the one handed to the loop's thread and the one kept next.
            echoes = ECHO_BATCHES + 2 if self._plan.bounds is not None and self._plan.bounds.free("echo") else 0
            self._ring = BatchRing((self._rows(), *maker.buffer_shape()), most + 1 + echoes)
        return made_in_threads(maker, plan, hints, ahead, ring=self._ring, numbers=numbers, batch_size=self.batch_size,
                               settings=lambda: self._plan.settings, meter=self._tuning.meter)

    def _in_processes(self, maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor, ahead: ReadsAhead,
                      numbers: range) -> Generator[Made, None, None]:
        """Batches ``numbers`` made by worker processes into a shared ring (process_batches.py),
        kept from one whole pass to the next while they make batches this way, until the plan asks
        for other counts."""
        assert self._tuning is not None
        settings = self._plan.settings
        workers = self._workers = WorkerProcesses.for_pass(self._workers, maker, self.batch_size, self._rows(),
                                                           settings.processes, settings.threads, settings.prefetch,
                                                           self.mp_context)
        same = (settings.processes, settings.threads, settings.prefetch)

        def keep_going() -> bool:
            now = self._plan.settings
            return (now.processes, now.threads, now.prefetch) == same

        hints.submit(ahead.advance, numbers.start * self.batch_size)
        for batch, made, skipped in workers.batches(plan.epoch, plan.share, numbers, keep_going, self._tuning.meter):
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
