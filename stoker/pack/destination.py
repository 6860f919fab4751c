"""The destination folder of a pack: what may be written there, the lock, and leftovers of killed runs."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from stoker.errors import PackError
from stoker.format import MANIFEST_NAME, REJECTED_NAME
from stoker.format.layout import LOCK_NAME, WORK_DIR_NAME
from stoker.sources import Source
from stoker.storage.locks import exclusive

LOCK_WAIT_SECONDS = 10.0
_OURS = {MANIFEST_NAME, REJECTED_NAME, WORK_DIR_NAME, LOCK_NAME}


def is_ours(name: str) -> bool:
    """Whether a name in the destination is one stoker writes (final files, work folder, temporaries)."""
    return name in _OURS or name.startswith("shard-") or (name.startswith(".") and name.endswith(".tmp"))


def check_destination(source: Source, dst: Path) -> None:
    """Refuse a destination inside an image-folder source, or one holding files that are not ours."""
    if dst.exists() and not dst.is_dir():
        raise PackError(f"{dst}: exists and is not a folder")
    if source.root.is_dir() and dst.resolve().is_relative_to(source.root):
        raise PackError(f"{dst}: is inside the source folder {source.root}; packing never writes into its source")
    if dst.exists():
        foreign = sorted(p.name for p in dst.iterdir() if not is_ours(p.name))
        if foreign:
            raise PackError(f"{dst}: folder holds other files ({', '.join(foreign[:3])}); pack into an empty or new folder")


def remove_leftovers(dst: Path, planned: Collection[str]) -> None:
    """Delete temporaries of killed runs and shards that the current plan does not have.

    Called with the lock held, before writing: a shard left by a run with another plan would
    otherwise sit beside the new ones, and readers that glob ``shard-*.tar`` would see it.
    """
    for path in dst.iterdir():
        name = path.name
        if name.startswith(".") and name.endswith(".tmp"):
            path.unlink(missing_ok=True)
        elif name.startswith("shard-") and name.removesuffix(".idx").removesuffix(".tar") + ".tar" not in planned:
            path.unlink(missing_ok=True)


@contextmanager
def pack_lock(dst: Path) -> Iterator[None]:
    """Held while a pack writes into ``dst``; a second pack waits for it, then gives up with PackError.

    Worker processes inherit the lock, so it is released only when the pack's last process is
    gone: a rerun never races a worker orphaned by a killed pack (workers exit within a second of
    their parent).
    """
    try:
        with exclusive(dst / LOCK_NAME, timeout=LOCK_WAIT_SECONDS):
            yield
    except TimeoutError:
        raise PackError(f"{dst}: another stoker pack is writing here") from None
