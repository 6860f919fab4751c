"""The doctor's HTML report: the text report plus two charts drawn as inline SVG (no plotting
library needed): the cold read latency histogram, and each stage's throughput against the rate
the GPU consumes."""

from __future__ import annotations

import html
import math
import os

import numpy as np

from stoker.doctor.report import DoctorReport

_W, _BAR_H, _LEFT = 720, 22, 230


def write_html(report: DoctorReport, path: str | os.PathLike) -> None:
    """Write ``report`` as one self-contained HTML file."""
    charts = []
    if report.storage and report.storage.cold and len(report.storage.cold.latencies_ms):
        charts.append(("Cold read latency (ms, log scale)", latency_histogram(report.storage.cold.latencies_ms)))
    charts.append(("Throughput per stage (img/s, whole machine) against what the GPU consumes",
                   stage_bars(report.verdict.stage_rates, report.verdict.needed_images_per_s)))
    body = "".join(f"<h2>{html.escape(title)}</h2>{svg}" for title, svg in charts)
    page = (f"<!doctype html><meta charset='utf-8'><title>stoker doctor: {html.escape(report.target['description'])}"
            f"</title><style>body{{font-family:sans-serif;max-width:{_W + 40}px;margin:2em auto}}"
            f"pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style>"
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
        parts.append(f"<text x='{40 + k * width:.1f}' y='{base + 16}' font-size='11'>{edges[k]:.3g}</text>")
    if lo < 100 < hi:
        x = 40 + (math.log10(100) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * bins * width
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{base}' stroke='#c00' stroke-dasharray='4'/>"
                     f"<text x='{x + 4:.1f}' y='12' font-size='11' fill='#c00'>stall (100 ms)</text>")
    parts.append(f"<text x='0' y='12' font-size='11'>{top}</text></svg>")
    return "".join(parts)


def stage_bars(rates: dict[str, float], needed: float | None) -> str:
    """Horizontal SVG bars of each stage's img/s (an unlimited stage drawn as absent), with the
    GPU's consumption as a vertical line."""
    finite = {name: rate for name, rate in rates.items() if rate is not None and math.isfinite(rate)}
    scale_max = max([*finite.values(), needed or 0, 1.0]) * 1.1
    span = _W - _LEFT - 20
    height = _BAR_H * (len(finite) + 1) + 10
    parts = [f"<svg width='{_W}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"]
    for k, (name, rate) in enumerate(finite.items()):
        y = 5 + k * _BAR_H
        w = rate / scale_max * span
        parts.append(f"<text x='0' y='{y + 15}' font-size='12'>{html.escape(name)}</text>"
                     f"<rect x='{_LEFT}' y='{y}' width='{w:.1f}' height='{_BAR_H - 6}' fill='#4a7ebb'/>"
                     f"<text x='{_LEFT + w + 4:.1f}' y='{y + 13}' font-size='11'>{rate:,.0f}</text>")
    if needed:
        x = _LEFT + needed / scale_max * span
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{height - 15}' stroke='#c00' stroke-width='2'/>"
                     f"<text x='{x + 4:.1f}' y='{height - 2}' font-size='11' fill='#c00'>GPU consumes {needed:,.0f}</text>")
    return "".join(parts) + "</svg>"
