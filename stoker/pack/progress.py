"""The pack's progress bar."""

from __future__ import annotations

from tqdm import tqdm


class LazyBar:
    """A tqdm bar created on first update: after the engine has started its workers, so that no
    forked worker inherits the bar's monitor thread."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.total, self.initial, self.enabled = total, initial, enabled
        self.bar: tqdm | None = None

    def update(self, samples: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=self.total, initial=self.initial, unit="img", desc="pack",
                            disable=not self.enabled, smoothing=0.1)
        self.bar.update(samples)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
