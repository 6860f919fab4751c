"""Measuring where input time goes: ``stoker doctor`` / :func:`doctor` before training,
:func:`watch` during it, and the timing helpers the demo and benchmarks share."""

from stoker.doctor.html import write_html
from stoker.doctor.report import DoctorReport
from stoker.doctor.run import doctor
from stoker.doctor.timing import Rate, time_loader
from stoker.watch import Watched, WatchSummary, watch  # its own module: wrapping a loader imports no doctor

__all__ = ["DoctorReport", "Rate", "WatchSummary", "Watched", "doctor", "time_loader", "watch", "write_html"]
