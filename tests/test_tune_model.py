"""The pipeline model on given figures: each stage's rate, the bottleneck, and what the tuner
would choose (stoker/tune/model.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from stoker.tune.model import Source, Stages, choose, loader_choice, other_demand, predict
from stoker.tune.settings import MIB, Bounds, Settings, loader_start

STORE = Source(first_byte_s=0.02, stream_bytes_per_s=50e6)  # one request: 2 MiB in 62 ms, ~34 MB/s


def test_the_cores_limit_a_warm_native_loader():
    made = predict(Stages(cores=4, per_core=500), Settings(threads=5))
    assert made.rate == made.fresh == 2000 and made.bottleneck == "cpu"
    assert made.rates["storage"] == made.rates["gil"] == made.rates["consumer"] == math.inf


def test_a_slower_training_loop_is_no_bottleneck_of_the_input():
    made = predict(Stages(cores=4, per_core=500, consumer=1200), Settings(threads=5))
    assert (made.rate, made.fresh, made.bottleneck) == (1200, 2000, "none")


def test_other_processes_leave_fewer_cores():
    made = predict(Stages(cores=4, per_core=500, other_cores=1.5), Settings(threads=5))
    assert made.rate == 1250 and made.bottleneck == "cpu"


def test_on_cores_shared_thread_by_thread_more_threads_get_more_of_them():
    """The kernel gives each thread ready to run its share: with another process running one thread
    on 2 cores, 3 threads of ours get 1.5 cores and 6 get 12/7; the others get no more than they ask."""
    shared = Stages(cores=2, per_core=1000, other_demand=1.0)
    assert predict(shared, Settings(threads=3)).rate == pytest.approx(1500)
    assert predict(shared, Settings(threads=6)).rate == pytest.approx(12000 / 7)
    assert predict(replace(shared, other_demand=0.2), Settings(threads=3)).rate == pytest.approx(1800)
    # What they would run, from what a window measured: 3 threads of ours used 1.5 of 2 busy cores.
    assert other_demand(2, 3, own_cores=1.5, other_cores=0.5) == pytest.approx(1.0)
    assert other_demand(4, 3, own_cores=2.0, other_cores=0.5) == 0.5  # room left: they took what they asked


def test_threads_waiting_for_reads_use_a_share_of_a_core():
    assert predict(Stages(cores=4, per_core=500, duty=0.5), Settings(threads=5)).rate == 1250
    assert predict(Stages(cores=4, per_core=500, duty=0.5), Settings(threads=8)).rate == 2000


def test_the_gil_limits_one_process_and_each_worker_process_has_its_own():
    stages = Stages(cores=16, per_core=500, gil_rate=800)
    assert predict(stages, Settings(threads=17)).bottleneck == "gil"
    assert predict(stages, Settings(threads=17)).rate == 800
    assert predict(stages, Settings(threads=2, processes=8)).rate == 6400
    assert predict(stages, Settings(threads=1, processes=16)).rate == 8000


def test_an_object_store_gives_more_with_more_reads_in_flight_up_to_its_link():
    store = Stages(cores=4, per_core=500, storage=STORE, remote=True, image_bytes=100e3)
    one = predict(store, Settings(threads=5, reads_in_flight=1))
    assert one.bottleneck == "object store" and one.rate == pytest.approx(2 * MIB / 0.0619430 / 100e3, rel=1e-3)
    assert predict(store, Settings(threads=5, reads_in_flight=4)).rate == pytest.approx(4 * one.rate)
    capped = Stages(cores=4, per_core=500, storage=Source(0.02, 50e6, link_bytes_per_s=100e6), remote=True,
                    image_bytes=100e3)
    assert predict(capped, Settings(threads=5, reads_in_flight=16)).rate == pytest.approx(1000)
    # No more reads in flight than the blocks read ahead hold: 1 block of 8 MiB is 4 parts of 2 MiB.
    assert predict(store, Settings(threads=5, readahead=1, reads_in_flight=16)).rate == pytest.approx(4 * one.rate)


def test_a_disk_gives_what_its_blocks_read_ahead_allow():
    disk = Stages(cores=4, per_core=500, storage=Source(0.01, 150e6, link_bytes_per_s=150e6), image_bytes=100e3)
    made = predict(disk, Settings(threads=5, readahead=1))
    assert made.bottleneck == "storage" and made.rate == pytest.approx(8 * MIB / (0.01 + 8 * MIB / 150e6) / 100e3)
    assert predict(disk, Settings(threads=5, readahead=16)).rate == 1500  # the disk's rate, 150 MB/s


def test_echo_serves_the_loop_what_the_input_lacks():
    made = predict(Stages(cores=2, per_core=500, consumer=2500), Settings(threads=3, echo=3))
    assert (made.rate, made.fresh, made.bottleneck) == (2500, 1000, "cpu")
    assert predict(Stages(cores=2, per_core=500, consumer=2500), Settings(threads=3, echo=2)).rate == 2000


def test_the_choice_is_the_cheapest_setting_near_the_best():
    bounds = Bounds(threads=(1, 17), processes=(0, 16))
    # Native and warm: threads, one per core (more add nothing).
    assert choose(Stages(cores=16, per_core=500), bounds, Settings(threads=17)) == Settings(threads=16)
    # The GIL: worker processes, the fewest workers that give the cores' rate.
    chosen = choose(Stages(cores=16, per_core=500, gil_rate=800), bounds, Settings(threads=17))
    assert (chosen.processes, chosen.threads) == (16, 1)
    # A loop that takes 3,000 img/s needs 6 cores' worth, no more.
    assert choose(Stages(cores=16, per_core=500, consumer=3000), bounds, Settings(threads=17)).threads == 6


def test_the_choice_keeps_what_is_fixed_and_the_memory_budget():
    fixed = Bounds(threads=(3, 3), processes=(0, 0))
    assert choose(Stages(cores=16, per_core=500), fixed, Settings(threads=3)) == Settings(threads=3)
    # Worker processes of 300 MB each within 1 GB: at most 3 of them.
    budget = Bounds(threads=(1, 17), processes=(0, 16), memory_bytes=1e9, process_bytes=300e6)
    chosen = choose(Stages(cores=16, per_core=500, gil_rate=800), budget, Settings(threads=17))
    assert chosen.processes <= 3 and budget.allows(chosen)


def test_the_choice_for_an_object_store_reads_enough_in_flight():
    stages = Stages(cores=4, per_core=500, storage=STORE, remote=True, image_bytes=100e3)
    bounds = Bounds(threads=(1, 5), readahead=(16, 16), reads_in_flight=(1, 64), part_bytes=(1 * MIB, 16 * MIB))
    chosen = choose(stages, bounds, Settings(threads=5))
    made = predict(stages, chosen)
    assert made.rate == pytest.approx(2000, rel=CLOSE) and chosen.threads == 4
    # Fewer reads of larger parts where the first byte is slow: never more in flight than needed.
    assert chosen.reads_in_flight * chosen.part_bytes <= 16 * 2 * MIB


def test_echo_is_chosen_only_where_allowed_and_no_more_than_needed():
    stages = Stages(cores=2, per_core=500, consumer=2500)
    assert choose(stages, Bounds(threads=(1, 3)), Settings(threads=3)).echo == 1
    assert choose(stages, Bounds(threads=(1, 3), echo=(1, 4)), Settings(threads=3)).echo == 3


CLOSE = 0.02


def test_what_a_default_loader_would_choose():
    """loader_choice: the doctor's question (what will the Loader's tuner pick here?)."""
    settings, made = loader_choice(Stages(cores=2, per_core=800, consumer=5000))
    assert (settings.processes, settings.threads, settings.echo) == (0, 2, 1) and made.bottleneck == "cpu"
    settings, made = loader_choice(Stages(cores=2, per_core=800, consumer=5000), echo=True)
    assert settings.echo == 4 and made.rate == 5000  # 1,600 fresh img/s served up to 4 times: more than it takes
    # Worker processes on 16 cores where the GIL limits, none where they are not allowed.
    assert loader_choice(Stages(cores=16, per_core=500, gil_rate=800))[0].processes > 1
    assert loader_choice(Stages(cores=16, per_core=500, gil_rate=800), processes=False)[0].processes == 0
    # An object store whose every request is capped: more in flight than the default 16.
    capped = Stages(cores=16, per_core=500, storage=Source(0.02, 10e6), remote=True, image_bytes=100e3)
    settings, made = loader_choice(capped)
    assert settings.reads_in_flight > 16 and made.rate > predict(capped, loader_start(16)).rate


def test_a_transform_measured_apart_adds_its_cost_per_image():
    """The doctor measures decode and transform per core apart: one image costs both on a core."""
    made = predict(Stages(cores=4, per_core=500, transform_per_core=500), Settings(threads=5))
    assert made.rate == pytest.approx(1000) and made.bottleneck == "cpu"
