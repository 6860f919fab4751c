"""Numbers as the report shows them: rounded, and ``None`` for what was not measured or has no
limit (JSON has no infinity)."""

from __future__ import annotations

import math


def rounded(value: float | None, digits: int = 1) -> float | None:
    """``value`` rounded to ``digits``; ``None`` for ``None``, infinity and NaN."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)
