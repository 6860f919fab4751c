"""One resume protocol for every stateful part of an input pipeline, and the record it saves.

    reader (Loader, QuasiRandomSampler)  ──state_dict()──>  {"stoker_state": 1, "dataset": <digest>,
      wrapped by echo / watch (pass through)                 "seed", "epoch", "world_size", "rank",
                                                             "batch_size", "samples_done", ...}

Every part has ``state_dict()``, ``load_state_dict(state)`` and ``set_epoch(epoch)`` (after the
torchdata.nodes design: state is part of each node, not bolted on). A reader's state is a
:class:`Position`: which data set (its manifest's digest), seed, epoch, world size, rank, batch
size, and how many samples of this rank's share of the epoch the training loop has consumed.
Loading a position saved for another data set, world size, batch size or kind of reader raises
:class:`StateError` naming the difference; a position saved by another rank of the same world size
is taken as it is (ranks step together, so every rank's position in its own share is the same:
saving on rank 0 only is enough).

A reader iterated by the loop knows what the loop consumed: every batch it yielded. A torch
DataLoader has no state and its workers read ahead, so its QuasiRandomSampler is asked instead,
with the count of samples the loop consumed: ``sampler.state_dict(samples_done)``, which the
wrappers (stoker.echo, stoker.watch) supply themselves (see :func:`state_of`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from stoker.errors import StokerError

STATE_VERSION = 1
_TAG = "stoker_state"


class StateError(StokerError, ValueError):
    """A saved state does not fit what loads it (another data set, world size, batch size or reader)."""


class Stateful(Protocol):
    """What every stateful part of a stoker pipeline implements."""

    def state_dict(self) -> dict[str, Any]:
        """Where this part is; resuming from it continues exactly after what the loop consumed."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at the beginning of ``epoch`` (kept where a loaded state already is)."""


@dataclass(frozen=True)
class Position:
    """Where a reader is: the versioned record of every reader's state."""

    reader: str  # "Loader" or "QuasiRandomSampler": their positions count different things
    dataset: str  # Manifest.digest() of the data set read
    seed: int
    epoch: int
    world_size: int
    rank: int
    batch_size: int | None  # None for a sampler (the DataLoader makes the batches)
    samples_done: int  # samples of this rank's share of ``epoch`` consumed

    def to_dict(self) -> dict[str, Any]:
        """The record as plain values (for torch.save or JSON)."""
        return {_TAG: STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Position:
        """Parse a saved record; StateError for anything that is not one this stoker wrote."""
        if not isinstance(state, dict) or _TAG not in state:
            raise StateError("this state was not saved by this version of stoker (no 'stoker_state' record): "
                             "earlier versions shuffled differently, so it cannot be resumed exactly; "
                             "call set_epoch() with the saved epoch to restart that epoch instead")
        if state[_TAG] != STATE_VERSION:
            raise StateError(f"state record version {state[_TAG]!r} is not supported (this stoker reads {STATE_VERSION})")
        try:
            return cls(**{name: state[name] for name in cls.__dataclass_fields__})
        except KeyError as e:
            raise StateError(f"state record lacks {e.args[0]!r}") from None

    def check_fits(self, current: Position) -> None:
        """Raise StateError if this saved position cannot be resumed by a reader at ``current``."""
        for name, what in (("reader", "a reader of another kind"), ("dataset", "another data set"),
                           ("world_size", "another world size"), ("batch_size", "another batch size")):
            saved, now = getattr(self, name), getattr(current, name)
            if saved != now:
                raise StateError(f"cannot resume: the state was saved for {what} ({name} {saved!r}, "
                                 f"this {current.reader} has {now!r})")


def state_of(loader: Any, consumed: int) -> dict[str, Any]:
    """The state of ``loader``: its own (a stoker reader or wrapper), or for a torch DataLoader its
    QuasiRandomSampler's after ``consumed`` samples of the current pass, as counted by the caller
    (a DataLoader's workers read ahead of the loop, so only the caller knows)."""
    if hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict"):
        return loader.state_dict()
    sampler = _sampler_of(loader)
    if sampler is None:
        raise TypeError(f"{type(loader).__name__} has no state to save: wrap a stoker.Loader, or a DataLoader "
                        "whose sampler is a stoker.QuasiRandomSampler")
    return sampler.state_dict(consumed)


def load_state_of(loader: Any, state: dict[str, Any]) -> None:
    """Load ``state`` into ``loader`` (or, for a torch DataLoader, into its sampler)."""
    target = loader if hasattr(loader, "load_state_dict") else _sampler_of(loader)
    if target is None:
        raise TypeError(f"{type(loader).__name__} has no state to load")
    target.load_state_dict(state)


def set_epoch_of(loader: Any, epoch: int) -> None:
    """Call ``set_epoch`` on ``loader``, or on a torch DataLoader's sampler, where there is one."""
    target = loader if hasattr(loader, "set_epoch") else _sampler_of(loader, "set_epoch")
    if target is not None:
        target.set_epoch(epoch)


def _sampler_of(loader: Any, method: str = "state_dict") -> Any | None:
    """The sampler of a torch DataLoader (given as ``sampler=`` or inside a ``batch_sampler``) with ``method``."""
    for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if hasattr(sampler, method):
            return sampler
    return None
