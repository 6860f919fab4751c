"""StorageSettings: how one data set's bytes are fetched and kept on the node, as one value.

``ShardDataset``'s storage arguments (``storage_options``, ``read_timeout``, ``reads_in_flight``,
``cache_dir``, ``cache_limit``, ``cache_ahead``) are checked once, here, through
:mod:`stoker.ranges`, and travel as this frozen record: to the data set's one origin connection
(:meth:`StorageSettings.origin`, a :class:`RemoteData` that its range reads and its node cache
share), to the node cache, and pickled as one value to every worker process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stoker.ranges import CACHE_AHEAD, CACHE_LIMIT, READ_TIMEOUT, READS_IN_FLIGHT
from stoker.storage.node import this_node
from stoker.storage.remote import DEFAULT_PARALLEL, DEFAULT_READ_TIMEOUT, RemoteData, cache_root, is_url


@dataclass(frozen=True)
class StorageSettings:
    """``storage_options``: fsspec's (credentials, ``endpoint_url``); ``read_timeout``: seconds a
    read of the origin keeps retrying without progress (``inf``: for ever); ``reads_in_flight``:
    ranged reads of the origin at once per process (None: 16, which a Loader's tuner may change);
    ``cache_dir``: a node cache of whole shards there (None: none), within ``cache_limit`` bytes
    (None: the cache folder's own default), staged at most ``cache_ahead`` shards ahead of a reader
    (None: as far as the limit allows); ``cache_chosen``: the folder was chosen by :meth:`for_node`,
    not given. Each is checked when the record is made (OptionError naming it and what it accepts)."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    read_timeout: float = DEFAULT_READ_TIMEOUT
    reads_in_flight: int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    cache_ahead: int | None = None
    cache_chosen: bool = False

    def __post_init__(self) -> None:
        READ_TIMEOUT.check(self.read_timeout)
        if self.reads_in_flight is not None:
            READS_IN_FLIGHT.check(self.reads_in_flight)
        if self.cache_limit is not None:
            CACHE_LIMIT.check(self.cache_limit)
        if self.cache_ahead is not None:
            CACHE_AHEAD.check(self.cache_ahead)
        # A copy of the caller's options (the record never changes), and the folder as a Path.
        object.__setattr__(self, "storage_options", dict(self.storage_options or {}))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(os.fspath(self.cache_dir)))

    def for_node(self, root: str | os.PathLike) -> StorageSettings:
        """These settings for the data set at ``root`` read by this process: as given, except that
        one of several ranks (WORLD_SIZE > 1, see :mod:`stoker.storage.node`) reading a URL without
        ``cache_dir`` gets the node cache in ``$XDG_CACHE_HOME/stoker/shards`` (``cache_chosen``),
        so that the node's ranks and their worker processes fetch each shard once between them
        instead of each fetching the blocks it reads into its own memory."""
        if self.cache_dir is not None or not is_url(root) or this_node().ranks == 1:
            return self
        return replace(self, cache_dir=cache_root() / "shards", cache_chosen=True)

    def origin(self, url: str) -> RemoteData:
        """The connection to the data set at ``url`` (a URL or a local path) these settings describe."""
        return RemoteData(url, self.storage_options, read_timeout=self.read_timeout,
                          parallel=self.reads_in_flight or DEFAULT_PARALLEL)
