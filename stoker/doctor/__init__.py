"""Measuring where input time goes. For now: timing helpers shared by the demo and benchmarks."""

from stoker.doctor.timing import Rate, time_loader

__all__ = ["Rate", "time_loader"]
