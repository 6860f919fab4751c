"""Data echoing on a real task: does it buy accuracy per second when the input pipeline is slow?

A small CNN learns scikit-learn's handwritten digits (1,797 8x8 images; 80/20 split, fixed).
The training step is padded to a fixed time (--step-ms, as a GPU step would be); the input
pipeline makes a batch of 32 in R x that time (a slow loader: it sleeps, leaving the core to the
step). Each configuration trains for the same wall-clock budget, with the same prefetching
thread: no echo (``stoker.echo(max_factor=1)``), fixed factors 2 and 4, and adaptive
(``max_factor=4``). Augmentation (random 1-pixel shifts and noise) runs after echoing, so every
echo is augmented afresh. Test accuracy is recorded every 0.5 s of training time.

    .venv/bin/pip install 'stoker[bench]'    # scikit-learn, matplotlib
    .venv/bin/python bench/echo.py                    # R = 1, 2, 4; 3 seeds; 6 s each (~4 min)
    .venv/bin/python bench/echo.py --plot docs/echo.png
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import stoker

from _common import header

BATCH = 32
CONFIGS = {"no echo": {"max_factor": 1}, "fixed 2": {"factor": 2}, "fixed 4": {"factor": 4},
           "adaptive": {"max_factor": 4}}
EVAL_EVERY = 0.5


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y)
    train, test = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y.numpy(), random_state=0)
    return x[train], y[train], x[test], y[test]


def slow_batches(x: torch.Tensor, y: torch.Tensor, delay: float, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled batches, epoch after epoch, each taking ``delay`` seconds to make."""
    rng = np.random.default_rng(seed)
    while True:
        order = torch.from_numpy(rng.permutation(len(y)))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            time.sleep(delay)
            rows = order[start : start + BATCH]
            yield x[rows], y[rows]


def augment(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Random shift by up to one pixel and a little noise, per example."""
    images, labels = batch
    padded = F.pad(images, (1, 1, 1, 1))
    dx, dy = torch.randint(0, 3, (2, len(images)))
    shifted = torch.stack([padded[i, :, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8] for i in range(len(images))])
    return shifted + 0.05 * torch.randn_like(shifted), labels


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 16, 10))


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def train(config: dict, ratio: float, step: float, budget: float, seed: int, data) -> dict:
    """One run: accuracy every EVAL_EVERY seconds of training time, with fresh examples seen by then."""
    x, y, x_test, y_test = data
    torch.manual_seed(seed)
    net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    batches = stoker.echo(slow_batches(x, y, ratio * step, seed), transform=augment, seed=seed, **config)
    curve = [(0.0, 0, accuracy(net, x_test, y_test))]
    trained = 0.0
    started = time.perf_counter()
    for images, labels in batches:
        optimizer.zero_grad()
        F.cross_entropy(net(images), labels).backward()
        optimizer.step()
        while time.perf_counter() - started < step:  # pad to the step time; sleeping would be too coarse
            time.sleep(0.0005)
        trained += time.perf_counter() - started
        if trained >= curve[-1][0] + EVAL_EVERY:
            curve.append((trained, batches.stats().fresh_examples, accuracy(net, x_test, y_test)))
            if trained >= budget:
                break
        started = time.perf_counter()
    stats = batches.stats()
    return {"curve": curve, "factor": stats.effective_factor, "wait": stats.wait_s / trained}


def at(curve: list, column: int, value: float) -> float:
    """Accuracy at the first point of ``curve`` whose ``column`` reaches ``value`` (nan if none does)."""
    return next((point[2] for point in curve if point[column] >= value), float("nan"))


def summary(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * spread:.1f}"


def plot(results: dict, ratios: list[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(ratios), figsize=(4 * len(ratios), 6.5), squeeze=False)
    for c, ratio in enumerate(ratios):
        for name in CONFIGS:
            runs = results[(ratio, name)]
            n = min(len(r["curve"]) for r in runs)
            t = np.mean([[p[0] for p in r["curve"][:n]] for r in runs], axis=0)
            fresh = np.mean([[p[1] for p in r["curve"][:n]] for r in runs], axis=0)
            acc = np.array([[p[2] for p in r["curve"][:n]] for r in runs])
            for row, xs in ((0, t), (1, fresh)):
                axes[row, c].plot(xs, acc.mean(0), label=name)
                axes[row, c].fill_between(xs, acc.min(0), acc.max(0), alpha=0.2)
        axes[0, c].set_title(f"upstream {ratio:g}x slower than the step")
        axes[0, c].set_xlabel("training time (s)")
        axes[1, c].set_xlabel("fresh examples")
        for row in range(2):
            axes[row, c].set_ylim(0.5, 1.0)
            axes[row, c].grid(alpha=0.3)
        axes[0, c].set_ylabel("test accuracy")
        axes[1, c].set_ylabel("test accuracy")
    axes[0, 0].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", default="1,2,4", help="upstream time / step time")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=6.0, help="training seconds per run")
    parser.add_argument("--step-ms", type=float, default=8.0)
    parser.add_argument("--plot", help="write the curves to this PNG")
    args = parser.parse_args()
    header(f"data echoing on sklearn digits: {args.seeds} seeds x {args.budget:g} s per configuration")
    torch.set_num_threads(1)
    data = digits()
    ratios = [float(r) for r in args.ratios.split(",")]
    results: dict = {}
    for seed in range(args.seeds):
        for ratio in ratios:
            for name, config in CONFIGS.items():  # interleaved: drift hits every configuration alike
                results.setdefault((ratio, name), []).append(train(config, ratio, args.step_ms / 1e3, args.budget,
                                                                   seed, data))
    fresh_mark = min(r["curve"][-1][1] for runs in results.values() for r in runs)
    print(f"test accuracy % (mean ± std over {args.seeds} seeds); 'equal fresh' = when {fresh_mark:,} fresh examples "
          f"had been used (what the slowest configuration reached)")
    print("| R | configuration | after half the budget | after the budget | at equal fresh | echo factor | data wait |")
    print("|---|---|---|---|---|---|---|")
    for ratio in ratios:
        for name in CONFIGS:
            runs = results[(ratio, name)]
            print(f"| {ratio:g} | {name} | {summary([at(r['curve'], 0, args.budget / 2) for r in runs])} "
                  f"| {summary([r['curve'][-1][2] for r in runs])} | {summary([at(r['curve'], 1, fresh_mark) for r in runs])} "
                  f"| {statistics.mean(r['factor'] for r in runs):.2f} | {100 * statistics.mean(r['wait'] for r in runs):.0f}% |")
    if args.plot:
        plot(results, ratios, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
