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

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.data.epoch import EpochPlan, Order, RankBatches, plan_epoch, rank_batches
from stoker.data.placement import Placement, PlacementWarning, default_partitions, even_node_counts, node_shards
from stoker.data.readable import Readable, epoch_order_of, identity_of
from stoker.data.world import resolve_nodes, resolve_rank, resolve_seed
from stoker.errors import OptionError
from stoker.ranges import BATCH_SIZE, DROP_LAST, EPOCH, ORDER, PARTITIONS, START_EPOCH, WINDOW
from stoker.state import Position, StateError, StateWarning


@dataclass
class PassCursor:
    """Where a reader is in its epochs, and where its next pass starts. ``over`` arguments say
    whether ``position`` is at its epoch's end (no batch left for any rank), which only the reader
    can tell."""

    epoch: int = 0
    position: int = 0  # samples of the epoch's global sequence consumed (all ranks) by the passes so far
    consumed: tuple[int, ...] | None = None  # each source's partitions' samples at ``position`` (see plan_epoch)
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

    ``seed`` None: drawn (see :func:`stoker.data.world.resolve_seed`); ``part``: the reader's
    class name, as its states record it; ``world_name``: what the reader calls its world size;
    ``nodes``: the nodes the ranks run on (None: torchrun's, see :func:`stoker.data.world.resolve_nodes`);
    ``partitions``: of whole shards, placed on the nodes (None: a loaded state's, else the default
    for this world, see :mod:`stoker.data.placement`)."""

    def __init__(self, part: str, dataset: Readable, order: Order, window: int, *, seed: int | None, start_epoch: int,
                 rank: int | None, world_size: int | None, batch_size: int, drop_last: bool,
                 world_name: str = "world_size", nodes: int | None = None, partitions: int | None = None) -> None:
        self.part, self.dataset = part, dataset
        self.rank, self.world_size = resolve_rank(rank, world_size, world_name)
        self.nodes, self.nodes_from = resolve_nodes(nodes, self.rank, self.world_size)
        self.batch_size, self.drop_last = BATCH_SIZE.check(batch_size), DROP_LAST.check(drop_last)
        self.epoch_order = epoch_order_of(dataset, ORDER.check(order), WINDOW.check(window))
        self.cursor = PassCursor(START_EPOCH.check(start_epoch))
        shards = max(len(self.epoch_order.blocks(i).shard_samples()) for i in range(self.epoch_order.sources))
        if partitions is None:
            self.placement = Placement.of(default_partitions(shards, self.nodes), self.nodes)
            self.partitions_from = _default_reason(self.placement.partitions, self.nodes)
        else:
            if PARTITIONS.check(partitions) > shards:
                raise OptionError(f"partitions={partitions}: must be at most {shards}, the shards of {dataset.root} "
                                  "(a partition holds whole shards)")
            self.placement, self.partitions_from = Placement.of(partitions, self.nodes), "given (partitions=)"
        self._partitions_given = partitions is not None
        self._warn_uneven()
        self.seed, self.seed_from = resolve_seed(seed, self.rank, self.world_size, f"stoker.{part}")
        self._seed_given = seed is not None
        self._identity = identity_of(dataset)  # what a state names the data by (computed once)
        self._begun = 0  # passes begun (iter() calls)
        self._running = 0  # the number of the latest pass whose first batch was asked for
        self._started: EpochPlan | None = None  # the plan of the pass last started

    @property
    def node(self) -> int:
        """The node of this rank (ranks numbered node by node)."""
        return self.rank // (self.world_size // self.nodes)

    def node_shards(self, node: int | None = None) -> list[np.ndarray]:
        """The shards node ``node`` (default: this rank's) reads, per source (one data set: one
        array): those of its partitions, which its node cache holds. At each epoch's end a node
        may read a few samples of others' (see :mod:`stoker.data.epoch`)."""
        node = self.node if node is None else node
        return [node_shards(self.epoch_order.blocks(i).shard_samples(), self.placement.partitions,
                            np.array(self.placement.node_of), node) for i in range(self.epoch_order.sources)]

    def home_shards(self) -> list[np.ndarray] | None:
        """This rank's node's shards per source where the data is placed on several nodes, the
        only ones its node cache stages; None on one node (every shard is the node's)."""
        return self.node_shards() if self.placement.partitions > 1 else None

    def __len__(self) -> int:
        """Samples per epoch, all ranks together."""
        return len(self.epoch_order)

    def batches(self, start: int) -> RankBatches:
        """This rank's batches of a pass from ``start`` samples consumed (all ranks), without
        planning the epoch's order (what lengths and an epoch's end need)."""
        return rank_batches(len(self), start=start, world_size=self.world_size, rank=self.rank,
                            batch_size=self.batch_size, drop_last=self.drop_last)

    def plan(self, epoch: int, start: int, consumed: tuple[int, ...] | None = None) -> EpochPlan:
        """This rank's pass over ``epoch`` from ``start`` samples consumed (all ranks; per source and
        partition: ``consumed``), dealt from its node's partitions."""
        return plan_epoch(self.epoch_order, seed=self.seed, epoch=epoch, start=start, consumed=consumed,
                          world_size=self.world_size, rank=self.rank, batch_size=self.batch_size,
                          drop_last=self.drop_last, placement=self.placement)

    def upcoming(self) -> tuple[int, int, tuple[int, ...] | None]:
        """The epoch, position and consumed counts (per source and partition) the next pass starts at."""
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
        """Each source's partitions' samples consumed once this rank has made ``batches`` batches of
        the pass from the cursor (None for one partition of one data set): by the plan of the pass
        last started, or one made now where that plan is not the cursor's."""
        if not self._counts():
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
        placement = self.placement
        if consumed is None and self._counts():
            consumed = (0,) * (self.epoch_order.sources * placement.partitions)
        return Position(self.part, dataset, self.seed, self.cursor.epoch if epoch is None else epoch, self.world_size,
                        self.rank, self.batch_size, self.epoch_order.order, window, blocks, self.drop_last,
                        samples_done, mix, consumed, placement.partitions, self.nodes,
                        placement.node_of if placement.partitions > 1 else None, placement.split)

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
        self._place(saved)
        if saved.samples_done and self._counts() and len(saved.consumed or ()) != self.epoch_order.sources * \
                saved.partitions:
            raise StateError(f"{self.part} cannot load this state: consumed={saved.consumed} must count the samples "
                             f"consumed of each of {self.epoch_order.sources} source(s) x {saved.partitions} partitions")
        self.cursor.load(saved.epoch, saved.samples_done, saved.consumed)
        self._leave_running_pass()
        return saved, mode

    def _place(self, saved: Position) -> None:
        """The partitions after loading ``saved``: the state's (a run keeps its partitions, and a
        state counts its epoch per partition), placed on this world's nodes keeping each node's where
        it can; ``partitions=`` as given instead where the state is at an epoch's start."""
        given = self.placement.partitions
        if self._partitions_given and given != saved.partitions:
            if not saved.samples_done:
                return
            warnings.warn(f"stoker.{self.part} was built with partitions={given} and loads a state saved mid-epoch with "
                          f"{saved.partitions}: it takes {saved.partitions} (the state counts its epoch per partition); "
                          "a state saved at an epoch's end takes partitions=", StateWarning, stacklevel=4)
        self.placement = Placement.of(saved.partitions, self.nodes, saved.placement, saved.nodes, saved.split)
        self.partitions_from = "taken from the loaded state"
        self._warn_uneven()

    def _counts(self) -> bool:
        """Whether plans count each source's partitions' samples (a state records them)."""
        return self.epoch_order.counted or self.placement.partitions > 1

    def _warn_uneven(self) -> None:
        """A PlacementWarning when the partitions do not deal evenly over the nodes."""
        partitions, nodes = self.placement.partitions, self.nodes
        if partitions % nodes:
            held = f"{partitions // nodes} or {partitions // nodes + 1}" if partitions > nodes else "one or none"
            warnings.warn(f"stoker.{self.part}: {partitions} partitions do not deal evenly over {nodes} nodes: nodes "
                          f"hold {held}, so the nodes with less read others' shards at each epoch's end; node counts "
                          f"that deal them evenly: {_listed(even_node_counts(partitions))} (partitions= sets them from "
                          "an epoch's start)", PlacementWarning, stacklevel=4)

    def describe_placement(self) -> list[str]:
        """Which node reads which partitions, and why (for explain()): every node's, up to 8 of them."""
        placement, nodes = self.placement, self.nodes
        lines = [f"  placement: {placement.partitions} partition{'s' * (placement.partitions > 1)} of whole shards "
                 f"({self.partitions_from}) over {nodes} node{'s' * (nodes > 1)} ({self.nodes_from}); this rank is "
                 f"on node {self.node}"]
        if placement.partitions == 1 and nodes == 1:
            return lines
        window = -(-self.epoch_order.window // placement.split)
        lines.append(f"    each node reads its partitions together, each with {window} block{'s' * (window > 1)} of "
                     f"window={self.epoch_order.window} open ({placement.split} per node when the run was placed); "
                     "at an epoch's end a node that has read all of its own reads others' (a tail)")
        shown = sorted({*range(min(nodes, 8)), self.node})
        for node in shown:
            shards = sum(len(s) for s in self.node_shards(node))
            lines.append(f"    {placement.describe(node)}: {shards} shard{'s' * (shards != 1)}")
        if nodes > len(shown):
            lines.append(f"    ... and {nodes - len(shown)} more nodes")
        return lines

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


def _listed(counts: list[int]) -> str:
    """Up to 12 numbers, then "..."."""
    return ", ".join(map(str, counts[:12])) + (", ..." if len(counts) > 12 else "")


def _default_reason(partitions: int, nodes: int) -> str:
    """Why a run has ``partitions`` by default on ``nodes`` nodes (for explain())."""
    if nodes == 1:
        return "the default on one node: one sequence over the whole data set"
    if partitions % nodes:
        return f"the default for {nodes} nodes: one shard each, there are fewer shards than nodes"
    return (f"the default for {nodes} nodes, {partitions // nodes} each: a resume on "
            f"{_listed(even_node_counts(partitions))} nodes deals them evenly")
