"""The DataLoader's iteration contract, kept in one place for stoker's readers (stoker.Loader,
QuasiRandomSampler): which epoch, and where in it, each new pass starts.

    iter()                 a new pass over the current epoch, from its start; from a loaded state
                           instead when one was loaded since the last pass began
    a pass handed out whole   the next pass is the next epoch's (a loop that calls no set_epoch gets
                           fresh epochs, as a DataLoader's RandomSampler gives them)
    a pass left early      the next pass starts the same epoch again (a peek with next(iter(...)),
                           Lightning's sanity check of two batches: nothing of the epoch is lost)
    set_epoch(k)           the next pass is epoch k from its start; a state loaded for epoch k is
                           kept (a resumed loop names the epoch it resumes); a pass running when it
                           is called goes on, but moves the reader no more
    load_state_dict(s)     the next pass resumes where ``s`` says; at its epoch's end, the next
                           pass is the next epoch's, or empty when set_epoch names the state's epoch
                           before ``iter()`` (the resumed loop's epoch ended there; named after
                           ``iter()``, as Lightning names the next one, it is read whole)

torchdata's StatefulDataLoader keeps the same contract. A pass begins when its first batch is
asked for, not at ``iter()``: Lightning calls ``iter()``, then ``set_epoch``, then asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stoker.data.epoch import EpochPlan, Order, RankBatches, plan_epoch, rank_batches, resolve_rank, resolve_seed
from stoker.data.mix import Mix
from stoker.data.readable import Readable, consumed_of, epoch_order_of, identity_of
from stoker.ranges import BATCH_SIZE, DROP_LAST, EPOCH, ORDER, START_EPOCH, WINDOW
from stoker.state import Position, StateError


@dataclass
class PassCursor:
    """Where a reader is in its epochs, and where its next pass starts. ``over`` arguments say
    whether ``position`` is at its epoch's end (no batch left for any rank), which only the reader
    can tell."""

    epoch: int = 0
    position: int = 0  # samples of the epoch's global sequence consumed (all ranks) by the passes so far
    consumed: tuple[int, ...] | None = None  # a Mix's samples of each source at ``position`` (None at 0)
    loaded: bool = False  # a state was loaded since the last pass began: the next pass resumes it
    named: bool = False  # set_epoch named the loaded state's epoch
    finished: bool = False  # the last pass handed out all its batches: the next pass is the next epoch's

    def set_epoch(self, epoch: int) -> None:
        """The next pass reads ``epoch`` from its start, or from a state loaded for it."""
        if self.loaded and epoch == self.epoch:
            self.named = True
            return
        self._move(epoch, 0, None)

    def load(self, epoch: int, position: int, consumed: tuple[int, ...] | None) -> None:
        """A loaded state: the next pass resumes at it."""
        self._move(epoch, position, consumed)
        self.loaded = True

    def upcoming(self, over: bool) -> tuple[int, int, tuple[int, ...] | None]:
        """The epoch, position and consumed counts the next pass starts at (nothing changes)."""
        if self.loaded and (self.named or not over):
            return self.epoch, self.position, self.consumed
        if self.loaded or self.finished:
            return self.epoch + 1, 0, None
        return self.epoch, 0, None

    def begin(self, over: bool) -> None:
        """``iter()``: go to where the new pass starts. A loaded state stays marked until the pass's
        first batch is asked for (:meth:`started`), so a set_epoch of its epoch in between keeps it."""
        epoch, position, consumed = self.upcoming(over)
        resumes = self.loaded and (epoch, position) == (self.epoch, self.position)
        named = self.named
        self._move(epoch, position, consumed)
        self.loaded, self.named = resumes, resumes and named

    def started(self) -> None:
        """The pass's first batch is asked for: a later ``iter()`` starts afresh."""
        self.loaded = self.named = False

    def next_epoch(self) -> None:
        """The pass ended after its last batch: the reader is at the start of the next epoch."""
        self._move(self.epoch + 1, 0, None)

    def _move(self, epoch: int, position: int, consumed: tuple[int, ...] | None) -> None:
        self.epoch, self.position, self.consumed = epoch, position, consumed
        self.loaded = self.named = self.finished = False


class Passes:
    """One rank's passes over the epochs of what a reader reads (one data set or a Mix): their plans,
    where the next one starts (a :class:`PassCursor`), and the state that says where it is. The
    Loader and QuasiRandomSampler each keep one: the same orders, seeds, states and contract.

    ``seed`` None: drawn (see :func:`stoker.data.epoch.resolve_seed`); ``part``: the reader's
    class name, as its states record it; ``world_name``: what the reader calls its world size."""

    def __init__(self, part: str, dataset: Readable, order: Order, window: int, *, seed: int | None, start_epoch: int,
                 rank: int | None, world_size: int | None, batch_size: int, drop_last: bool,
                 world_name: str = "world_size") -> None:
        self.part, self.dataset = part, dataset
        self.rank, self.world_size = resolve_rank(rank, world_size, world_name)
        self.batch_size, self.drop_last = BATCH_SIZE.check(batch_size), DROP_LAST.check(drop_last)
        self.epoch_order = epoch_order_of(dataset, ORDER.check(order), WINDOW.check(window))
        self.cursor = PassCursor(START_EPOCH.check(start_epoch))
        self.seed, self.seed_from = resolve_seed(seed, self.rank, self.world_size, f"stoker.{part}")
        self._seed_given = seed is not None
        self._identity = identity_of(dataset)  # what a state names the data by (computed once)
        self._begun = 0  # passes begun (iter() calls)
        self._running = 0  # the number of the latest pass whose first batch was asked for
        self._started: EpochPlan | None = None  # the plan of the pass last started

    def __len__(self) -> int:
        """Samples per epoch, all ranks together."""
        return len(self.epoch_order)

    def batches(self, start: int) -> RankBatches:
        """This rank's batches of a pass from ``start`` samples consumed (all ranks), without
        planning the epoch's order (what lengths and an epoch's end need)."""
        return rank_batches(len(self), start=start, world_size=self.world_size, rank=self.rank,
                            batch_size=self.batch_size, drop_last=self.drop_last)

    def plan(self, epoch: int, start: int, consumed: tuple[int, ...] | None = None) -> EpochPlan:
        """This rank's pass over ``epoch`` from ``start`` samples consumed (all ranks; a Mix's per
        source: ``consumed``)."""
        return plan_epoch(self.epoch_order, seed=self.seed, epoch=epoch, start=start, consumed=consumed,
                          world_size=self.world_size, rank=self.rank, batch_size=self.batch_size,
                          drop_last=self.drop_last)

    def upcoming(self) -> tuple[int, int, tuple[int, ...] | None]:
        """The epoch, position and a Mix's consumed counts the next pass starts at."""
        return self.cursor.upcoming(self._over(self.cursor.position))

    def begin(self) -> int:
        """``iter()``: the cursor goes to where the new pass starts. Returns the pass's number: only
        the latest pass moves the cursor (:meth:`latest`), whatever an older iterator still does."""
        self.cursor.begin(self._over(self.cursor.position))
        self._begun += 1
        return self._begun

    def latest(self, number: int) -> bool:
        """Whether pass ``number`` (of :meth:`begin`) is the latest one begun."""
        return number == self._begun

    def start(self, number: int) -> EpochPlan:
        """Pass ``number``'s first batch is asked for: its plan, from where the cursor is then (if it
        is the latest pass, a later ``iter()`` starts afresh)."""
        if self.latest(number):
            self.cursor.started()
            self._running = number
        self._started = self.plan(self.cursor.epoch, self.cursor.position, self.cursor.consumed)
        return self._started

    def progress(self, number: int, plan: EpochPlan, batches: int) -> None:
        """Pass ``number`` (over ``plan``) has handed out ``batches`` batches: the cursor is there, if
        it is the latest pass (an older iterator's batches move nothing)."""
        if self.latest(number):
            cursor = self.cursor
            cursor.position, cursor.consumed = plan.batches.samples_done(batches), plan.consumed(batches)
            cursor.finished = batches == len(plan.batches)

    def consumed(self, batches: int) -> tuple[int, ...] | None:
        """A Mix's samples of each source consumed once this rank has made ``batches`` batches of the
        pass from the cursor (None for one data set): by the plan of the pass last started, or one
        made now where that plan is not the cursor's."""
        if not isinstance(self.dataset, Mix):
            return None
        cursor, plan = self.cursor, self._started
        if plan is None or (plan.epoch, plan.batches.origin) != (cursor.epoch, cursor.position):
            plan = self._started = self.plan(cursor.epoch, cursor.position, cursor.consumed)
        return plan.consumed(batches)

    def set_epoch(self, epoch: int) -> None:
        """The next pass reads ``epoch`` (checked: OptionError out of range). A pass already running
        no longer moves the cursor: what it reads of its own epoch is not the named one's."""
        self.cursor.set_epoch(EPOCH.check(epoch))
        self._leave_running_pass()

    def _leave_running_pass(self) -> None:
        """The latest pass, if its first batch was asked for, moves the cursor no more (set_epoch or a
        state loaded while it runs name where the next pass starts). Lightning's ``iter()``, then
        ``set_epoch``, then the first batch keeps that pass: it has not started."""
        if self._running == self._begun:
            self._begun += 1

    def record(self, samples_done: int, consumed: tuple[int, ...] | None, epoch: int | None = None) -> Position:
        """The state of this reader after ``samples_done`` samples of ``epoch`` (default: the cursor's)."""
        window, blocks = self.epoch_order.settings()
        dataset, mix = self._identity
        return Position(self.part, dataset, self.seed, self.cursor.epoch if epoch is None else epoch, self.world_size,
                        self.rank, self.batch_size, self.epoch_order.order, window, blocks, self.drop_last,
                        samples_done, mix, consumed_of(self.dataset, consumed))

    def load(self, state: dict[str, Any]) -> tuple[Position, str]:
        """The next pass resumes ``state`` (see :meth:`stoker.state.Position.resumed_by`, which refuses
        what does not fit): the saved position and how its batches carry over. The state's seed is
        taken, with a StateWarning when ``seed`` was given and is not it."""
        saved, mode = Position.from_dict(state, self.part).resumed_by(self.record(0, None, 0),
                                                                      warn_seed=self._seed_given)
        if saved.samples_done > len(self):
            raise StateError(f"{self.part} cannot load this state: samples_done={saved.samples_done} is outside the "
                             f"epoch of {len(self)} samples")
        if saved.seed != self.seed:
            self.seed, self.seed_from = saved.seed, "taken from the loaded state"
        self.cursor.load(saved.epoch, saved.samples_done, saved.consumed)
        self._leave_running_pass()
        return saved, mode

    def describe_next(self) -> str:
        """The next pass in words (for explain()): epoch, where in it, order and seed, and why that seed."""
        epoch, start, _ = self.upcoming()
        where = (f"at sample {start} of {len(self)}, resuming a loaded state ({len(self.batches(start))} batches here)"
                 if start else f"from its start ({len(self.batches(0))} batches here)")
        return f"epoch {epoch} {where}, {self.epoch_order.order} order, seed {self.seed}: {self.seed_from}"

    def _over(self, position: int) -> bool:
        """Whether ``position`` is at its epoch's end: no batch left for any rank (this rank may have
        none left while others have one)."""
        return self.batches(position).end <= position


class PassesReader:
    """What a reader that keeps its passes in a :class:`Passes` (``_passes``) shows of them."""

    _passes: Passes

    @property
    def epoch(self) -> int:
        """The current epoch: the one a pass reads, or that set_epoch, ``start_epoch`` or a loaded
        state set. After a whole pass the next one reads the next epoch: the Loader's epoch moves
        when its pass ends, a sampler's when the next pass begins (DataLoader workers may still be
        delivering the last one's samples)."""
        return self._passes.cursor.epoch

    @property
    def seed(self) -> int:
        """The seed of the orders and draws: as given, drawn from torch's global generator, or a loaded state's."""
        return self._passes.seed

    def set_epoch(self, epoch: int) -> None:
        """The next pass reads ``epoch`` (the same on every rank) from its start; from a state loaded
        for ``epoch``, where that state says (a resumed loop names the epoch it resumes: at the
        state's epoch's end, the pass is empty). Not needed between epochs: a pass handed out whole
        advances the epoch itself."""
        self._passes.set_epoch(epoch)
