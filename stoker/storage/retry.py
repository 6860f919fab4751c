"""Retrying remote reads: transient errors again after a growing, jittered pause, within a bound
on attempts or a deadline; permanent ones at once."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from stoker.errors import RemoteError, StokerError
from stoker.storage.deadline import Deadline

log = logging.getLogger("stoker.storage")
T = TypeVar("T")
# The longest pause between two attempts, by default.
MAX_PAUSE = 8.0


def with_retries(url: str, action: Callable[[], T], *, retries: int | None = 5, backoff: float = 0.5,
                 deadline: Deadline | None = None, max_pause: float = MAX_PAUSE,
                 error: type[RemoteError] = RemoteError, give_up: Callable[[], bool] | None = None) -> T:
    """``action()``, retried after transient errors, pausing ``backoff``, then twice that, and so
    on up to ``max_pause`` (a store back after an outage is noticed within that), each pause
    jittered to between half and all of it (so clients that failed together do not retry
    together). It gives up after ``retries`` retries (None: no limit) or once ``deadline``
    passes before the next attempt could start (None: no limit), whichever comes first
    (defaults: 5 retries, 7.75 to 15.5 s in all); ``action`` hands the same deadline to the
    backend (:func:`stoker.storage.deadline.call_within`), so no attempt outlives it. Missing
    objects and denied access are permanent and raise ``error`` at once; a StokerError (a
    malformed manifest, data found damaged at the source, a failed local write, no file
    descriptor left) or a wrong call (TypeError, ValueError) propagates as it is; every other error (each fsspec backend has its
    own: botocore's connection errors, aiohttp's, OSError; an answer abandoned or not what was
    asked) counts as transient. ``error`` messages name ``url``
    (give the range too where one is read), the attempts, the time and the last cause.
    ``action`` may keep what it got between attempts (a ranged read resumes from its last good
    byte). ``give_up()`` true after a transient error ends the retries at once (a read ahead that
    nobody will wait for)."""
    began = time.monotonic()
    attempt = 0
    while True:
        try:
            return action()
        except FileNotFoundError as e:
            raise error(f"{url}: not found ({_cause(e)})") from None
        except PermissionError as e:
            raise error(f"{url}: access denied: check credentials and permissions ({_cause(e)})") from None
        except (StokerError, TypeError, ValueError):  # said what is wrong already; retrying the source cannot help
            raise
        except Exception as e:  # noqa: BLE001 -- backends raise their own kinds (botocore, aiohttp, OSError)
            attempt += 1
            pause = min(max_pause, backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            elapsed = time.monotonic() - began
            if (retries is not None and attempt > retries or deadline is not None and deadline.left() < pause
                    or give_up is not None and give_up()):
                raise error(f"{url}: failed after {attempt} attempt{'s' if attempt > 1 else ''} in {elapsed:.1f} s: "
                            f"{_cause(e)}") from None
            log.warning("%s: %s; retrying in %.1f s", url, _cause(e), pause)
            time.sleep(pause)


def _cause(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
