"""Where bytes come from and how fast: page-cache control now; node cache and stager later."""

from stoker.storage.pagecache import evict, resident_bytes, resident_pages, willneed

__all__ = ["evict", "resident_bytes", "resident_pages", "willneed"]
