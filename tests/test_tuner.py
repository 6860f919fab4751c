"""The Loader's tuner on given measurements: sequences of windows in, settings out. A pipeline of
known stages (the model's Stages, hidden from the tuner) answers each setting the tuner runs with
the window a Loader would measure there, with noise where a test says so. No clock: nothing here
depends on how fast this machine is."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stoker.tune.estimate import Known, Window, estimate
from stoker.tune.model import Source, Stages, predict
from stoker.tune.settings import MIB, Settings, loader_bounds, loader_start
from stoker.tune.tuner import Decision, Tuner


def measured(true: Stages, settings: Settings, *, noise: float = 1.0, seconds: float = 1.0) -> Window:
    """The window a Loader at ``settings`` measures over a pipeline whose stages are ``true``."""
    made = predict(true, settings)
    served = made.rate * noise
    fresh = min(made.fresh * noise, served)
    images = fresh * seconds
    waited = max(0.0, 1.0 - served / true.consumer) if true.consumer < float("inf") else 0.9
    busy = settings.workers * seconds * (1.0 if served < true.consumer else fresh / made.fresh)
    cpu = images / true.per_core
    read_bytes = images * true.image_bytes if true.storage is not None else 0.0
    window = Window(seconds, round(images), round(served * seconds), waited * seconds, busy, cpu, cpu,
                    other_cores=true.other_cores if true.other_demand is None else
                    true.cores - true.cores_for(settings.workers) if made.bottleneck == "cpu" else true.other_demand)
    if true.storage is None:
        return window
    if not true.remote:
        return replace(window, disk_bytes=read_bytes)
    requests = read_bytes / settings.part_bytes
    one = true.storage.first_byte_s + settings.part_bytes / true.storage.stream_bytes_per_s
    in_flight = settings.reads_in_flight if made.bottleneck == "object store" else requests * one / seconds
    return replace(window, read_bytes=read_bytes, requests=round(requests), read_s=in_flight * seconds)


def run(tuner: Tuner, true: Stages, windows: int, noise: list[float] | None = None) -> list[Decision]:
    """``windows`` windows measured at whatever the tuner runs, its decisions in order."""
    decisions = []
    for k in range(windows):
        decisions += tuner.observe(measured(true, tuner.settings, noise=noise[k] if noise else 1.0))
    return decisions


def tuner_for(cores: int, start: Settings | None = None, *, remote: bool = False, echo: bool = False,
              ranks_here: int = 1, **bounds: object) -> Tuner:
    start = start or loader_start(cores)
    limits = replace(loader_bounds(cores, start, remote=remote, echo=echo, ranks_here=ranks_here), **bounds)
    return Tuner(limits, start, Known(cores, remote=remote))


def test_a_pipeline_bound_by_the_gil_runs_in_worker_processes_and_settles():
    true = Stages(cores=16, per_core=500, gil_rate=900, consumer=20000)
    tuner = tuner_for(16)
    decisions = run(tuner, true, 8)
    actions = [d.action for d in decisions]
    assert actions[:3] == ["try", "keep", "settle"] and actions[3:] == []  # converged in two windows
    assert tuner.settings.processes >= 9 and predict(true, tuner.settings).rate >= 0.98 * 16 * 500
    assert "the GIL" in decisions[0].why and "processes 0 ->" in decisions[0].describe()


def test_a_change_measured_no_better_is_undone_and_never_tried_again():
    """The estimate says the GIL, but worker processes measure no faster (a pipeline whose wait is
    something the model does not see): the trial is undone and not repeated."""
    true = Stages(cores=16, per_core=500, gil_rate=900, consumer=20000)
    tuner = tuner_for(16)
    decisions = []
    for _ in range(12):
        window = measured(true, replace(tuner.settings, processes=0, threads=17))  # what processes did: nothing
        decisions += tuner.observe(window)
    assert [d.action for d in decisions] == ["try", "undo", "settle"]
    assert decisions[-1].action == "settle" and tuner.settings == loader_start(16)


def test_noise_does_not_make_it_oscillate():
    """A CPU-bound Loader whose rate wanders +-4% window to window: no change is worth it, none is
    made, and the settled setting stays over hundreds of windows."""
    true = Stages(cores=2, per_core=800, consumer=5000)
    tuner = tuner_for(2)
    noise = list(np.random.default_rng(3).uniform(0.96, 1.04, 300))
    decisions = run(tuner, true, 300, noise)
    assert [d.action for d in decisions] == ["settle"] and tuner.settings == loader_start(2)


def test_noise_after_a_kept_change_does_not_undo_it():
    true = Stages(cores=4, per_core=500, consumer=20000)
    tuner = tuner_for(4, Settings(threads=2), threads=(1, 5))
    noise = list(np.random.default_rng(5).uniform(0.97, 1.03, 200))
    decisions = run(tuner, true, 200, noise)
    assert [d.action for d in decisions][:3] == ["try", "keep", "settle"] and len(decisions) == 3
    assert tuner.settings.threads == 4


def test_it_backs_off_when_other_processes_take_the_cores_and_comes_back_when_they_leave():
    """Others that hold 2 of 4 cores whatever we run (a cgroup's share): the back-off to 3 threads
    holds the rate and is kept, which shows more threads would get no more of them: settled."""
    alone = Stages(cores=4, per_core=500, consumer=20000)
    shared = replace(alone, other_cores=2.0)
    tuner = tuner_for(4)
    assert [d.action for d in run(tuner, alone, 3)] == ["settle"] and tuner.settings.threads == 5
    taken = run(tuner, shared, 4)
    assert [d.action for d in taken] == ["back off", "keep", "settle"]
    assert tuner.settings.threads == 3  # the 2 cores left, and one more: as fast as 5 threads there
    assert "other processes took 2.0 of 4 cores" in taken[0].why
    back = run(tuner, alone, 6)
    assert [d.action for d in back] == ["try", "keep", "settle"] and tuner.settings.threads == 4


def test_where_the_kernel_shares_the_cores_by_thread_it_runs_more_threads():
    """bench/autotune.py's scenario f: 2 cores, another process spinning a thread (and a little
    more). 3 threads of ours get 1.4 cores, 6 get 1.7: the tuner finds that, keeps it as measured,
    and settles; alone again, the 6 threads lose nothing (both cores are used) and stay."""
    alone = Stages(cores=2, per_core=1000, consumer=20000)
    shared = replace(alone, other_demand=1.2)
    tuner = tuner_for(2)
    assert [d.action for d in run(tuner, alone, 3)] == ["settle"] and tuner.settings.threads == 3
    taken = run(tuner, shared, 6)
    assert [d.action for d in taken] == ["try", "keep", "settle"] and tuner.settings.threads == 6
    assert predict(shared, tuner.settings).rate == pytest.approx(2000 * 6 / 7.2)
    assert tuner_for(2, ranks_here=2).bounds.threads == (1, 3)  # one of a node's ranks: no more than cores + 1
    assert run(tuner, alone, 6) == [] and predict(alone, tuner.settings).rate == 2000


def test_a_back_off_that_costs_more_than_the_margin_is_undone():
    """Where the scheduler gives each thread its share, fewer threads get less of the cores others
    share: the back-off measures slower and is undone, for the rest of these conditions."""
    tuner = tuner_for(2)
    crowded = Window(1.0, 1000, 1000, 0.5, busy_s=3.0, cpu_s=1.0, process_cpu_s=1.0, other_cores=1.0)
    [backed] = tuner.observe(crowded)
    assert backed.action == "back off" and backed.settings.threads == 2
    undone, *_ = tuner.observe(replace(crowded, images=890, served=890, cpu_s=0.89, process_cpu_s=0.89))
    assert undone.action == "undo" and "5% less" in undone.why and tuner.settings.threads == 3
    assert tuner.observe(crowded) == [] and tuner.settings.threads == 3  # not tried again


def test_a_trial_measured_while_other_processes_came_is_undone_without_judging_it():
    true = Stages(cores=16, per_core=500, gil_rate=900, consumer=20000)
    tuner = tuner_for(16)
    [tried] = tuner.observe(measured(true, tuner.settings))
    assert tried.action == "try"
    [undone] = tuner.observe(measured(replace(true, other_cores=4.0), tuner.settings))
    assert undone.action == "undo" and "not comparable" in undone.why and tuner.settings == loader_start(16)
    assert tuner.closed == set()  # it may be tried again once measured fairly


def test_fixed_arguments_and_the_memory_budget_are_kept():
    true = Stages(cores=16, per_core=500, gil_rate=900, consumer=20000)
    fixed = tuner_for(16, Settings(threads=4), threads=(4, 4), processes=(0, 0))
    run(fixed, true, 10)
    assert fixed.settings == Settings(threads=4)
    budget = tuner_for(16, memory_bytes=1e9)  # worker processes of 300 MB each: 3 at most
    run(budget, true, 10)
    assert 0 < budget.settings.processes <= 3 and budget.bounds.allows(budget.settings)


def test_more_reads_in_flight_from_a_store_that_caps_each_request_until_the_link_is_full():
    store = Source(first_byte_s=0.02, stream_bytes_per_s=5e6, link_bytes_per_s=120e6)  # a capped connection
    true = Stages(cores=16, per_core=500, storage=store, remote=True, image_bytes=100e3, consumer=20000)
    tuner = tuner_for(16, remote=True)
    decisions = run(tuner, true, 20)
    assert tuner.settings.reads_in_flight > 16
    assert predict(true, tuner.settings).rate >= 0.95 * 1200  # the link's 120 MB/s of 100 kB images
    assert decisions[-1].action == "settle" and len(decisions) <= 8


def test_a_store_whose_link_is_full_gets_no_more_reads_in_flight():
    store = Source(first_byte_s=0.02, stream_bytes_per_s=100e6, link_bytes_per_s=100e6)
    true = Stages(cores=16, per_core=500, storage=store, remote=True, image_bytes=100e3, consumer=20000)
    tuner = tuner_for(16, remote=True)
    decisions = run(tuner, true, 20)
    assert [d.action for d in decisions].count("keep") == 0 and decisions[-1].action == "settle"
    assert tuner.settings == loader_start(16)  # what it tried it undid, having learned the link's limit
    assert tuner.known.link_bytes_per_s == pytest.approx(100e6, rel=0.01)


def test_a_cold_disk_gets_more_blocks_read_ahead():
    disk = Source(first_byte_s=0.2, link_bytes_per_s=200e6)  # 16 blocks of 8 MiB per 0.2 s: 670 MB/s... capped at 200
    true = Stages(cores=16, per_core=500, storage=replace(disk, first_byte_s=1.5), image_bytes=100e3,
                  consumer=20000)
    tuner = tuner_for(16)
    run(tuner, true, 20)
    assert tuner.settings.readahead > 16 and predict(true, tuner.settings).rate >= 0.95 * 2000


def test_echo_only_where_allowed_and_after_the_rest():
    true = Stages(cores=2, per_core=500, consumer=2500)  # the cores make 1,000 img/s, the loop takes 2,500
    without = tuner_for(2)
    assert [d.action for d in run(without, true, 6)] == ["settle"] and without.settings.echo == 1
    allowed = tuner_for(2, echo=True)
    decisions = run(allowed, true, 6)
    assert [d.action for d in decisions][:2] == ["try", "keep"] and allowed.settings.echo == 3
    assert allowed.settings.threads == 3  # nothing else changed: the cores were the limit


def test_workers_idle_while_the_loop_waits_get_a_batch_more_ahead():
    tuner = tuner_for(2)
    window = Window(1.0, 1000, 1000, 0.3, busy_s=0.6, cpu_s=0.6, process_cpu_s=0.6)  # 3 threads busy 20%
    [decision] = tuner.observe(window)
    assert decision.action == "try" and decision.settings.prefetch == 3
    assert estimate(window, loader_start(2), Known(2))[1] == "queue"


def test_decisions_say_the_measurement_behind_them():
    true = Stages(cores=16, per_core=500, gil_rate=900, consumer=20000)
    tuner = tuner_for(16)
    tried, kept, settled = run(tuner, true, 3)
    assert "900 img/s served" in tried.why and "the loop waited" in tried.why and "cores" in tried.why
    assert kept.describe().startswith("keep: threads 17 -> ") and "processes 0 -> " in kept.describe()
    assert "against 900" in kept.why
    assert settled.describe().startswith("settle (")


def test_the_first_window_of_a_trial_that_starves_the_loop_is_enough_to_undo_it():
    """Whatever a trial does, one window decides it: a Loader never runs long at a worse setting."""
    true = Stages(cores=16, per_core=500, gil_rate=900, consumer=20000)
    tuner = tuner_for(16)
    tuner.observe(measured(true, tuner.settings))
    [undone, *_] = tuner.observe(replace(measured(true, tuner.settings), served=100, images=100))
    assert undone.action == "undo" and tuner.settings == loader_start(16)


@pytest.mark.parametrize("part", [1 * MIB, 16 * MIB])
def test_part_sizes_stay_within_their_bounds(part):
    store = Source(first_byte_s=0.2, stream_bytes_per_s=50e6)  # a slow first byte: larger parts pay
    true = Stages(cores=16, per_core=500, storage=store, remote=True, image_bytes=100e3, consumer=20000)
    tuner = tuner_for(16, remote=True, part_bytes=(part, part))
    run(tuner, true, 12)
    assert tuner.settings.part_bytes == part


def test_worker_processes_get_no_batch_more_ahead():
    """Their ring of prefetch + 2 shared batches is made when they start: a batch more would restart them."""
    tuner = tuner_for(8, Settings(threads=2, processes=4), threads=(2, 2), processes=(4, 4))
    window = Window(1.0, 1000, 1000, 0.3, busy_s=1.6, cpu_s=1.0, process_cpu_s=1.0)  # 8 threads busy 20%
    assert [d.action for d in tuner.observe(window)] == ["settle"] and tuner.settings.prefetch == 2


def test_a_window_that_read_from_an_object_store_does_not_count_on_sharing_by_thread():
    """The same busy cores, once with an object store's requests in the window: the store's own
    processes may be the others, and the rate moves with the reads, so no more threads are
    predicted from it; without requests, the others' threads are estimated as the kernel shares."""
    busy = Window(1.0, 1500, 1500, 0.99, busy_s=3.0, cpu_s=1.5, process_cpu_s=1.5, other_cores=0.5)
    local, _ = estimate(busy, Settings(threads=3), Known(2))
    remote, _ = estimate(replace(busy, read_bytes=150e6, read_s=8.0, requests=80), Settings(threads=3),
                         Known(2, remote=True))
    assert local.other_demand == pytest.approx(1.0) and remote.other_demand is None
    assert predict(local, Settings(threads=6)).rate > 1.05 * predict(local, Settings(threads=3)).rate
    assert predict(remote, Settings(threads=6)).rate == predict(remote, Settings(threads=3)).rate
