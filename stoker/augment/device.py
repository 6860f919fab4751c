"""Which device a process augments (and decodes) on: one GPU per process, never all on GPU 0.

Under torchrun / DDP every process sees every GPU of its node; a library that picks
``torch.device("cuda")`` puts every rank's work on GPU 0, next to rank 0's model. stoker takes
the rank's own GPU from ``LOCAL_RANK``, else the current CUDA device, else the CPU.
"""

from __future__ import annotations

import os

import torch


def pick_device(local_rank: str | None, cuda_devices: int, current: int | None) -> torch.device:
    """The policy as a pure function: ``LOCAL_RANK`` (as the environment holds it) modulo the
    GPUs visible, else the ``current`` CUDA device, else the CPU when there is no GPU."""
    if cuda_devices == 0:
        return torch.device("cpu")
    if local_rank not in (None, ""):
        try:
            rank = int(local_rank)
        except ValueError:
            raise ValueError(f"LOCAL_RANK={local_rank!r} is not an integer") from None
        return torch.device("cuda", rank % cuda_devices)
    return torch.device("cuda", current or 0)


def default_device() -> torch.device:
    """This process's device: its rank's GPU under torchrun, else the current GPU, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return pick_device(os.environ.get("LOCAL_RANK"), torch.cuda.device_count(), torch.cuda.current_device())
