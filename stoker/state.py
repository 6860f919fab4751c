"""One resume protocol for every stateful part of an input pipeline, and the records it saves.

    reader (Loader, QuasiRandomSampler)  ──state_dict()──>  {"stoker_state": 4, "part": "Loader",
      wrapped by echo / watch (their own records,             "dataset": <digest>, "seed", "epoch",
      the reader's inside)                                    "world_size", "rank", "batch_size",
                                                              "order", "window", "blocks", "drop_last",
                                                              "samples_done", "mix", "consumed",
                                                              "partitions", "nodes", "placement", "split"}

Every part has ``state_dict()``, ``load_state_dict(state)`` and ``set_epoch(epoch)`` (after the
torchdata.nodes design: state is part of each node, not bolted on); :class:`Stateful` says so and
is checked with ``isinstance``. Every record says which part wrote it (``part``) and the format's
version (``stoker_state``); :func:`read_state` opens one for the part that loads it and refuses a
record of another part, another version or a damaged one with a :class:`StateError` saying what it
got and what it expected, and :func:`checked` refuses a field whose value is out of range.

A reader's state is a :class:`Position`: which data set (its manifest's digest), seed, epoch, the
world size and per-rank batch size it was saved with, what determines the order (``order``; for
``quasi_random`` its ``window`` and block layout; ``drop_last``; a mixture's ``mix``), and how many
samples of the epoch the training loop has consumed across all ranks (``samples_done``), and
where the data set is placed on nodes: its ``partitions`` of whole shards, the ``nodes`` it was
saved on, the node of each partition (``placement``) and how many of them a node reads together
(``split``, which sets their windows). A mixture, or several partitions, adds
the count of each source's partitions' samples consumed (``consumed``), from which each one's
sequence goes on. Each partition's samples are consumed as a prefix of its own sequence, whoever
read them (stoker/data/epoch.py), so rank 0's position serves every rank, and a position saved on
W ranks of N nodes resumes on W' ranks of N' nodes (:meth:`Position.check_fits`): with the same
global batch (each rank's batch is ``W * batch_size / W'``) or with the same per-rank batch.
Loading a position saved for another data set, order or kind of reader, or with a batch size that
keeps neither, raises :class:`StateError` naming both values; a mixture saved with other weights
or options starts a new mix instead, with a :class:`StateWarning` (:meth:`Position.resumed_by`).
Another seed is not refused: the state's seed is taken, so the resumed run goes on with the saved
run's order and crops, and a :class:`StateWarning` names both seeds. Positions of format version
3 had no placement: they are read as one partition on one node (the same order). Positions of
format version 2 counted one rank's share: those saved on one rank are read as they are; those of
several ranks, and version 1 ones, are refused with how to restart the epoch.

A reader iterated by the loop knows what the loop consumed: every batch it yielded. A torch
DataLoader has no state and its workers read ahead, so its QuasiRandomSampler is asked instead,
with the count of samples the loop consumed on this rank: ``sampler.state_dict(samples_done)``,
which the wrappers (stoker.echo, stoker.watch) supply themselves (see :func:`state_of`).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, runtime_checkable

from stoker.errors import StokerError
from stoker.ranges import BATCH_SIZE, DROP_LAST, EPOCH, NODES, ORDER, PARTITIONS, SEED, WINDOW, WORLD_SIZE, Choice, Range

STATE_VERSION = 2  # the records of echo, watch and Augment
POSITION_VERSION = 4  # a reader's Position (3: samples done across all ranks, elastic; 4: placed on nodes)
_TAG = "stoker_state"
_PART = "part"

# What each part's records are called in messages.
_PART_NAMES = {"Loader": "a stoker.Loader", "QuasiRandomSampler": "a stoker.QuasiRandomSampler",
               "Echo": "stoker.echo", "Watched": "stoker.watch", "Augment": "a stoker.augment.Augment"}

# The allowed values of the counts a record holds (the same bounds for every part; the readers'
# options are checked with the same ones: stoker/ranges.py).
COUNT = Range("count", "", 0, 2**62)
SECONDS = Range("seconds", "", 0, 1e12, integer=False)


class StateError(StokerError, ValueError):
    """A saved state does not fit what loads it (another part, data set, order, world size, batch
    size), or is not a state stoker wrote (a damaged record, a value out of range)."""


class StateWarning(UserWarning):
    """A state was loaded into a part built differently, and the state's setting was taken (the seed)."""


@runtime_checkable
class EpochAware(Protocol):
    """A part whose passes follow the epoch (DistributedSampler has this alone)."""

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at the beginning of ``epoch`` (kept where a loaded state already is)."""


@runtime_checkable
class Stateful(EpochAware, Protocol):
    """What every stateful part of a stoker pipeline implements (``isinstance(x, Stateful)``)."""

    def state_dict(self) -> dict[str, Any]:
        """Where this part is; resuming from it continues exactly after what the loop consumed."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""


def record(part: str, *, version: int = STATE_VERSION, **fields: Any) -> dict[str, Any]:
    """A state record of ``part`` (its class name): the fields, the format version and who wrote it."""
    return {_TAG: version, _PART: part, **fields}


def read_state(state: Any, part: str, fields: tuple[str, ...], *, version_1: bool = False,
               version: int = STATE_VERSION) -> dict[str, Any]:
    """The ``fields`` of a record of format ``version`` that ``part`` wrote; StateError for anything
    else, saying what it got and what was expected. ``version_1``: also take the first format, which
    had no tag and no part (a dict of exactly ``fields``), where loading it is safe."""
    name = _PART_NAMES.get(part, part)
    if not isinstance(state, dict):
        raise StateError(f"{name} cannot load a {type(state).__name__} as its state: expected the dict its "
                         "state_dict() returned")
    if _TAG not in state:
        if version_1 and set(state) == set(fields):
            return state
        raise StateError(f"{name} cannot load this state: it is not a stoker state record (no {_TAG!r} and "
                         f"{_PART!r}; keys {sorted(map(str, state))}); expected one written by {name}'s state_dict()")
    wrote = state.get(_PART)
    if wrote != part:
        got = _PART_NAMES.get(wrote, repr(wrote)) if isinstance(wrote, str) else "a record that does not say"
        raise StateError(f"{name} cannot load a state written by {got} (part {wrote!r}): expected one written "
                         f"by {name} (part {part!r}); load each part's state into the same kind of part")
    got = state[_TAG]
    if isinstance(got, bool) or got != version:
        newer = "; a newer stoker wrote it?" if isinstance(got, int) and got > version else ""
        raise StateError(f"{name} cannot load this state: record version {got!r} is not the one this stoker "
                         f"reads ({version}{newer})")
    missing = [field for field in fields if field not in state]
    if missing:
        raise StateError(f"{name} cannot load this state: its record lacks {', '.join(map(repr, missing))}")
    return {field: state[field] for field in fields}


def checked(part: str, field: str, value: Any, allowed: Range) -> Any:
    """``value`` of a record's ``field`` when ``allowed`` takes it (as a plain int or float); else
    StateError naming the part, the field, the value and the range."""
    if not allowed.accepts(value):
        raise StateError(f"{_PART_NAMES.get(part, part)} cannot load this state: {field}={value!r} "
                         f"must be {allowed.describe()}")
    return int(value) if allowed.integer else float(value)


def checked_choice(part: str, field: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """``value`` when it is one of ``allowed`` (and of the same type: True is not 1); else StateError."""
    if not Choice(field, allowed).accepts(value):
        raise StateError(f"{_PART_NAMES.get(part, part)} cannot load this state: {field}={value!r} must be one of "
                         f"{', '.join(map(repr, allowed))}")
    return value


@dataclass(frozen=True)
class Position:
    """Where a reader is: the versioned record of every reader's state."""

    part: str  # "Loader" or "QuasiRandomSampler"
    dataset: str  # Manifest.digest() of the data set read
    seed: int
    epoch: int
    world_size: int  # ranks when it was saved
    rank: int  # the rank that saved it (any rank's serves every rank)
    batch_size: int  # per rank: the Loader's batch_size, a sampler's batch_size (its chunk; 1 by default)
    order: str  # "quasi_random", "random" or "sequential" (a sampler: shuffle=True or False)
    window: int | None  # blocks open at a time (quasi_random only; else None)
    blocks: str | None  # the block layout, "<count> blocks #<digest>" (quasi_random only; else None)
    drop_last: bool
    samples_done: int  # samples of the epoch's global sequence consumed, all ranks together
    mix: str | None = None  # a mixture's digest (its sources, sizes, weights, options); None for one data set
    # Samples consumed at samples_done of each source's partitions (source after source): for a
    # mixture or several partitions; None for one partition of one data set (samples_done says it).
    consumed: tuple[int, ...] | None = None
    partitions: int = 1  # of whole shards, each source's (stoker/data/placement.py)
    nodes: int = 1  # the ranks' nodes when it was saved
    placement: tuple[int, ...] | None = None  # the node of each partition (None for one partition)
    split: int = 1  # partitions a node reads together, each with that fraction of the window open

    def to_dict(self) -> dict[str, Any]:
        """The record as plain values (for torch.save or JSON)."""
        fields = asdict(self)
        for name in ("consumed", "placement"):
            fields[name] = list(fields[name]) if fields[name] is not None else None
        return record(fields.pop("part"), version=POSITION_VERSION, **fields)

    @classmethod
    def from_dict(cls, state: Any, part: str) -> Position:
        """Parse a record that reader ``part`` saved; StateError for anything else, for a version 1
        record (it did not say which order it was saved in), a version 2 record of several ranks
        (it counted one rank's share of another order), and for a field out of range."""
        name = _PART_NAMES[part]
        if isinstance(state, dict) and _TAG not in state and "batches_done" in state:  # stoker before version 1
            raise StateError(f"{name} cannot load this state: it was not saved by this version of stoker "
                             "(no 'stoker_state' record): earlier versions shuffled differently, so it cannot be "
                             "resumed exactly; call set_epoch() with the saved epoch to restart that epoch instead")
        if isinstance(state, dict) and state.get(_TAG) == 1:
            raise StateError(f"{name} cannot load this state: it is a version 1 record, which did not "
                             "record the order it was saved in (order or shuffle, window, block layout, drop_last), "
                             "so resuming it in another order could not be refused; call set_epoch("
                             f"{state.get('epoch')!r}) to restart its epoch instead")
        if isinstance(state, dict) and state.get(_TAG) == 2 and state.get(_PART) == part:
            state = _from_version_2(state, name)
        if isinstance(state, dict) and state.get(_TAG) == 3 and state.get(_PART) == part:
            state = {**state, _TAG: POSITION_VERSION, "partitions": 1, "nodes": 1, "placement": None, "split": 1}
        names = tuple(field for field in cls.__dataclass_fields__ if field != "part")
        values = read_state(state, part, names, version=POSITION_VERSION)
        world_size = checked(part, "world_size", values["world_size"], WORLD_SIZE)
        if not isinstance(values["dataset"], str) or not values["dataset"]:
            raise StateError(f"{name} cannot load this state: dataset={values['dataset']!r} must be "
                             "the data set's manifest digest (a string)")
        order = checked_choice(part, "order", values["order"], ORDER.values)
        quasi = order == "quasi_random"
        window, blocks = values["window"], values["blocks"]
        if quasi != (window is not None) or quasi != (blocks is not None):
            raise StateError(f"{name} cannot load this state: window={window!r} and blocks={blocks!r} "
                             "must be given for order 'quasi_random' only, and are None for another order "
                             f"(order={order!r})")
        if quasi and not isinstance(blocks, str):
            raise StateError(f"{name} cannot load this state: blocks={blocks!r} must be a string")
        mix, consumed = values["mix"], values["consumed"]
        if mix is not None and (not isinstance(mix, str) or not mix):
            raise StateError(f"{name} cannot load this state: mix={mix!r} must be None or a mixture's digest")
        partitions = checked(part, "partitions", values["partitions"], PARTITIONS)
        nodes = checked(part, "nodes", values["nodes"], NODES)
        placement = _placement(name, values["placement"], partitions, nodes)
        counted = mix is not None or partitions > 1
        if consumed is not None:
            if not isinstance(consumed, (list, tuple)):
                raise StateError(f"{name} cannot load this state: consumed={consumed!r} must be None or a "
                                 "list of counts per source and partition")
            consumed = tuple(checked(part, "consumed", count, COUNT) for count in consumed)
            if not counted or sum(consumed) != values["samples_done"]:
                whose = "a mixture's" if mix is not None else "several partitions'" if counted else "(only) a mixture's"
                raise StateError(f"{name} cannot load this state: consumed={list(consumed)!r} must count {whose} "
                                 f"samples_done={values['samples_done']!r} per source and partition (mix={mix!r}, "
                                 f"partitions={partitions})")
        elif counted and values["samples_done"] != 0:
            whose = "a mixture's" if mix is not None else "several partitions'"
            raise StateError(f"{name} cannot load this state: {whose} state after "
                             f"samples_done={values['samples_done']!r} samples needs consumed, the count of each "
                             f"source's partitions' samples among them, and has none (mix={mix!r}, "
                             f"partitions={partitions})")
        return cls(
            part=part,
            dataset=values["dataset"],
            seed=checked(part, "seed", values["seed"], SEED),
            epoch=checked(part, "epoch", values["epoch"], EPOCH),
            world_size=world_size,
            rank=checked(part, "rank", values["rank"], Range("rank", "", 0, world_size - 1)),
            batch_size=checked(part, "batch_size", values["batch_size"], BATCH_SIZE),
            order=order,
            window=checked(part, "window", window, WINDOW) if quasi else None,
            blocks=blocks,
            drop_last=checked_choice(part, "drop_last", values["drop_last"], DROP_LAST.values),
            samples_done=checked(part, "samples_done", values["samples_done"], COUNT),
            mix=mix,
            consumed=consumed,
            partitions=partitions,
            nodes=nodes,
            placement=placement,
            split=checked(part, "split", values["split"], Range("split", "", 1, partitions)),
        )

    def check_fits(self, current: Position, warn_seed: bool = True) -> str:
        """Raise StateError if this saved position cannot be resumed by a reader at ``current`` (both
        values named); warn (StateWarning) when its seed, which the reader takes, is not the reader's
        and ``warn_seed`` (a seed the reader was given: a drawn one is replaced without a word).
        Returns how the batches carry over (:func:`resume_mode`)."""
        reader = _PART_NAMES[current.part]
        for name, what, hint in _MUST_MATCH:
            saved, now = getattr(self, name), getattr(current, name)
            if saved != now:
                raise StateError(f"cannot resume: the state was saved for {what} ({name} {saved!r}, {reader} has "
                                 f"{now!r}){hint}")
        mode = resume_mode(self.world_size, self.batch_size, current.world_size, current.batch_size, reader)
        if self.seed != current.seed and warn_seed:
            warnings.warn(f"{reader} was built with seed={current.seed} and loads a state saved with seed={self.seed}: "
                          f"it takes seed {self.seed}, so the resumed run goes on with the saved run's order and crops",
                          StateWarning, stacklevel=3)
        return mode

    def resumed_by(self, current: Position, warn_seed: bool = True) -> tuple[Position, str]:
        """Where a reader at ``current`` resumes from this saved position, and how (see
        :meth:`check_fits`, which refuses what does not fit). A mixture saved with other weights or
        options (``mix``) starts a new mix instead, with a StateWarning naming both: at the start
        of the saved epoch when nothing of it was consumed, else at the start of the next (the rest
        of the saved epoch, drawn with the old weights, is not read)."""
        if self.mix is None or current.mix is None or self.mix == current.mix:
            return self, self.check_fits(current, warn_seed)
        epoch = self.epoch + (self.samples_done > 0)
        fresh = replace(self, epoch=epoch, world_size=current.world_size, rank=current.rank,
                        batch_size=current.batch_size, samples_done=0, mix=current.mix, consumed=None)
        fresh.check_fits(current, warn_seed)
        skipped = f" (the rest of epoch {self.epoch} is not read)" if epoch != self.epoch else ""
        warnings.warn(f"the state was saved for a mix of {self.mix}; {_PART_NAMES[current.part]} has {current.mix}: "
                      f"a new mix starts at epoch {epoch}{skipped}", StateWarning, stacklevel=3)
        return fresh, "new mix"


def resume_mode(saved_world: int, saved_batch: int, world: int, batch: int, reader: str = "the reader") -> str:
    """How a position saved on ``saved_world`` ranks of ``saved_batch`` samples each resumes on
    ``world`` ranks of ``batch``: ``"same global batch"`` (``batch * world`` is the saved global
    batch; each rank's batch changes), else ``"same per-rank batch"`` (the global batch changes).
    Either way the rest of the epoch is dealt from the saved point on, exactly. Neither: StateError
    saying what would work."""
    saved_global = saved_world * saved_batch
    if batch * world == saved_global:
        return "same global batch"
    if batch == saved_batch:
        return "same per-rank batch"
    if saved_global % world == 0:
        keep_global = f"batch_size={saved_global // world} on {world} ranks"
    else:
        fits = [n for n in range(1, min(saved_global, 4096) + 1) if saved_global % n == 0]
        keep_global = (f"not on {world} ranks: {saved_global} does not divide by {world} (it does on "
                       f"{', '.join(map(str, fits[:12]))}{', ...' if len(fits) > 12 else ''} ranks)")
    raise StateError(f"cannot resume: the state was saved on {saved_world} rank{'s' * (saved_world > 1)} with "
                     f"batch_size={saved_batch} (global batch {saved_global}) and {reader} has {world} "
                     f"rank{'s' * (world > 1)} with batch_size={batch} (global batch {batch * world}): resume with "
                     f"the same global batch ({keep_global}) or the same per-rank batch (batch_size={saved_batch})")


def _from_version_2(state: dict[str, Any], name: str) -> dict[str, Any]:
    """A version 2 position as version 3 (then read as version 4), where that is exact: saved on one
    rank, its count of that rank's share is the count of the epoch's sequence (the same order). A
    sampler's batch_size was None (it is 1, sample by sample, now)."""
    if state.get("world_size") != 1:
        raise StateError(f"{name} cannot load this state: it is a version 2 record saved on "
                         f"{state.get('world_size')!r} ranks, which counted one rank's share of an order cut by "
                         f"world size (stoker now deals one global order to the ranks); call set_epoch("
                         f"{state.get('epoch')!r}) to restart its epoch instead")
    batch_size = 1 if state.get(_PART) == "QuasiRandomSampler" and state.get("batch_size") is None \
        else state.get("batch_size")
    return {**state, _TAG: 3, "batch_size": batch_size, "mix": None, "consumed": None}


def _placement(name: str, placement: Any, partitions: int, nodes: int) -> tuple[int, ...] | None:
    """A record's ``placement``: None for one partition, else the node (below ``nodes``) of each partition."""
    if partitions == 1 and placement is None:
        return None
    if not isinstance(placement, (list, tuple)) or len(placement) != partitions or not all(
            Range("placement", "", 0, nodes - 1).accepts(node) for node in placement):
        raise StateError(f"{name} cannot load this state: placement={placement!r} must be None for one partition, "
                         f"else the node (0 to {nodes - 1}) of each of its partitions={partitions}")
    return tuple(int(node) for node in placement)


# What a position must share with the reader that loads it: field, what differs, how to match it.
# (World size and batch size may differ: see resume_mode.)
_MUST_MATCH = (
    ("dataset", "another data set", ""),
    ("order", "another order", ": build it with the same order= (a QuasiRandomSampler: shuffle=True is "
     "'quasi_random', shuffle=False 'sequential')"),
    ("window", "another window", ": build it with the same window= (a node cache's cache_limit can lower it)"),
    ("blocks", "another block layout", ": open the data set with the same block_bytes=, and a cache_limit that "
     "holds all of it or the same part (a partial cache makes whole shards the blocks)"),
    ("drop_last", "another drop_last", ": build it with the same drop_last="),
)


def state_of(loader: Any, consumed: int) -> dict[str, Any]:
    """The state of ``loader``: its own (a stoker reader or wrapper), or for a torch DataLoader its
    QuasiRandomSampler's after ``consumed`` samples of the current pass, as counted by the caller
    (a DataLoader's workers read ahead of the loop, so only the caller knows)."""
    if isinstance(loader, Stateful):
        return loader.state_dict()
    sampler = _sampler_of(loader)
    if sampler is None:
        raise TypeError(f"{type(loader).__name__} has no state to save: wrap a stoker.Loader, or a DataLoader "
                        "whose sampler is a stoker.QuasiRandomSampler")
    return sampler.state_dict(consumed)  # type: ignore[call-arg]  # a sampler's takes the count


def load_state_of(loader: Any, state: dict[str, Any]) -> None:
    """Load ``state`` into ``loader`` (or, for a torch DataLoader, into its sampler)."""
    target = loader if isinstance(loader, Stateful) else _sampler_of(loader)
    if target is None:
        raise TypeError(f"{type(loader).__name__} has no state to load")
    target.load_state_dict(state)


def set_epoch_of(loader: Any, epoch: int) -> None:
    """Call ``set_epoch`` on ``loader``, or on a torch DataLoader's sampler, where there is one."""
    if isinstance(loader, EpochAware):
        loader.set_epoch(epoch)
        return
    for sampler in _samplers_of(loader):
        if isinstance(sampler, EpochAware):
            sampler.set_epoch(epoch)
            return


def epoch_of(loader: Any) -> int | None:
    """The epoch of ``loader`` (a stoker reader, or a torch DataLoader's epoch-aware sampler), None
    where it has none."""
    for part in (loader, *_samplers_of(loader)):
        if isinstance(part, EpochAware) and isinstance(getattr(part, "epoch", None), int):
            return part.epoch  # type: ignore[attr-defined]
    return None


def _sampler_of(loader: Any) -> Stateful | None:
    """The stateful sampler of a torch DataLoader (given as ``sampler=`` or inside a ``batch_sampler``)."""
    return next((sampler for sampler in _samplers_of(loader) if isinstance(sampler, Stateful)), None)


def _samplers_of(loader: Any) -> tuple[Any, Any]:
    return getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)
