"""The Ray engine: shard jobs as Ray tasks on an existing cluster, or on a local Ray instance.

The plan is fixed by the driver before any task runs (stoker/pack/packer.py), and a task is one
whole shard, so the output is byte for byte what the local engine writes. Each task writes its
shard and record straight to the destination, which every node must reach: a shared file system
path, or an object store URL (the task uploads what it wrote). Ray retries a task whose worker or
node died; a killed driver leaves finished shards, and a rerun redoes only the missing ones.

Unless Ray is already initialised in the calling process, the Ray driver runs in a process of
its own (``python -m stoker.pack.ray_engine``), fed the jobs through cloudpickle and sending the
records back. Ray's gRPC threads outlive ``ray.shutdown()``, and a process forked after that
(our local engine, DataLoader workers) crashed with SIGSEGV in about one fork in three, measured
here; so the calling process never loads Ray itself.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import replace
from typing import IO, Any

from stoker.errors import PackError, StokerError
from stoker.pack.shard_job import ShardJob, ShardRecord, run_shard_job
from stoker.sources.inputs import Inputs

TASK_RETRIES = 3
DRIVER_EXIT_SECONDS = 60
_FRAME = struct.Struct("<Q")


def run_on_ray(todo: list[ShardJob], workers: int | None, progress: Callable[[int], None],
               address: str | None = None) -> Generator[ShardRecord, None, None]:
    """Run ``todo`` as Ray tasks, at most ``workers`` at once (default: as many as the cluster
    schedules); yield each record as its shard is done. Progress counts whole shards: reporting
    from inside tasks needs an actor, whose process start cost a 2-core machine ~1 s of CPU per
    pack (measured: the Ray engine at 51% of the local engine's rate with one, ~100% without).

    ``address``: the cluster to join (``ray://`` or ``host:port``); None joins the one ``ray.init``
    finds (``RAY_ADDRESS``, or a cluster started on this node), else starts a local instance. A
    Ray session that was already initialised in this process is used as it is.
    """
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("cloudpickle") is None:
        raise PackError("engine='ray' needs Ray: pip install 'stoker[ray]'")
    sizes = {job.name: len(job.items) for job in todo}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        records = _run_in_session(ray, todo, workers)
    else:
        records = _run_in_driver_process(todo, workers, address)
    with closing(records):  # leaving early stops the driver process or cancels the tasks
        for record in records:
            progress(sizes[record.name])
            yield record


def _run_in_session(ray: Any, todo: list[ShardJob], workers: int | None) -> Generator[ShardRecord, None, None]:
    """The tasks on the Ray session of this process."""
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_ray_task)
    inputs = ray.put(todo[0].inputs)  # once into the object store, not pickled into every task (a Dataset)
    queued = list(reversed(todo))
    running: list[Any] = []
    limit = workers or len(todo)
    try:
        while queued or running:
            while queued and len(running) < limit:
                running.append(task.remote(replace(queued.pop(), inputs=None), inputs))
            done, running = ray.wait(running, num_returns=1)
            for ref in done:
                yield _result(ray, ref)
    except BaseException:
        for ref in running:
            ray.cancel(ref, force=True)
        raise


def _ray_task(job: ShardJob, inputs: Inputs) -> ShardRecord:
    return run_shard_job(replace(job, inputs=inputs))


def _result(ray: Any, ref: Any) -> ShardRecord:
    """The task's record. A stoker error in the task (bad input with strict, a full disk) is raised
    as it is; anything else Ray reports (a task's other exceptions, a worker, node or object lost
    after the retries, memory) becomes a PackError that says finished shards are kept."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, StokerError):
            raise e.cause from None
        cause = e.cause if e.cause is not None else e
        raise PackError(f"a Ray pack task failed: {type(cause).__name__}: {cause}") from None
    except ray.exceptions.RayError as e:
        raise PackError(f"a Ray pack task was lost ({type(e).__name__}: {e}); finished shards are kept: run the "
                        "same command again to resume") from None


def _run_in_driver_process(todo: list[ShardJob], workers: int | None, address: str | None) -> Generator[ShardRecord, None, None]:
    """The tasks run by a driver process of our own; its records come back through a pipe."""
    import cloudpickle  # the jobs may hold a Dataset of a class defined in the caller's script

    read_end, write_end = os.pipe()
    driver = subprocess.Popen([sys.executable, "-m", "stoker.pack.ray_engine", str(write_end)],
                              stdin=subprocess.PIPE, pass_fds=(write_end,))
    os.close(write_end)
    received, finished = 0, False
    try:
        with os.fdopen(read_end, "rb") as frames:
            try:
                # This process's import path first (a Dataset's module beside the user's script), then the jobs.
                paths = [os.path.abspath(p or os.curdir) for p in sys.path]
                assert driver.stdin is not None  # stdin=PIPE
                driver.stdin.write(json.dumps(paths).encode() + b"\n" + cloudpickle.dumps((todo, workers, address)))
                driver.stdin.close()
            except BrokenPipeError:  # the driver died before reading its input: its status is reported below
                pass
            while (frame := _read_frame(frames)) is not None:
                kind, value = frame
                if kind == "error":
                    finished = True  # the driver stops its tasks and Ray on its own
                    raise value
                received += 1
                yield value
        finished = True
    finally:
        if not finished:  # stopped early (Ctrl-C, the caller's error): the driver's tasks are cancelled with it
            driver.terminate()
        try:
            driver.wait(timeout=DRIVER_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
    if driver.returncode != 0 and received < len(todo):
        raise PackError(f"the Ray driver process ended with status {driver.returncode} (its messages are above); "
                        "finished shards are kept: run the same command again to resume")


def _drive(out: IO[bytes]) -> None:
    """The driver process: jobs from stdin, one frame per record (or the error) to ``out``."""
    import cloudpickle
    import ray

    paths = json.loads(sys.stdin.buffer.readline())
    extra = [p for p in paths if p not in sys.path]
    sys.path.extend(extra)
    todo, workers, address = cloudpickle.loads(sys.stdin.buffer.read())
    try:
        # The same import path for the tasks, as Ray gives a driver script's folder to its workers.
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING,
                 job_config=ray.job_config.JobConfig(_py_driver_sys_path=extra))
    except Exception as e:  # noqa: BLE001 -- a wrong address, a refused token: Ray raises several kinds
        _write_frame(out, ("error", PackError(f"cannot start or join Ray (address {address!r}): "
                                              f"{type(e).__name__}: {e}")))
        return
    try:
        for record in _run_in_session(ray, todo, workers):
            _write_frame(out, ("record", record))
    except StokerError as e:
        _write_frame(out, ("error", e))
    finally:
        ray.shutdown()


def _write_frame(out: IO[bytes], value: object) -> None:
    data = pickle.dumps(value)
    out.write(_FRAME.pack(len(data)) + data)
    out.flush()


def _read_frame(frames: IO[bytes]) -> Any:
    """The next frame from our own driver process (trusted: it is our child); None at the end, or
    where the driver died in the middle of a frame (its exit status tells)."""
    head = frames.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    size = _FRAME.unpack(head)[0]
    body = frames.read(size)
    return pickle.loads(body) if len(body) == size else None


if __name__ == "__main__":
    with os.fdopen(int(sys.argv[1]), "wb") as records_out:
        _drive(records_out)
