"""Where bytes come from and how fast: page-cache control now; node cache and stager later."""

from stoker.storage.pagecache import evict, resident_bytes, willneed

__all__ = ["evict", "resident_bytes", "willneed"]
