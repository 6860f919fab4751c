"""The doctor's HTML report: the text report (wrapped to the page) plus charts drawn as inline SVG
(no plotting library needed): the cold read latency histogram (or an object store's first-byte
latencies and MB/s by reads in flight), each stage's throughput, and the
remedies (the rate now, each remedy's predicted rate and ``--prove``'s measured one), both
against the rate the GPU consumes (batch size / step time)."""

from __future__ import annotations

import html
import math
import os

import numpy as np

from stoker.doctor.report import DoctorReport

_W, _ROW_H, _LEFT = 720, 36, 10
_NOW, _PREDICTED, _MEASURED, _STAGE = "#999999", "#4a7ebb", "#3a9a4a", "#4a7ebb"


def write_html(report: DoctorReport, path: str | os.PathLike) -> None:
    """Write ``report`` as one self-contained HTML file."""
    needed = report.verdict.needed_images_per_s
    charts = []
    if report.storage and report.storage.cold and len(report.storage.cold.latencies_ms):
        charts.append(("Cold read latency (ms, log scale)", latency_histogram(report.storage.cold.latencies_ms)))
    if report.remote and len(report.remote.first_byte_ms):
        charts.append(("Object store: first-byte latency (ms, log scale)", latency_histogram(report.remote.first_byte_ms)))
    if report.remote and report.remote.levels:
        charts.append(("Object store: MB/s by reads in flight (the proposed count in green)", in_flight_bars(report)))
    charts.append(("Throughput per stage (img/s, whole machine) against what the GPU consumes",
                   stage_bars(report.verdict.stage_rates, needed)))
    if report.verdict.remedies:
        charts.append(("Remedies: img/s now, predicted and measured (--prove) against what the GPU consumes"
                       + ("" if needed else " (no step time given: no GPU line)"), remedy_bars(report)))
    body = "".join(f"<h2>{html.escape(title)}</h2>{svg}" for title, svg in charts)
    page = (f"<!doctype html><meta charset='utf-8'><title>stoker doctor: {html.escape(report.target['description'])}"
            f"</title><style>body{{font-family:sans-serif;max-width:{_W + 40}px;margin:2em auto}}"
            "pre{background:#f6f6f6;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere}</style>"
            f"<h1>stoker doctor: {html.escape(report.verdict.bottleneck)}</h1>{body}"
            f"<h2>Report</h2><pre>{html.escape(report.to_text())}</pre>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)


def latency_histogram(latencies_ms: np.ndarray, bins: int = 24) -> str:
    """An SVG histogram of read latencies on log-spaced bins, the 100 ms stall line marked."""
    lo = max(1e-3, float(latencies_ms.min()))
    hi = max(lo * 10, float(latencies_ms.max()))
    edges = np.logspace(math.log10(lo), math.log10(hi), bins + 1)
    counts, _ = np.histogram(latencies_ms, edges)
    height, base = 200, 180
    width = (_W - 60) / bins
    top = max(1, int(counts.max()))
    parts = [f"<svg width='{_W}' height='{height + 20}' xmlns='http://www.w3.org/2000/svg'>"]
    for k, count in enumerate(counts):
        h = count / top * (base - 10)
        parts.append(f"<rect x='{40 + k * width:.1f}' y='{base - h:.1f}' width='{width - 2:.1f}' height='{h:.1f}' "
                     f"fill='#4a7ebb'><title>{edges[k]:.2f}-{edges[k + 1]:.2f} ms: {count}</title></rect>")
    for k in range(0, bins + 1, 4):
        parts.append(f"<text x='{40 + k * width:.1f}' y='{base + 16}' font-size='11' text-anchor='middle'>"
                     f"{edges[k]:.3g}</text>")
    if lo < 100 < hi:
        x = 40 + (math.log10(100) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * bins * width
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{base}' stroke='#c00' stroke-dasharray='4'/>"
                     f"<text x='{x + 4:.1f}' y='12' font-size='11' fill='#c00'>stall (100 ms)</text>")
    parts.append(f"<text x='0' y='12' font-size='11'>{top}</text></svg>")
    return "".join(parts)


def stage_bars(rates: dict[str, float], needed: float | None) -> str:
    """Each stage's img/s as a bar (an unlimited stage left out), with the GPU's consumption as a line."""
    return bars([(name, rate, _STAGE) for name, rate in rates.items() if rate is not None and math.isfinite(rate)],
                needed)


def remedy_bars(report: DoctorReport) -> str:
    """What input delivers now, then each remedy's predicted img/s and, where ``--prove`` ran it,
    the measured img/s below it, with the GPU's consumption as a line. Remedies without a
    prediction here (a GPU remedy on a machine without one) are left out."""
    measured = {p.name: p.measured for p in report.proof or []}
    rows = [("now: what input delivers", report.verdict.delivered_images_per_s, _NOW)]
    for k, remedy in enumerate(report.verdict.remedies, 1):
        if remedy.predicted_images_per_s is None:
            continue
        rows.append((f"{k}. {remedy.name}: predicted", remedy.predicted_images_per_s, _PREDICTED))
        if remedy.name in measured:
            rows.append((f"{k}. {remedy.name}: measured (--prove)", measured[remedy.name], _MEASURED))
    return bars(rows, report.verdict.needed_images_per_s)


def in_flight_bars(report: DoctorReport) -> str:
    """The object store's MB/s at each count of reads in flight, the proposed count marked."""
    remote = report.remote
    assert remote is not None
    return bars([(f"{level.in_flight} in flight", level.mb_per_s,
                  _MEASURED if level.in_flight == remote.reads_in_flight else _STAGE) for level in remote.levels],
                None, unit="MB/s")


def bars(rows: list[tuple[str, float, str]], needed: float | None, unit: str = "img/s") -> str:
    """Horizontal SVG bars (label above each, value at its end; colour per row) on one scale of
    ``unit``, with ``needed`` (what the GPU consumes, img/s) as a red vertical line across them."""
    scale_max = max([*(value for _, value, _ in rows), needed or 0, 1.0]) * 1.15
    span = _W - _LEFT - 90
    height = _ROW_H * len(rows) + 24
    parts = [f"<svg width='{_W}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"]
    if needed:  # drawn first: the bars and their numbers lie over it
        x = _LEFT + needed / scale_max * span
        parts.append(f"<line class='gpu' x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{height - 16}' stroke='#c00' "
                     f"stroke-width='2'/><text x='{min(x + 4, _W - 150):.1f}' y='{height - 3}' font-size='11' "
                     f"fill='#c00'>GPU consumes {needed:,.0f} img/s</text>")
    for k, (label, value, fill) in enumerate(rows):
        y = 4 + k * _ROW_H
        w = value / scale_max * span
        parts.append(f"<text x='{_LEFT}' y='{y + 12}' font-size='12'>{html.escape(label)}</text>"
                     f"<rect class='bar' x='{_LEFT}' y='{y + 16}' width='{w:.1f}' height='{_ROW_H - 20}' fill='{fill}'>"
                     f"<title>{html.escape(label)}: {value:,.0f} {unit}</title></rect>"
                     f"<text x='{_LEFT + w + 4:.1f}' y='{y + 28}' font-size='11' paint-order='stroke' stroke='white' "
                     f"stroke-width='3'>{value:,.0f}</text>")
    return "".join(parts) + "</svg>"
