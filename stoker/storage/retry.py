"""Retrying remote reads: transient errors again after a growing pause, permanent ones at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from stoker.errors import CorruptDataError, FormatError, LocalWriteError, RemoteError

log = logging.getLogger("stoker.storage")
T = TypeVar("T")


def with_retries(url: str, action: Callable[[], T], *, retries: int = 5, backoff: float = 0.5,
                 error: type[RemoteError] = RemoteError) -> T:
    """``action()``, retried ``retries`` times after transient errors, sleeping ``backoff``, then
    twice that, and so on (defaults: 0.5 to 8 s, 15.5 s in all). Missing objects and denied
    access are permanent and raise ``error`` at once; a malformed manifest, data found damaged
    at the source (CorruptDataError), a failed local write or a wrong call (TypeError,
    ValueError) propagates as it is; every other
    error (each fsspec backend has its own: botocore's connection errors, aiohttp's, OSError)
    counts as transient. ``error`` messages name ``url`` and the cause."""
    for attempt in range(retries + 1):
        try:
            return action()
        except FileNotFoundError as e:
            raise error(f"{url}: not found ({_cause(e)})") from None
        except PermissionError as e:
            raise error(f"{url}: access denied: check credentials and permissions ({_cause(e)})") from None
        except (FormatError, CorruptDataError, LocalWriteError, TypeError, ValueError):  # retrying the source cannot help
            raise
        except Exception as e:  # noqa: BLE001 -- backends raise their own kinds (botocore, aiohttp, OSError)
            if attempt == retries:
                raise error(f"{url}: failed after {attempt + 1} attempts: {_cause(e)}") from None
            log.warning("%s: %s; retrying in %.1f s", url, _cause(e), backoff * 2**attempt)
            time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def _cause(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
