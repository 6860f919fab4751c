"""Loader(decode="gpu") + stoker.augment on the GPU, against decode="cpu" (threads) + the same
augment on the GPU: img/s per epoch, CPU and GPU utilisation per phase, and which one bounds it.

    python3 bench/gpu_loader.py SHARDS [--epochs 3] [--batch 256] [--threads 16] [--json OUT.json]

Phases (each: one warm-up epoch, then --epochs timed epochs over the whole pack):
  gpu_decode              Loader(decode="gpu", device=cuda), nothing after it
  gpu_decode+augment      the same + stoker.augment (ColorJitter + Normalize, float16) on the GPU
  cpu16_host              Loader(decode="cpu", threads=N), batches left on the host (the CPU decode ceiling)
  cpu16_to_gpu            Loader(decode="cpu", threads=N, device=cuda): pinned copy to the GPU
  cpu16_to_gpu+augment    the same + stoker.augment on the GPU
The Loader's own crop (RandomResizedCrop 224 + flip, CropSpec's default) runs in every phase.

Per phase: whole-machine CPU % (psutil, else /proc/stat), this process's CPU seconds / wall
(cores busy), the consumer (main) thread's CPU seconds / wall (1.0: the loop is serial on one
core: Python, nvJPEG's host side, the pinned copy), and GPU utilisation sampled every 100-200 ms
(pynvml, else `nvidia-smi -lms 200`). Without CUDA the GPU phases are skipped and the rest runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback

import torch

import stoker
import stoker.augment as A


class CpuMeter:
    """Whole-machine busy share between start() and stop(): psutil, else /proc/stat."""

    def __init__(self) -> None:
        try:
            import psutil

            self.psutil = psutil
        except ImportError:
            self.psutil = None

    @staticmethod
    def _stat() -> tuple[float, float]:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        return sum(fields) - idle, sum(fields)

    def start(self) -> None:
        if self.psutil:
            self.psutil.cpu_percent(None)
            self.psutil.cpu_percent(None, percpu=True)
        else:
            self.begin = self._stat()

    def stop(self) -> dict:
        if self.psutil:
            total = self.psutil.cpu_percent(None)
            per = self.psutil.cpu_percent(None, percpu=True)
            return {"machine_cpu_percent": round(total, 1), "busiest_core_percent": round(max(per), 1),
                    "cores_over_90_percent": sum(p > 90 for p in per), "source": "psutil"}
        busy, total = self._stat()
        b0, t0 = self.begin
        return {"machine_cpu_percent": round(100 * (busy - b0) / max(1e-9, total - t0), 1), "source": "/proc/stat"}


class GpuMeter:
    """GPU utilisation samples in the background: pynvml every 100 ms, else nvidia-smi -lms 200."""

    def __init__(self, index: int = 0) -> None:
        self.samples: list[float] = []
        self.memory: list[float] = []
        self.how = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self.index = index

    def start(self) -> None:
        self.samples, self.memory = [], []
        self._stop.clear()
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            pynvml.nvmlDeviceGetUtilizationRates(handle)
            self.how = "pynvml, 100 ms"

            def poll() -> None:
                while not self._stop.is_set():
                    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                    self.samples.append(float(rates.gpu))
                    self.memory.append(float(rates.memory))
                    time.sleep(0.1)

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
            return
        except Exception as e:  # no pynvml, or NVML refused: try the command
            self.how = f"pynvml failed ({type(e).__name__}: {e})"
        try:
            self._proc = subprocess.Popen(["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu,utilization.memory",
                                           "--format=csv,noheader,nounits", "-lms", "200"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.how = "nvidia-smi -lms 200"

            def read() -> None:
                assert self._proc is not None and self._proc.stdout is not None
                for line in self._proc.stdout:
                    try:
                        gpu, mem = (float(x) for x in line.strip().split(","))
                    except ValueError:
                        continue
                    self.samples.append(gpu)
                    self.memory.append(mem)

            self._thread = threading.Thread(target=read, daemon=True)
            self._thread.start()
        except OSError as e:
            self.how += f"; nvidia-smi failed ({e})"

    def stop(self) -> dict:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if not self.samples:
            return {"gpu_util_source": self.how, "gpu_util_samples": 0}
        s = self.samples
        return {"gpu_util_mean": round(statistics.mean(s), 1), "gpu_util_median": statistics.median(s),
                "gpu_util_max": max(s), "gpu_mem_bw_util_mean": round(statistics.mean(self.memory), 1),
                "gpu_util_samples": len(s), "gpu_util_source": self.how}


def make_augment(device: str, ops: str) -> A.Augment:
    chain: list = []
    if ops == "rotate":
        chain.append(A.Rotate(30))
    chain += [A.ColorJitter(0.4, 0.4, 0.4, 0.1), A.Normalize()]
    dtype = torch.float16 if device == "cuda" else torch.float32
    return A.Augment(*chain, device=device, dtype=dtype, seed=0)


def run_phase(name: str, make_loader, augment, epochs: int, cuda: bool, deadline: float) -> dict:
    """One warm-up epoch and ``epochs`` timed ones; the meters cover the timed epochs only."""
    result: dict = {"phase": name}
    try:
        loader = make_loader()
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        print(f"[{name}] could not make the loader: {result['error']}", flush=True)
        return result
    result["loader"] = {"threads": loader.threads, "decode": loader.decode, "device": str(loader.device),
                        "batch_size": loader.batch_size, "batches": len(loader), "crop": repr(loader.crop)}
    if augment is not None:
        result["augment"] = {"ops": [repr(op) for op in augment.geometric + augment.photometric],
                             "device": str(augment.device), "dtype": str(augment.dtype)}
    cpu, gpu = CpuMeter(), GpuMeter(torch.cuda.current_device() if cuda else 0)
    rates: list[float] = []
    shapes = None
    try:
        for epoch in range(epochs + 1):
            if epoch == 1:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                cpu.start()
                if cuda:
                    gpu.start()
                proc0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
            start, n, first = time.perf_counter(), 0, None
            for images, _labels in loader:
                if augment is not None:
                    images = augment(images)
                n += len(images)
                if first is None:
                    first = time.perf_counter() - start
                    shapes = (tuple(images.shape), str(images.dtype), str(images.device))
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            rates.append(n / seconds)
            print(f"[{name}] epoch {epoch}{' (warm-up)' if epoch == 0 else ''}: {n} images in {seconds:.2f} s = "
                  f"{n / seconds:,.0f} img/s (first batch after {first:.3f} s)", flush=True)
            if time.perf_counter() > deadline and epoch < epochs:
                result["note"] = f"stopped after epoch {epoch}: the time budget is spent"
                print(f"[{name}] {result['note']}", flush=True)
                break
        if len(rates) > 1:
            wall = time.perf_counter() - wall0
            result["process_cores_busy"] = round((time.process_time() - proc0) / wall, 2)
            result["main_thread_busy_fraction"] = round((time.thread_time() - thread0) / wall, 3)
            result.update(cpu.stop())
            if cuda:
                result.update(gpu.stop())
                result["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        gpu.stop()
    result["epoch_img_per_s"] = [round(r) for r in rates]
    timed = rates[1:]
    if timed:
        result["img_per_s_median"] = round(statistics.median(timed))
    result["output"] = shapes
    result["bound"] = verdict(result, os.cpu_count() or 1)
    print(f"[{name}] {json.dumps({k: v for k, v in result.items() if k not in ('loader', 'augment')})}", flush=True)
    return result


def verdict(r: dict, cores: int) -> str:
    """A rough reading of the meters: which resource saturates, if any."""
    if "img_per_s_median" not in r:
        return "not measured"
    gpu = r.get("gpu_util_mean")
    busy = r.get("process_cores_busy", 0.0)
    main = r.get("main_thread_busy_fraction", 0.0)
    if gpu is not None and gpu >= 85:
        return f"GPU-bound (GPU busy {gpu:.0f}% of samples)"
    if busy >= 0.85 * cores or r.get("machine_cpu_percent", 0) >= 85:
        return f"CPU-bound ({busy:.1f} of {cores} cores busy)"
    if main >= 0.85:
        return (f"serial on the consumer thread ({main:.0%} of one core: Python, nvJPEG's host-side work, copies), "
                f"GPU {gpu if gpu is not None else '?'}%, {busy:.1f} of {cores} cores")
    return (f"neither saturated (GPU {gpu if gpu is not None else '?'}%, {busy:.1f} of {cores} cores, "
            f"main thread {main:.0%}): latency/sync")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="a packed stoker data set")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 16, help="decode='cpu' threads (default: nproc)")
    parser.add_argument("--ops", choices=["photometric", "rotate"], default="photometric",
                        help="photometric: ColorJitter(0.4, 0.4, 0.4, 0.1) + Normalize after the Loader's crop; "
                             "rotate: Rotate(30) first")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds; phases stop after the current epoch past it")
    parser.add_argument("--only", default="", help="comma-separated phase names")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.set_num_threads(args.threads)
    deadline = time.perf_counter() + args.budget
    dataset = stoker.ShardDataset(args.shards)
    info = {"shards": args.shards, "samples": len(dataset), "batch": args.batch, "threads": args.threads,
            "epochs_timed": args.epochs, "cuda": cuda, "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if cuda else None, "ops": args.ops}
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except ImportError as e:
        info["torchvision"] = f"missing ({e})"
    from stoker.env import region_decode_error

    info["region_decode"] = region_decode_error() or "yes"
    print(json.dumps(info), flush=True)
    ds = lambda: stoker.ShardDataset(args.shards)  # noqa: E731
    phases = [
        ("gpu_decode", lambda: stoker.Loader(ds(), args.batch, decode="gpu", device="cuda"), None, True),
        ("gpu_decode+augment", lambda: stoker.Loader(ds(), args.batch, decode="gpu", device="cuda"), "aug", True),
        (f"cpu{args.threads}_host", lambda: stoker.Loader(ds(), args.batch, decode="cpu", threads=args.threads), None, False),
        (f"cpu{args.threads}_to_{device}", lambda: stoker.Loader(ds(), args.batch, decode="cpu", threads=args.threads,
                                                                 device=device), None, False),
        (f"cpu{args.threads}_to_{device}+augment", lambda: stoker.Loader(ds(), args.batch, decode="cpu", threads=args.threads,
                                                                         device=device), "aug", False),
    ]
    only = [p for p in args.only.split(",") if p]
    results = []
    for name, make, aug, needs_cuda in phases:
        if only and name not in only:
            continue
        if needs_cuda and not cuda:
            results.append({"phase": name, "error": "skipped: no CUDA here"})
            print(f"[{name}] skipped: no CUDA here", flush=True)
            continue
        if time.perf_counter() > deadline:
            results.append({"phase": name, "error": "skipped: the time budget is spent"})
            print(f"[{name}] skipped: the time budget is spent", flush=True)
            continue
        augment = make_augment(device, args.ops) if aug else None
        results.append(run_phase(name, make, augment, args.epochs, cuda, deadline))
    print("\n| phase | img/s per epoch (first: warm-up) | median | machine CPU % | process cores | main thread "
          "| GPU util mean/max | bound |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['phase']} | {' / '.join(map(str, r.get('epoch_img_per_s', []))) or r.get('error', '')} | "
              f"{r.get('img_per_s_median', '')} | {r.get('machine_cpu_percent', '')} | {r.get('process_cores_busy', '')} | "
              f"{r.get('main_thread_busy_fraction', '')} | {r.get('gpu_util_mean', '')}/{r.get('gpu_util_max', '')} | "
              f"{r.get('bound', r.get('error', ''))} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "phases": results}, f, indent=1)
    return 1 if any("error" in r and not r["error"].startswith("skipped") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
