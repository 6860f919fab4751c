"""A pass's batches as the loop gets them: every fresh batch in order, and, once the tuner allows
echoes (``Loader(echo="auto")``, the plan's ``settings.echo`` above 1), an echo whenever no fresh
batch is ready: stoker.echo's adaptive policy and memory, an example served at most ``echo`` times.

    echo 1 (the default):  the batches made, taken one by one in the loop's thread
    echo k > 1:            an upstream thread (stoker.echo's) takes the batches made; the loop
                           gets the next fresh one if it is ready, else an echo drawn from the
                           last ECHO_BATCHES fresh ones while their examples may be served again,
                           else waits for the fresh one

Echoes are never counted as progress: the pass still yields every fresh batch once, in order, and
the state says where the fresh ones are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stoker.echo.echo import END, EchoMemory, Upstream
from stoker.loader.batches import Made
from stoker.tune.settings import ECHO_BATCHES

Delivered = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Served:
    """One batch the loop gets: ``made`` (a fresh batch, not yet delivered) or ``echo`` (delivered)."""

    made: Made | None = None
    echo: Delivered | None = None


class ServedBatches:
    """The batches of one pass (``made``) as served to the loop; ``echo()`` says how many times an
    example may be served at the moment (1: never echoed); ``seed`` seeds the echoes' draws."""

    def __init__(self, made: Iterator[Made], echo: Callable[[], int], seed: int, owner: Any) -> None:
        self._made, self._echo, self._owner = made, echo, owner
        self._rng = np.random.default_rng(seed)
        self._upstream: Upstream | None = None
        self._memory: EchoMemory | None = None

    def next(self) -> Served | None:
        """The next batch to serve (None: the pass's fresh batches are all served)."""
        limit = self._echo()
        if self._upstream is None and limit <= 1:
            made = next(self._made, None)
            return None if made is None else Served(made)
        if self._upstream is None:  # echoes allowed from now on: the batches made go through a thread
            self._upstream = Upstream(self._made, self._owner, prefetch=1, stateful=False)
            self._memory = EchoMemory("example", ECHO_BATCHES, self._rng, limit, strict=False)
        assert self._memory is not None
        self._memory.limit = limit
        item = self._upstream.poll()
        if item is None and limit > 1 and (echoed := self._memory.echo()) is not None:
            return Served(echo=echoed)
        if item is None:
            item = self._upstream.get()
        return None if item is END else Served(item[0])

    def keep(self, delivered: Delivered) -> None:
        """A fresh batch as the loop got it: echoes are drawn from it while echoing."""
        if self._memory is not None:
            self._memory.add(delivered)

    def close(self) -> None:
        """Let go of the batches made (the upstream thread stops at the batch it is taking)."""
        if self._upstream is not None:
            self._upstream.stop()
            self._upstream.join()
