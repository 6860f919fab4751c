"""Data echoing: reuse batches already in memory while the input pipeline cannot keep up."""

from stoker.echo.echo import Echo, EchoStats, echo

__all__ = ["Echo", "EchoStats", "echo"]
