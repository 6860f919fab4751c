"""How well global batches mix under placement by partitions (issue 42) against today's one global
order, on the same world: pure plans, no files (a few seconds).

A labelled data set laid out as an ImageNet-like pack: ``--classes`` classes of ``--per-class``
samples, shards of ``--shard`` samples, blocks of ``--block`` samples (8 MiB of 110 KB JPEGs), packed
in class order (the worst case for a block order: each block holds one class) or shuffled
(``--shuffled``). For N nodes of ``--ranks`` ranks, ``--batch`` samples per rank, epoch 0 is planned
for every rank twice: with one partition (today's order: one global sequence dealt to the ranks in
turn) and with the default partitions for N nodes (each rank's batches from its node's). Per global
step (the ranks' batches together), it measures:

    tv        the total-variation distance of the step's class histogram from the data set's,
              1/2 sum |p_batch(c) - p_data(c)|, averaged over the steps (lower mixes better)
    blocks    the distinct blocks the step's samples come from, averaged over the steps
    foreign   the samples a rank read from another node's shards (the tail at the epoch's end; with
              one partition every node reads from everywhere)
    random    the tv of global batches drawn from a full shuffle (``order="random"``), for scale: the
              floor that sampling noise leaves

    .venv/bin/python bench/placement_mixing.py [--shuffled] [--nodes 1 2 4 8]
"""

from __future__ import annotations

import argparse

import numpy as np

from stoker.data.epoch import BlockOrder, plan_epoch
from stoker.data.order import block_bounds
from stoker.data.placement import Placement, default_partitions


def layout(classes: int, per_class: int, shard: int, block: int, shuffled: bool) -> tuple[BlockOrder, np.ndarray]:
    """The order of the pack and its labels (in stored order)."""
    labels = np.repeat(np.arange(classes), per_class)
    if shuffled:
        labels = np.random.default_rng(0).permutation(labels)
    n = len(labels)
    starts = np.append(np.arange(0, n, shard), n).astype(np.int64)
    shard_of = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    offset = np.arange(n) - starts[shard_of]  # one sample per unit: a block is ``block`` samples
    bounds = block_bounds(shard_of, offset, block)
    return BlockOrder(bounds, "quasi_random", 16, starts), labels


def measure(order: BlockOrder, labels: np.ndarray, nodes: int, ranks: int, batch: int,
            partitions: int) -> tuple[float, float, int]:
    """Mean TV distance and mean distinct blocks of the global steps, and the samples read across nodes."""
    world = nodes * ranks
    placement = Placement.of(partitions, nodes)
    plans = [plan_epoch(order, seed=1, epoch=0, start=0, world_size=world, rank=r, batch_size=batch,
                        drop_last=False, placement=placement) for r in range(world)]
    data = np.bincount(labels) / len(labels)
    block_of = np.searchsorted(order.bounds, np.arange(len(labels)), side="right") - 1
    node_of_sample = np.array(placement.node_of)[order.part_of(np.arange(len(labels)), partitions)]
    tvs, blocks, foreign = [], [], 0
    for step in range(len(plans[0].batches)):
        parts = [plan.share[step * batch : (step + 1) * batch] for plan in plans if step < len(plan.batches)]
        together = np.concatenate(parts)
        tvs.append(0.5 * np.abs(np.bincount(labels[together], minlength=len(data)) / len(together) - data).sum())
        blocks.append(len(np.unique(block_of[together])))
        foreign += sum(int((node_of_sample[part] != rank // ranks).sum()) for rank, part in enumerate(parts))
    return float(np.mean(tvs)), float(np.mean(blocks)), foreign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--per-class", type=int, default=1280)
    parser.add_argument("--shard", type=int, default=1000)
    parser.add_argument("--block", type=int, default=70)
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--shuffled", action="store_true", help="a pack in random order (default: class order)")
    args = parser.parse_args()
    order, labels = layout(args.classes, args.per_class, args.shard, args.block, args.shuffled)
    shards = len(order.shard_starts) - 1
    print(f"{len(labels)} samples, {args.classes} classes, {shards} shards, {len(order.bounds) - 1} blocks, "
          f"{'shuffled' if args.shuffled else 'class-ordered'} pack; {args.ranks} ranks per node x {args.batch}")
    print(f"{'nodes':>5} {'global batch':>12} | {'today: tv':>9} {'blocks':>7} | {'partitions':>10} {'tv':>6} "
          f"{'blocks':>7} {'foreign':>8} | {'random: tv':>10}")
    shuffled = BlockOrder(order.bounds, "random", 16, order.shard_starts)
    for nodes in args.nodes:
        partitions = default_partitions(shards, nodes)
        tv_today, blocks_today, _ = measure(order, labels, nodes, args.ranks, args.batch, 1)
        tv, blocks, foreign = measure(order, labels, nodes, args.ranks, args.batch, partitions)
        tv_random = measure(shuffled, labels, nodes, args.ranks, args.batch, 1)[0]
        print(f"{nodes:>5} {nodes * args.ranks * args.batch:>12} | {tv_today:>9.3f} {blocks_today:>7.1f} | "
              f"{partitions:>10} {tv:>6.3f} {blocks:>7.1f} {foreign:>8} | {tv_random:>10.3f}")


if __name__ == "__main__":
    main()
