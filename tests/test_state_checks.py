"""What a state may be loaded into, and what values it may hold (stoker/state.py): a reader's state
records the order it was saved in and is refused by a reader built with another; every field of
every part's state is checked at load; each part's state says which part wrote it. Also the
Stateful protocol (isinstance) and stoker.watch in a module of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data

import stoker
from stoker import augment as A
from stoker.errors import OptionError
from stoker.state import POSITION_VERSION, STATE_VERSION, EpochAware, StateError, Stateful, StateWarning

BATCH = 8
CROP = stoker.CropSpec(size=(24, 32))


def loader(dataset: stoker.ShardDataset, **options) -> stoker.Loader:
    """A Loader of seed 0 unless ``options`` say (loaders of the same seed read the same order)."""
    return stoker.Loader(dataset, BATCH, crop=CROP, threads=2, **{"seed": 0, **options})


def rest_after(reader: stoker.Loader, batches: int) -> dict:
    """``reader``'s state after the loop consumed ``batches`` batches of the current epoch."""
    for n, _ in enumerate(reader, 1):
        if n == batches:
            break
    return reader.state_dict()


# ---- item 3: a state resumes only into the order it was saved in ----


@pytest.mark.parametrize(("saved", "loading", "field", "values"), [
    ({}, {"order": "random"}, "order", ("'quasi_random'", "'random'")),
    ({}, {"order": "sequential"}, "order", ("'quasi_random'", "'sequential'")),
    ({"order": "random"}, {"order": "quasi_random"}, "order", ("'random'", "'quasi_random'")),
    ({}, {"window": 4}, "window", ("16", "4")),
    ({"drop_last": True}, {}, "drop_last", ("True", "False")),
])
def test_a_loader_refuses_a_state_saved_in_another_order(packed, saved, loading, field, values):
    dataset = stoker.ShardDataset(packed)
    state = rest_after(loader(dataset, seed=2, **saved), 3)
    other = loader(dataset, seed=2, **loading)
    with pytest.raises(StateError, match=f"another {field}") as refused:
        other.load_state_dict(state)
    assert all(value in str(refused.value) for value in values), str(refused.value)
    assert other.epoch == 0 and other.indices().tolist() == loader(dataset, seed=2, **loading).indices().tolist()


def test_a_loader_refuses_a_state_saved_with_other_blocks(packed):
    state = rest_after(loader(stoker.ShardDataset(packed)), 3)
    other = loader(stoker.ShardDataset(packed, block_bytes=128 << 10))
    with pytest.raises(StateError, match="another block layout .*block_bytes") as refused:
        other.load_state_dict(state)
    assert state["blocks"] in str(refused.value) and other.state_dict()["blocks"] in str(refused.value)


def test_a_partial_node_cache_makes_whole_shards_the_blocks_and_is_refused(packed, tmp_path):
    dataset = stoker.ShardDataset(packed, block_bytes=64 << 10)  # several blocks per shard
    state = rest_after(loader(dataset, window=2), 3)
    largest = max(entry.bytes for entry in dataset.shards.manifest.shards)
    cached = stoker.ShardDataset(packed, block_bytes=64 << 10, cache_dir=tmp_path / "cache", cache_limit=4 * largest)
    with pytest.raises(StateError, match="another block layout .*cache_limit"):
        loader(cached, window=2).load_state_dict(state)
    # a cache that holds all of it: the same blocks, the same order
    whole = stoker.ShardDataset(packed, block_bytes=64 << 10, cache_dir=tmp_path / "whole")
    resumed = loader(whole, window=2)
    resumed.load_state_dict(state)
    assert resumed.indices(0).tolist() == loader(dataset, window=2).indices(0).tolist()


def test_settings_that_do_not_change_the_order_are_not_refused(packed):
    dataset = stoker.ShardDataset(packed)
    for order in ("random", "sequential"):  # window and blocks decide only the quasi-random order
        saved = loader(dataset, order=order, window=16, seed=4)
        state = rest_after(saved, 2)
        assert state["window"] is None and state["blocks"] is None
        resumed = stoker.Loader(stoker.ShardDataset(packed, block_bytes=64 << 10), BATCH, crop=CROP, order=order,
                                window=2, seed=4, threads=1, prefetch=1)
        resumed.load_state_dict(state)
        reference = [(images.clone(), labels.clone()) for images, labels in loader(dataset, order=order, seed=4)]
        rest = [(images.clone(), labels.clone()) for images, labels in resumed]
        assert len(rest) == len(reference) - 2
        assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(rest, reference[2:]))


def test_a_sampler_refuses_a_state_saved_in_another_order(packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    state = stoker.QuasiRandomSampler(dataset, seed=1).state_dict(samples_done=24)
    cases = {"order": (stoker.QuasiRandomSampler(dataset, seed=1, shuffle=False), "'quasi_random'", "'sequential'"),
             "window": (stoker.QuasiRandomSampler(dataset, seed=1, window=3), "16", "3"),
             "drop_last": (stoker.QuasiRandomSampler(dataset, seed=1, drop_last=True), "False", "True"),
             "block layout": (stoker.QuasiRandomSampler(stoker.ShardDataset(packed, decode="raw", block_bytes=64 << 10),
                                                        seed=1), state["blocks"], "")}
    for what, (sampler, saved, now) in cases.items():
        with pytest.raises(StateError, match=f"another {what}") as refused:
            sampler.load_state_dict(state)
        assert saved in str(refused.value) and now in str(refused.value)
        assert sampler.epoch == 0 and len(sampler) == len(list(sampler))
    sequential = stoker.QuasiRandomSampler(dataset, shuffle=False).state_dict(samples_done=24)
    with pytest.raises(StateError, match="another order .*shuffle=True"):
        stoker.QuasiRandomSampler(dataset).load_state_dict(sequential)


def test_another_seed_is_taken_from_the_state_with_a_warning(packed):
    dataset = stoker.ShardDataset(packed)
    saved = loader(dataset, seed=7)
    state = rest_after(saved, 2)
    resumed = loader(dataset, seed=99)
    with pytest.warns(StateWarning, match=r"seed=99 .*seed=7.*takes seed 7"):
        resumed.load_state_dict(state)
    assert resumed.seed == 7 and resumed.indices(0).tolist() == saved.indices(0).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same seed: no warning
        loader(dataset, seed=7).load_state_dict(state)
    sampler = stoker.QuasiRandomSampler(dataset, seed=3)
    with pytest.warns(StateWarning, match=r"seed=3 .*seed=5"):
        sampler.load_state_dict(stoker.QuasiRandomSampler(dataset, seed=5).state_dict(samples_done=16))
    assert sampler.seed == 5


def test_a_version_1_position_is_refused_with_how_to_restart_its_epoch(packed):
    dataset = stoker.ShardDataset(packed)
    version_1 = {"stoker_state": 1, "reader": "Loader", "dataset": dataset.shards.manifest.digest(), "seed": 0,
                 "epoch": 3, "world_size": 1, "rank": 0, "batch_size": BATCH, "samples_done": 16}
    with pytest.raises(StateError, match=r"version 1 record, which did not record the order.*set_epoch\(3\)"):
        loader(dataset).load_state_dict(version_1)
    with pytest.raises(StateError, match="version 1"):
        stoker.QuasiRandomSampler(dataset).load_state_dict({**version_1, "reader": "QuasiRandomSampler", "batch_size": None})


# ---- item 4: every field of every part's state is checked at load ----

NOT_COUNTS = ["3", None, -1, 1.0, True, 2**70]


def position_cases() -> list[tuple[str, object]]:
    cases = [(field, value) for field in ("seed", "epoch", "samples_done") for value in NOT_COUNTS]
    cases += [("world_size", value) for value in (0, "1", True, 1.0, None, 2**40)]
    cases += [("rank", value) for value in (-1, 1, "0", None, False)]  # 1: outside a world of 1
    cases += [("batch_size", value) for value in (0, "8", 8.0, None, True)]
    cases += [("order", value) for value in ("shuffled", None, 1)]
    cases += [("window", value) for value in (0, "16", None, 16.0)]
    cases += [("blocks", value) for value in (None, 5)]
    cases += [("drop_last", value) for value in (0, "no", None)]
    cases += [("dataset", value) for value in (None, 5, "")]
    cases += [("mix", value) for value in (5, "")]
    cases += [("consumed", value) for value in ("3", 5)]
    return cases


@pytest.mark.parametrize(("field", "value"), position_cases())
def test_a_loader_state_with_a_bad_value_is_refused_naming_it(packed, field, value):
    dataset = stoker.ShardDataset(packed)
    state = loader(dataset, seed=2).state_dict()
    target = loader(dataset, seed=2)
    with pytest.raises(StateError) as refused:
        target.load_state_dict({**state, field: value})
    message = str(refused.value)
    assert f"{field}={value!r}" in message or (field in ("window", "blocks") and "window=" in message), message
    assert target.seed == 2 and target.epoch == 0  # nothing was taken from it


def test_a_huge_seed_no_longer_changes_the_order_silently(packed):
    dataset = stoker.ShardDataset(packed)
    state = loader(dataset).state_dict()
    with pytest.raises(StateError, match=r"seed=1180591620717411303424 must be an integer from 0 to 2\*\*63 - 1"):
        loader(dataset).load_state_dict({**state, "seed": 2**70})


@pytest.mark.parametrize(("field", "value"), [("samples_done", -8), ("samples_done", "16"), ("epoch", 2.5),
                                              ("batch_size", None), ("rank", 2), ("seed", None)])
def test_a_sampler_state_with_a_bad_value_is_refused_naming_it(packed, field, value):
    dataset = stoker.ShardDataset(packed, decode="raw")
    state = stoker.QuasiRandomSampler(dataset, num_replicas=2, seed=0, rank=0).state_dict(samples_done=8)
    with pytest.raises(StateError, match=f"{field}={value!r}".replace("(", r"\(").replace(")", r"\)")):
        stoker.QuasiRandomSampler(dataset, num_replicas=2, seed=0, rank=1).load_state_dict({**state, field: value})


@pytest.mark.parametrize("state", [None, [1, 2], "state", {"epoch": 1}, {"stoker_state": 3, "part": "Loader"},
                                   {"stoker_state": "2", "part": "Loader"}])
def test_what_is_not_a_state_record_is_refused_by_every_part(packed, state):
    dataset = stoker.ShardDataset(packed)
    parts = [loader(dataset), stoker.QuasiRandomSampler(dataset), stoker.echo(loader(dataset)),
             stoker.watch(loader(dataset)), A.Augment(A.HorizontalFlip(), seed=1, device="cpu")]
    for part in parts:
        with pytest.raises(StateError, match="cannot load"):
            part.load_state_dict(state)


def wrappers(packed):
    dataset = stoker.ShardDataset(packed)
    return {"Loader": loader(dataset), "QuasiRandomSampler": stoker.QuasiRandomSampler(dataset),
            "Echo": stoker.echo(loader(dataset)), "Watched": stoker.watch(loader(dataset)),
            "Augment": A.Augment(A.HorizontalFlip(), seed=1, device="cpu")}


NAMES = {"Loader": "a stoker.Loader", "QuasiRandomSampler": "a stoker.QuasiRandomSampler", "Echo": "stoker.echo",
         "Watched": "stoker.watch", "Augment": "a stoker.augment.Augment"}


def test_each_part_refuses_another_parts_state_saying_who_wrote_it(packed):
    parts = wrappers(packed)
    states = {name: part.state_dict(16) if name == "QuasiRandomSampler" else part.state_dict() for name, part in parts.items()}
    for name, state in states.items():
        version = POSITION_VERSION if name in ("Loader", "QuasiRandomSampler") else STATE_VERSION
        assert state["stoker_state"] == version and state["part"] == name
    for loading, part in parts.items():
        for wrote, state in states.items():
            if wrote == loading:
                continue
            with pytest.raises(StateError) as refused:
                part.load_state_dict(state)
            message = str(refused.value)
            assert f"written by {NAMES[wrote]} (part {wrote!r})" in message and f"by {NAMES[loading]}" in message, message
            assert "earlier versions" not in message


def test_echo_refuses_garbled_counts_times_and_generator_state(packed):
    echoed = stoker.echo(loader(stoker.ShardDataset(packed)))
    state = echoed.state_dict()
    bad = {"counts": ([-5, 0, 0, 0], "counts[0]=-5"), "wait_s": (-1.0, "wait_s=-1.0"), "step_s": ("1", "step_s='1'"),
           "rng": ({"bit_generator": "MT19937"}, "rng=")}
    for field, (value, named) in bad.items():
        with pytest.raises(StateError, match=named.replace("[", r"\[")):
            echoed.load_state_dict({**state, field: value})
    with pytest.raises(StateError, match="must be 4 counts"):
        echoed.load_state_dict({**state, "counts": [1, 2]})
    # a refused state changes nothing: not the counts, not the wrapped loader's position
    moved = {**state, "counts": [-5, 0, 0, 0], "loader": {**state["loader"], "samples_done": BATCH, "epoch": 1}}
    with pytest.raises(StateError):
        echoed.load_state_dict(moved)
    assert echoed.stats().fresh_batches == 0 and echoed.loader.epoch == 0


def test_watch_refuses_garbled_totals_and_recomputes_the_derived_ones(packed):
    watched = stoker.watch(loader(stoker.ShardDataset(packed)), log=lambda line: None)
    state = watched.state_dict()
    for name, value in (("steps", -5), ("stalls", 1.5), ("wait_s", "x"), ("max_wait_s", None)):
        with pytest.raises(StateError, match=f"totals.{name}={value!r}"):
            watched.load_state_dict({**state, "totals": {**state["totals"], name: value}})
    with pytest.raises(StateError, match="totals=.*must hold"):
        watched.load_state_dict({**state, "totals": {"steps": 3}})
    totals = {**state["totals"], "steps": 10, "wait_s": 1.0, "step_s": 3.0, "data_wait_fraction": 7.0}
    watched.load_state_dict({**state, "totals": totals})
    assert watched.summary().data_wait_fraction == 0.25 and watched.summary().steps == 10


def test_augment_refuses_bad_values_and_takes_its_previous_format():
    augment = A.Augment(A.Rotate(20), seed=5, device="cpu")
    state = augment.state_dict()
    for field, value in (("calls", -5), ("calls", "3"), ("epoch", True), ("seed", 2**70), ("seed", -1), ("epoch", None)):
        with pytest.raises(StateError, match=f"{field}={value!r}"):
            augment.load_state_dict({**state, field: value})
    assert augment.state_dict() == state
    images = torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.uint8)
    reference = A.Augment(A.Rotate(20), seed=5, device="cpu")
    reference.set_epoch(1)
    for _ in range(3):
        reference(images)
    resumed = A.Augment(A.Rotate(20), seed=5, device="cpu")
    resumed.load_state_dict({"seed": 5, "epoch": 1, "calls": 3})  # saved by the previous format: safe to take
    assert torch.equal(resumed(images), reference(images))
    with pytest.raises(StateError, match="not a stoker state record"):
        resumed.load_state_dict({"seed": 5, "epoch": 1})
    unseeded = A.Augment(A.Rotate(20), device="cpu")
    unseeded.load_state_dict(unseeded.state_dict())  # seed=None: fresh randomness, a valid state
    assert unseeded.seed is None


def test_a_loader_given_an_echo_state_says_so(packed):
    dataset = stoker.ShardDataset(packed)
    echo_state = stoker.echo(loader(dataset)).state_dict()
    with pytest.raises(StateError, match=r"a stoker.Loader cannot load a state written by stoker.echo"):
        loader(dataset).load_state_dict(echo_state)
    json.dumps(echo_state)  # records stay plain values
    untagged = {key: value for key, value in echo_state.items() if key not in ("stoker_state", "part")}
    with pytest.raises(StateError, match=r"not a stoker state record .*keys \['counts', 'loader', 'rng'") as refused:
        loader(dataset).load_state_dict(untagged)  # an echo state of the previous format
    assert "earlier versions" not in str(refused.value)
    newer = POSITION_VERSION + 1
    with pytest.raises(StateError, match=f"record version {newer} is not the one this stoker reads .*a newer stoker"):
        loader(dataset).load_state_dict({**loader(dataset).state_dict(), "stoker_state": newer})
    with pytest.raises(StateError, match="written by a record that does not say"):
        loader(dataset).load_state_dict({key: value for key, value in loader(dataset).state_dict().items() if key != "part"})


# ---- Stateful is a runtime-checkable protocol; set_epoch reaches a DataLoader's sampler ----


def test_stateful_is_checked_with_isinstance(packed):
    parts = wrappers(packed)
    assert all(isinstance(part, Stateful) for part in parts.values())
    plain = torch.utils.data.DataLoader(range(10), batch_size=2)
    assert not isinstance(plain, Stateful) and not isinstance(plain, EpochAware)
    distributed = torch.utils.data.DistributedSampler(range(10), num_replicas=1, rank=0)
    assert isinstance(distributed, EpochAware) and not isinstance(distributed, Stateful)
    watched = stoker.watch(torch.utils.data.DataLoader(range(10), batch_size=2, sampler=distributed))
    watched.set_epoch(3)  # passed to the DataLoader's sampler, which has set_epoch but no state
    assert distributed.epoch == 3
    with pytest.raises(TypeError, match="no state to save"):
        watched.state_dict()


# ---- stoker.watch in a module of its own ----


def test_watching_a_dataloader_imports_neither_the_doctor_nor_the_decoder():
    script = """
import sys
import torch.utils.data
import stoker
watched = stoker.watch(torch.utils.data.DataLoader(list(range(10)), batch_size=2), every=2, log=lambda line: None)
assert [int(b.sum()) for b in watched] == [1, 5, 9, 13, 17]
print(sorted(m for m in ("stoker.doctor", "stoker.loader", "stoker.decode.per_image", "cv2") if m in sys.modules))
import stoker.watch
from stoker.doctor import watch
from stoker.watch import Watched, WatchSummary
assert stoker.watch is watch and isinstance(watched, Watched) and watched.summary().steps == 5
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "[]"


def test_a_rank_state_from_the_sampler_is_the_shares_position(packed):
    """A rank's state is checked against its own world, not its own rank: rank 0's serves rank 1."""
    dataset = stoker.ShardDataset(packed, decode="raw")
    state = stoker.QuasiRandomSampler(dataset, num_replicas=2, seed=0, rank=0).state_dict(samples_done=8)
    other = stoker.QuasiRandomSampler(dataset, num_replicas=2, seed=0, rank=1)
    other.load_state_dict(state)
    assert list(other) == stoker.QuasiRandomSampler(dataset, num_replicas=2, seed=0, rank=1).order()[8:].tolist()
    assert np.array_equal(other.order(), stoker.QuasiRandomSampler(dataset, num_replicas=2, seed=0, rank=1).order())


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, 1.5, "3", True])
def test_readers_and_augment_refuse_a_seed_their_states_could_not_hold(packed, seed):
    """A seed outside 0..2**63-1 was taken at construction and then refused when its own state came back.
    (None is no seed: the readers draw one, Augment uses fresh randomness.)"""
    with pytest.raises(OptionError, match="seed="):
        stoker.Loader(stoker.ShardDataset(packed), 8, seed=seed)
    with pytest.raises(OptionError, match="seed="):
        stoker.QuasiRandomSampler(stoker.ShardDataset(packed), seed=seed)
    with pytest.raises(OptionError, match="seed="):
        A.Augment(A.ColorJitter(0.1), seed=seed)
