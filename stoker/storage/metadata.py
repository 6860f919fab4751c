"""The manifest and indexes of a data set at a URL, in a node-local folder, fetched once per node.

``$XDG_CACHE_HOME/stoker/metadata/<hash of the URL>/`` holds ``stoker.json`` and every
``shard-*.idx``, checked against the manifest's checksums, so indexes are memory-mapped as for a
local data set. One process of the node fetches at a time (``.lock``, an flock released when its
holder dies); one of several ranks on the node (LOCAL_WORLD_SIZE > 1) that finds a manifest
fetched within :data:`FRESH_SECONDS` uses it as it is, so the ranks of a node starting together
cost the store one manifest and one request per index, not one per rank (a process alone asks
for the manifest each time). Every process still checks each index here against the manifest
(local reads) and fetches those missing or damaged. Before the node's first request it waits its
turn (:meth:`NodePlace.stagger`), so the nodes of a large job do not all ask at once.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from stoker.format import MANIFEST_NAME, Manifest
from stoker.format.layout import atomic_write, check_name
from stoker.storage.locks import exclusive
from stoker.storage.node import this_node
from stoker.storage.remote import RemoteData, cache_root, intact

# A manifest fetched by a process of this node this recently is the data set's: the ranks of one
# job start within seconds of each other; a data set replaced at its URL is seen after this long.
FRESH_SECONDS = 60.0
# Indexes fetched together in one concurrent batch.
_BATCH = 64


def node_metadata(remote: RemoteData) -> Path:
    """The local folder holding the manifest and every index of the data set at ``remote``'s URL,
    fetching what is missing, damaged or older than :data:`FRESH_SECONDS` (see the module docstring)."""
    folder = cache_root() / "metadata" / hashlib.sha256(remote.url.encode()).hexdigest()[:24]
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".lock", inherit=False):
        node = this_node()
        fresh = node.local_ranks > 1 and _age(folder / MANIFEST_NAME) < FRESH_SECONDS
        if fresh:
            text = (folder / MANIFEST_NAME).read_bytes()
        else:
            time.sleep(node.stagger())
            text = remote.read(MANIFEST_NAME)
        manifest = Manifest.from_json(text, f"{remote.url}/{MANIFEST_NAME}")
        missing = [entry.index for entry in manifest.shards
                   if not intact(folder / check_name(entry.index), entry.index_bytes, entry.index_checksum)]
        for start in range(0, len(missing), _BATCH):
            for name, data in remote.read_many(missing[start : start + _BATCH]).items():
                atomic_write(folder / name, data)
        if not fresh:
            atomic_write(folder / MANIFEST_NAME, text)  # last: a manifest here means its indexes are
    return folder


def _age(path: Path) -> float:
    """Seconds since ``path`` was written (infinite when it is not there)."""
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")
