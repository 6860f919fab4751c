"""A multi-node training job simulated on one machine, counting what each node asks of the store.

    nodes x ranks processes, each with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT) and one gloo group,
    running stoker/bench/readers/node_rank.py (stoker.Loader over a data set at an s3:// URL)
    node n:  its own ShapedLink in front of the S3 server (what node n fetched: its traffic),
             its own XDG_CACHE_HOME (metadata) and node cache folder (``cache_dir``)

Between epochs the ranks wait while each link's traffic is read, so the store's bytes are known
per node and per epoch. bench/nodes.py prints them for 1 to 8 nodes, beside another checkout's;
tests/test_nodes.py checks the guarantees on two nodes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.bench.link import ShapedLink
from stoker.format import MANIFEST_NAME

RANK_SCRIPT = Path(__file__).with_name("readers") / "node_rank.py"


@dataclass(frozen=True)
class NodeJob:
    """What a simulated job reads and how: ``url`` (s3://) with the S3 server's ``storage_options``
    (its endpoint replaced by each node's link), ``nodes`` x ``ranks`` processes, ``epochs`` of
    batches of ``batch`` per rank; a node cache in each node's folder when ``cache`` (within
    ``cache_limit`` bytes; None: its default), none given otherwise; the stoker in the folder
    ``pythonpath`` (None: the one running this)."""

    url: str
    storage_options: dict[str, Any]
    nodes: int
    ranks: int
    cache: bool
    cache_limit: int | None = None
    epochs: int = 2
    batch: int = 8
    pythonpath: str | None = None


@dataclass(frozen=True)
class NodesRun:
    """What a simulated job did: per epoch, per node, its link's traffic by object
    (:meth:`ShapedLink.traffic`, counted over that epoch, the opening of the data set in epoch 0);
    per node, per epoch, the labels its ranks delivered; per rank, how far its memory grew while it
    read the last epoch."""

    traffic: list[list[dict[str, dict[str, int]]]]
    delivered: list[list[list[int]]]
    memory_growth: list[int]

    def labels(self, epoch: int) -> list[int]:
        """The labels every rank delivered in ``epoch``."""
        return [label for node in self.delivered for label in node[epoch]]

    def shard_bytes(self, epoch: int, node: int | None = None) -> int:
        """Bytes of shards (``.tar`` objects) from the store in ``epoch``: one node's, or all nodes'."""
        nodes = range(len(self.traffic[epoch])) if node is None else [node]
        return sum(tally["body_bytes"] for n in nodes for request, tally in self.traffic[epoch][n].items()
                   if request.startswith("GET ") and request.endswith(".tar"))

    def bytes_per_shard(self, epoch: int, node: int) -> dict[str, int]:
        """Per shard object, the bytes ``node`` fetched of it in ``epoch``."""
        return {request.split()[1]: tally["body_bytes"] for request, tally in self.traffic[epoch][node].items()
                if request.startswith("GET ") and request.endswith(".tar")}

    def metadata_requests(self, node: int) -> dict[str, int]:
        """Requests ``node`` made for the manifest and for indexes, over the whole run."""
        found = {"manifest": 0, "indexes": 0}
        for epoch in self.traffic:
            for request, tally in epoch[node].items():
                if request.endswith("/" + MANIFEST_NAME):
                    found["manifest"] += tally["requests"]
                elif request.endswith(".idx"):
                    found["indexes"] += tally["requests"]
        return found

    def exact(self, samples: int) -> bool:
        """Whether every epoch delivered each of ``samples`` labels (one per sample) exactly once."""
        every = Counter(range(samples))
        return all(Counter(self.labels(epoch)) == every for epoch in range(len(self.traffic)))


def simulate(job: NodeJob, upstream_port: int, work: Path, timeout: float = 900.0) -> NodesRun:
    """Run ``job`` against the S3 server on ``upstream_port``, in the folder ``work`` (made; each
    node's cache and metadata under ``work/node-N``); RuntimeError with a rank's output if one fails."""
    work.mkdir(parents=True)
    links = [ShapedLink(upstream_port) for _ in range(job.nodes)]
    processes: list[subprocess.Popen] = []
    try:
        processes = [_start_rank(job, node, local, links[node].url, work) for node in range(job.nodes)
                     for local in range(job.ranks)]
        traffic: list[list[dict[str, dict[str, int]]]] = []
        before = [link.traffic() for link in links]
        deadline = time.monotonic() + timeout
        while len(traffic) < job.epochs:
            if (work / f"epoch-{len(traffic)}.done").exists():
                now = [link.traffic() for link in links]
                traffic.append([_minus(a, b) for a, b in zip(now, before, strict=True)])
                before = now
                (work / f"epoch-{len(traffic) - 1}.counted").touch()
            elif any(p.poll() not in (None, 0) for p in processes) or time.monotonic() > deadline:
                raise RuntimeError(f"a simulated rank failed or the job ran past {timeout:g} s:\n{_outputs(work)}")
            time.sleep(0.02)
        for process in processes:
            if process.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
                raise RuntimeError(f"a simulated rank failed:\n{_outputs(work)}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for link in links:
            link.close()
    ranks = [json.loads((work / f"rank-{rank}.json").read_text()) for rank in range(job.nodes * job.ranks)]
    delivered = [[[label for rank in ranks[node * job.ranks : (node + 1) * job.ranks] for label in rank["epochs"][epoch]]
                  for epoch in range(job.epochs)] for node in range(job.nodes)]
    return NodesRun(traffic, delivered, [rank["memory_growth"] for rank in ranks])


def _start_rank(job: NodeJob, node: int, local: int, endpoint: str, work: Path) -> subprocess.Popen:
    """Rank ``local`` of ``node``, as torchrun would start it, its requests through ``endpoint``."""
    folder = work / f"node-{node}"
    folder.mkdir(exist_ok=True)
    options = {**job.storage_options,
               "client_kwargs": {**job.storage_options.get("client_kwargs", {}), "endpoint_url": endpoint}}
    world = job.nodes * job.ranks
    env = {**os.environ, "RANK": str(node * job.ranks + local), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
           "LOCAL_WORLD_SIZE": str(job.ranks), "GROUP_RANK": str(node), "NODE_RANK": str(node),
           "GROUP_WORLD_SIZE": str(job.nodes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_master_port(work)),
           "XDG_CACHE_HOME": str(folder / "xdg"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = job.pythonpath or str(Path(__file__).resolve().parents[2])  # this stoker by default
    args = [sys.executable, str(RANK_SCRIPT), job.url, str(work), "--storage-options", json.dumps(options),
            "--epochs", str(job.epochs), "--batch", str(job.batch)]
    if job.cache:
        args += ["--cache-dir", str(folder / "cache")]
        if job.cache_limit is not None:
            args += ["--cache-limit", str(job.cache_limit)]
    log = open(folder / f"rank-{local}.log", "w")
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)


def _master_port(work: Path) -> int:
    """The job's rendezvous port: a free one, chosen once per job (kept in ``work``)."""
    chosen = work / "master-port"
    if not chosen.exists():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            chosen.write_text(str(probe.getsockname()[1]))
    return int(chosen.read_text())


def _minus(now: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Traffic between two readings of a link."""
    zero = {"requests": 0, "body_bytes": 0}
    found = {request: {key: value - before.get(request, zero)[key] for key, value in tally.items()}
             for request, tally in now.items()}
    return {request: tally for request, tally in found.items() if tally["requests"] or tally["body_bytes"]}


def _outputs(work: Path) -> str:
    """The last lines each rank wrote (its log), for an error."""
    return "\n".join(f"--- {log.relative_to(work)}\n" + "\n".join(log.read_text().splitlines()[-15:])
                     for log in sorted(work.glob("node-*/rank-*.log")))
