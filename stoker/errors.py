"""Exceptions raised by stoker. Every message names the file (and sample) and the reason."""

from __future__ import annotations


class StokerError(Exception):
    """Base class of every error stoker raises on purpose."""


class FormatError(StokerError):
    """A manifest or index does not follow the stoker format (wrong version, bad field, unsafe path)."""


class CorruptDataError(StokerError):
    """Stored bytes do not match their checksum, or a shard is truncated or unreadable.

    ``shard`` is the shard file's path and ``key`` the sample's key (None when the damage is not
    tied to one sample).
    """

    def __init__(self, shard: str, key: str | None = None, reason: str = "") -> None:
        self.shard = shard
        self.key = key
        self.reason = reason
        where = f"{shard}, sample {key!r}" if key is not None else shard
        super().__init__(f"{where}: {reason}" if reason else where)

    def __reduce__(self):
        return type(self), (self.shard, self.key, self.reason)


class OptionError(StokerError, ValueError):
    """An option or argument is out of its range, or applies only to another mode; raised before
    any work starts. The message names the option and what it accepts."""


class PackError(StokerError):
    """Packing stopped: a bad input under ``strict``, an unwritable destination or a full disk."""


class PackMismatchError(PackError):
    """The destination already holds a finished stoker data set made from another listing or
    other options: reusing it would serve other samples. ``dst`` names the folder."""

    def __init__(self, dst: str) -> None:
        self.dst = dst
        super().__init__(f"{dst}: already holds a stoker data set made from other input or options; "
                         "pack into a new folder or delete it first")

    def __reduce__(self):
        return type(self), (self.dst,)


class TransformError(StokerError):
    """A user's per-sample transform raised; ``key`` names the sample it was given, and the
    transform's own exception is the ``__cause__``."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"transform failed on sample {key!r}: {reason}")

    def __reduce__(self):
        return type(self), (self.key, self.reason)


class RemoteError(StokerError):
    """Remote storage failed for good: a missing object or bucket, denied access, or transient
    errors that outlasted every retry. The message names the URL and the cause."""


class LocalWriteError(StokerError):
    """A local copy (the node cache, a stage destination) could not be written: a full disk, a
    read-only or missing folder. Never retried, and never blamed on the source."""


class ResourceLimitError(StokerError):
    """The process or the system ran out of something it limits (open file descriptors): not a
    fault of the data, and never reported as damage. The message names the file and the limit to
    raise."""
