"""The DataLoader's contract, kept by stoker's readers (issue 39, items 1, 2, 4 and 6): every iter() is a
whole pass over the current epoch unless a state was loaded since the last pass began; a pass handed out
whole advances the epoch, one left early does not; seeds follow torch's generator as RandomSampler's do;
a --resume script starts at its epoch; the attributes scripts read of a DataLoader are there. For the
Loader, QuasiRandomSampler under a DataLoader, a Mix, video clips and stoker.echo.

``numbered`` holds 48 samples, each its own class: a batch's labels say which samples it holds."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
import torch
import torch.utils.data

import stoker
from stoker.errors import OptionError
from stoker.state import StateError
from tests.conftest import NUMBERED

BATCH = 5  # 10 batches an epoch, the last of 3
CROP = stoker.CropSpec(size=(16, 16))


def loader(data, **options) -> stoker.Loader:
    return stoker.Loader(stoker.ShardDataset(data), BATCH, crop=CROP, threads=1, **options)


def passes(reader, count: int = 1) -> list[list[int]]:
    """The labels of ``count`` whole passes of ``reader``, one list each."""
    return [[label for _, labels in reader for label in labels.tolist()] for _ in range(count)]


def test_a_peek_then_a_loop_gives_the_whole_epoch(numbered):
    epochs = passes(loader(numbered, seed=1), 2)
    peeked = loader(numbered, seed=1)
    _, first = next(iter(peeked))
    assert len(peeked) == 10 and first.tolist() == epochs[0][:BATCH]
    assert passes(peeked, 2) == epochs, "the loop after the peek is the whole epoch 0, then epoch 1"
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(NUMBERED)) and epochs[0] != epochs[1]


def test_a_pass_left_early_restarts_its_epoch_and_keeps_its_state(numbered):
    epochs = passes(loader(numbered, seed=2), 2)
    left = loader(numbered, seed=2)
    for n, _ in enumerate(left, 1):
        if n == 4:
            break
    state = left.state_dict()
    assert (state["epoch"], state["samples_done"]) == (0, 4 * BATCH), "the state says where the loop stopped"
    assert len(left) == 10 and passes(left, 2) == epochs
    resumed = loader(numbered, seed=2)
    resumed.load_state_dict(state)
    assert len(resumed) == 10, "a whole pass's batches, as a trainer that counts its own steps needs"
    assert passes(resumed, 2) == [epochs[0][4 * BATCH :], epochs[1]], "the rest, then the next epoch whole"


def test_a_loop_stopped_at_len_gets_the_next_epoch_and_a_loaded_state_survives_set_epoch(numbered):
    epochs = passes(loader(numbered, seed=3), 3)
    counted = loader(numbered, seed=3)  # Lightning's way: stop after len() batches, never ask past them
    for _ in range(3):
        it = iter(counted)
        seen = [label for _ in range(len(counted)) for label in next(it)[1].tolist()]
        assert seen == epochs[_]
    state = counted.state_dict()
    resumed = loader(numbered, seed=3)
    resumed.load_state_dict({**state, "epoch": 1, "samples_done": 15})
    it = iter(resumed)
    resumed.set_epoch(1)  # Lightning: iter() first, then set_epoch of the epoch it resumes
    assert [label for _, labels in it for label in labels.tolist()] == epochs[1][15:]


def test_a_sampler_under_a_dataloader_keeps_the_contract(numbered):
    dataset = stoker.ShardDataset(numbered, decode="raw")
    reference = stoker.QuasiRandomSampler(dataset, seed=4)
    orders = [reference.order().tolist()]
    reference.set_epoch(1)
    orders.append(reference.order().tolist())
    sampler = stoker.QuasiRandomSampler(dataset, seed=4)
    batches = torch.utils.data.DataLoader(range(NUMBERED), batch_size=BATCH, sampler=sampler, num_workers=2)
    assert next(iter(batches)).tolist() == orders[0][:BATCH]
    whole = [[i for batch in batches for i in batch.tolist()] for _ in range(2)]
    assert whole == orders, "the peek's epoch whole, then a fresh order without set_epoch (as shuffle=True)"
    sampler.set_epoch(0)
    assert list(sampler) == orders[0] and len(sampler) == NUMBERED


def test_a_mix_keeps_the_contract(numbered):
    def mix_loader() -> stoker.Loader:
        sources = {name: stoker.ShardDataset(numbered) for name in ("a", "b")}
        return stoker.Loader(stoker.Mix(sources, {"a": 2, "b": 1}), BATCH, crop=CROP, threads=1, seed=5)

    epoch = passes(mix_loader())[0]
    peeked = mix_loader()
    next(iter(peeked))
    assert passes(peeked) == [epoch] and len(epoch) == 2 * NUMBERED


def test_video_clips_keep_the_contract(packed_videos):
    mode, dst, _ = packed_videos
    def clip_loader() -> stoker.Loader:
        clips = stoker.VideoClipDataset(dst, clip_len=2)
        return stoker.Loader(clips, 2, crop=stoker.CropSpec("resize", size=(8, 8)), threads=1, seed=6)

    whole = [clips.clone() for clips, _ in clip_loader()]
    peeked = clip_loader()
    next(iter(peeked))
    again = [clips for clips, _ in peeked]
    assert len(again) == len(whole) and all(torch.equal(a, b) for a, b in zip(again, whole))


def test_echo_restarts_a_pass_left_early_and_keeps_what_the_loop_was_served(numbered):
    epoch = passes(loader(numbered, seed=7))[0]
    echoed = stoker.echo(loader(numbered, seed=7), factor=1)  # every example served once: no echoes
    it = iter(echoed)
    served = [next(it)[1].tolist() for _ in range(2)]
    del it  # the loop leaves early; the upstream thread had read ahead
    assert served == [epoch[:BATCH], epoch[BATCH : 2 * BATCH]]
    assert echoed.state_dict()["loader"]["samples_done"] == 2 * BATCH
    assert passes(echoed) == [epoch]


def test_echo_restarts_a_pass_its_upstream_read_to_the_end_ahead_of_the_loop(numbered):
    """Three batches an epoch: the upstream thread reads the loader's whole pass while the loop has
    one batch; the loop leaving then is still a pass left early."""
    epochs = passes(stoker.Loader(stoker.ShardDataset(numbered), 16, crop=CROP, threads=1, seed=8), 2)
    inner = stoker.Loader(stoker.ShardDataset(numbered), 16, crop=CROP, threads=1, seed=8)
    echoed = stoker.echo(inner, factor=1, prefetch=4)
    it = iter(echoed)
    assert next(it)[1].tolist() == epochs[0][:16]
    deadline = time.monotonic() + 120
    while inner.epoch == 0 and time.monotonic() < deadline:  # the upstream reads the pass to its end
        time.sleep(0.01)
    assert inner.epoch == 1
    del it
    assert passes(echoed, 2) == epochs


def test_set_epoch_while_a_pass_runs_names_the_next_pass(numbered):
    """A pass that is running when set_epoch(k) is called moves the loader no more: the next pass is
    epoch k from its start, and a state taken in between says so."""
    reference = loader(numbered, seed=9)
    epochs = passes(reference, 3)
    for reader in (loader(numbered, seed=9), stoker.QuasiRandomSampler(stoker.ShardDataset(numbered), seed=9,
                                                                      batch_size=BATCH)):
        it = iter(reader)
        for _ in range(4):
            next(it)
        reader.set_epoch(1)
        if isinstance(reader, stoker.Loader):
            assert (reader.state_dict()["epoch"], reader.state_dict()["samples_done"]) == (1, 0)
        for _ in it:  # the running pass goes on to its end
            pass
        assert reader.epoch == 1
    named = loader(numbered, seed=9)
    it = iter(named)
    next(it)
    named.set_epoch(1)
    list(it)
    assert passes(named) == [epochs[1]]


# ---- seeds and epochs (39.2) ----


def test_an_unseeded_loader_draws_its_seed_from_torch_as_random_sampler_does(numbered):
    one, two = loader(numbered), loader(numbered)
    assert one.seed != two.seed and passes(one) != passes(two), "a new run does not replay another's order"
    torch.manual_seed(11)
    seeded = loader(numbered)
    torch.manual_seed(11)
    again = loader(numbered)
    assert seeded.seed == again.seed and passes(seeded) == passes(again)
    torch.manual_seed(11)
    assert loader(numbered, seed=3).seed == 3, "an explicit seed wins"
    assert f"epoch 1 from its start (10 batches here), quasi_random order, seed {seeded.seed}: drawn from " \
           "torch's global generator" in seeded.explain()
    torch.manual_seed(12)
    samplers = [stoker.QuasiRandomSampler(stoker.ShardDataset(numbered)) for _ in range(2)]
    assert samplers[0].seed != samplers[1].seed
    state = seeded.state_dict()
    fresh = loader(numbered)
    fresh.load_state_dict(state)  # a drawn seed gives way to the state's without a warning
    assert fresh.seed == seeded.seed and "taken from the loaded state" in fresh.explain()


def test_a_resumed_script_starts_at_the_epoch_it_names(numbered):
    epochs = passes(loader(numbered, seed=8), 3)
    started = loader(numbered, seed=8, start_epoch=2)  # imagenet/main.py --resume: args.start_epoch
    assert started.epoch == 2 and "next pass: epoch 2 from its start" in started.explain()
    assert passes(started) == [epochs[2]]
    named = loader(numbered, seed=8)
    named.sampler.set_epoch(1)
    assert passes(named) == [epochs[1]]
    with pytest.raises(OptionError, match=r"epoch=-1: must be an integer from 0 to 2147483647"):
        named.set_epoch(-1)


def test_without_a_process_group_ranks_must_be_given_a_seed(numbered, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's environment, no init_process_group yet
    with pytest.raises(OptionError, match=r"seed=None on rank 1 of 2 without a torch.distributed process group"):
        loader(numbered)
    with pytest.raises(OptionError, match="pass seed="):
        stoker.QuasiRandomSampler(stoker.ShardDataset(numbered))
    assert loader(numbered, seed=4).rank == 1


# ---- the attributes scripts read (39.4, 39.6) ----


def _set_loader_epoch(loader, epoch: int) -> None:
    """timm's train.py, as it is."""
    if hasattr(loader.dataset, 'set_epoch'):
        loader.dataset.set_epoch(epoch)
    if hasattr(loader.batch_sampler, 'set_epoch'):
        loader.batch_sampler.set_epoch(epoch)
    elif hasattr(loader.sampler, 'set_epoch'):
        loader.sampler.set_epoch(epoch)


def test_timm_and_lightning_set_the_epoch_through_the_dataloader_attributes(numbered):
    epochs = passes(loader(numbered, seed=9), 3)
    timm_loader = loader(numbered, seed=9)
    _set_loader_epoch(timm_loader, 2)
    assert passes(timm_loader) == [epochs[2]]
    lightning = pytest.importorskip("lightning.fabric.utilities.data")
    lit_loader = loader(numbered, seed=9)
    lightning._set_sampler_epoch(lit_loader, 1)
    assert passes(lit_loader) == [epochs[1]]
    assert list(lit_loader.batch_sampler.sampler) == list(lit_loader.sampler)
    assert (lit_loader.batch_size, lit_loader.batch_sampler.batch_size, lit_loader.drop_last) == (BATCH, BATCH, False)
    order = lit_loader.indices().tolist()  # epoch 2: the whole pass of epoch 1 advanced it
    assert list(lit_loader.sampler) == order and len(lit_loader.sampler) == NUMBERED
    assert list(lit_loader.batch_sampler) == [order[i : i + BATCH] for i in range(0, NUMBERED, BATCH)]
    assert len(lit_loader.batch_sampler) == len(lit_loader) == 10


def test_a_loader_let_go_of_is_freed_at_once(numbered):
    """No reference cycle through its attributes: a Loader dropped frees its buffers and worker processes
    then, not when the garbage collector next runs."""
    gc.disable()
    try:
        dropped = loader(numbered, seed=0, processes=1)
        passes(dropped)
        _set_loader_epoch(dropped, 1)
        freed = weakref.ref(dropped)
        del dropped
        assert freed() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("drop_last", [False, True])
def test_imagenet_validate_finds_what_drop_last_left_out(numbered, drop_last):
    """imagenet/main.py's validate() under DDP: the samples past len(sampler) * world_size go to an aux loader."""
    ranks = [loader(numbered, seed=0, rank=r, world_size=2, drop_last=drop_last, order="sequential") for r in (0, 1)]
    delivered = sorted(label for rank in ranks for labels in passes(rank) for label in labels)
    val_loader = ranks[0]
    aux = range(len(val_loader.sampler) * 2, len(val_loader.dataset))
    needs_aux = len(val_loader.sampler) * 2 < len(val_loader.dataset)
    assert needs_aux == drop_last and sorted(delivered + list(aux)) == list(range(NUMBERED))


# ---- what is out of range or cannot be read (40.8, 40's unclear rows, 39.5) ----


@pytest.mark.parametrize("processes", [0, 2])
def test_batch_buffers_larger_than_memory_are_refused_saying_what_to_lower(packed, processes):
    huge = stoker.Loader(stoker.ShardDataset(packed), 96, crop=stoker.CropSpec(size=(30000, 30000)), seed=0,
                         threads=1, processes=processes)
    with pytest.raises(OptionError, match=r"batch buffers, \d batches .* of 96 samples x 2,700,000,000 bytes .*GiB.*: "
                                          r"lower batch_size, the crop size or prefetch"):
        next(iter(huge))


def test_a_batch_larger_than_the_data_set_is_one_batch_of_it(numbered):
    assert [len(labels) for _, labels in stoker.Loader(stoker.ShardDataset(numbered), 10**7, crop=CROP, seed=0,
                                                       threads=1)] == [NUMBERED]


def test_a_sampler_state_past_its_pass_is_refused(numbered):
    sampler = stoker.QuasiRandomSampler(stoker.ShardDataset(numbered), batch_size=BATCH, seed=0)
    assert sampler.state_dict(samples_done=50)["samples_done"] == NUMBERED  # 10 steps of 5: the last one short
    with pytest.raises(StateError, match=r"samples_done=53 is past the end of this rank's pass of 48 samples"):
        sampler.state_dict(samples_done=53)
    with pytest.raises(OptionError, match="samples_done=-5: must be an integer >= 0"):
        sampler.state_dict(samples_done=-5)


class _Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 4, 4), i


def _not_readable(kind: str) -> object:
    """Something a training script holds that the Loader does not read itself."""
    if kind == "pandas.DataFrame":
        return pytest.importorskip("pandas").DataFrame({"image": ["a.jpg"], "label": [0]})
    return {"torch.utils.data.dataloader.DataLoader": lambda: torch.utils.data.DataLoader(_Items()),
            "tests.test_loader_contract._Items": _Items, "a list": lambda: [1, 2]}[kind]()


@pytest.mark.parametrize("named", ["torch.utils.data.dataloader.DataLoader", "tests.test_loader_contract._Items",
                                   "pandas.DataFrame", "a list"])
def test_the_loader_refuses_what_it_cannot_read_in_one_line(named):
    with pytest.raises(OptionError) as refused:
        stoker.Loader(_not_readable(named), 8)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message and named in message
    assert message.startswith("stoker.Loader reads a stoker.ShardDataset, a stoker.Mix or a stoker.VideoClipDataset")
    assert "stoker.loader_for(" in message


def test_the_loader_refuses_a_hugging_face_dataset_and_a_path_saying_what_to_use(tmp_path):
    datasets = pytest.importorskip("datasets")
    with pytest.raises(OptionError, match=r"got a datasets.arrow_dataset.Dataset: stoker.loader_for\(it, "):
        stoker.Loader(datasets.Dataset.from_dict({"label": [0, 1]}), 8)
    with pytest.raises(OptionError, match=rf"got a str: stoker.Loader\(stoker.ShardDataset\('{tmp_path}'\), ...\)"):
        stoker.Loader(str(tmp_path), 8)  # type: ignore[arg-type]


@pytest.mark.torchvision
def test_the_loader_refuses_torchvision_fake_data():
    datasets = pytest.importorskip("torchvision.datasets")
    with pytest.raises(OptionError, match=r"got a torchvision.datasets.fakedata.FakeData: stoker.loader_for\(it"):
        stoker.Loader(datasets.FakeData(size=4), 8)
