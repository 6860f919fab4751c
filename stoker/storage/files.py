"""Opening files, where running out of descriptors is the limit's fault, never the data's."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

from stoker.errors import ResourceLimitError


def open_readonly(path: str | os.PathLike) -> int:
    """A read-only descriptor of ``path`` (closed in a child that execs); ResourceLimitError when
    the process or the system has no descriptor left, any other OSError as it is."""
    with descriptor_limit(path):
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


@contextmanager
def descriptor_limit(path: str | os.PathLike) -> Iterator[None]:
    """Within the block, an OSError of no file descriptor left becomes a ResourceLimitError naming
    ``path`` (see :func:`raise_if_out_of_files`); any other error passes as it is."""
    try:
        yield
    except OSError as e:
        raise_if_out_of_files(e, path)
        raise


def raise_if_out_of_files(error: OSError, path: str | os.PathLike) -> None:
    """Raise ResourceLimitError, saying which limit to raise, when ``error`` (met opening ``path``)
    is the process (EMFILE) or the system (ENFILE) out of file descriptors."""
    if error.errno == errno.EMFILE:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = "no hard limit" if hard == resource.RLIM_INFINITY else f"the hard limit is {hard}"
        raise ResourceLimitError(
            f"{path}: cannot open: this process has as many files open as its limit allows ({soft} "
            f"descriptors, RLIMIT_NOFILE; {ceiling}): raise it (`ulimit -n N` before starting, or "
            "resource.setrlimit), lower max_open_shards (each open shard holds 2 descriptors), or close "
            "data sets no longer used (ShardDataset.close(), or `with ShardDataset(...) as data:`)") from None
    if error.errno == errno.ENFILE:
        raise ResourceLimitError(f"{path}: cannot open: the system has all the files open that it allows "
                                 "(ENFILE): raise fs.file-max (sysctl) or end processes holding many files") from None
