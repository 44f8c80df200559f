import pytest
import torch

from capsnets.data import DeviceLoader, TensorData


def make_data(n=103):
    images = torch.arange(n, dtype=torch.float32)[:, None, None, None].expand(n, 1, 6, 6) + 1.0
    return TensorData(images.contiguous(), torch.arange(n), num_classes=n, name="toy")


def epoch(loader, e):
    loader.set_epoch(e)
    return list(loader)


def test_covers_every_example_once():
    data = make_data()
    loader = DeviceLoader(data, 10, max_shift=2)
    batches = epoch(loader, 0)
    assert len(batches) == len(loader) == 11 and loader.num_examples == 103
    labels = torch.cat([lab for _, lab in batches])
    assert sorted(labels.tolist()) == list(range(103))
    assert [len(lab) for _, lab in batches] == [10] * 10 + [3]
    for images, lab in batches:  # an image keeps its own label (values are label + 1 where not blanked)
        assert torch.equal(images.amax(dim=(1, 2, 3)), lab.float() + 1)


def test_drop_last_and_no_shuffle():
    loader = DeviceLoader(make_data(), 10, shuffle=False, drop_last=True)
    batches = epoch(loader, 5)
    assert len(loader) == len(batches) == 10
    assert torch.equal(torch.cat([lab for _, lab in batches]), torch.arange(100))


def test_same_seed_and_epoch_same_batches_different_epochs_differ():
    data = make_data()
    a = epoch(DeviceLoader(data, 16, max_shift=2, seed=1), 3)
    torch.manual_seed(123)  # the global RNG must not matter
    b = epoch(DeviceLoader(data, 16, max_shift=2, seed=1), 3)
    c = epoch(DeviceLoader(data, 16, max_shift=2, seed=1), 4)
    d = epoch(DeviceLoader(data, 16, max_shift=2, seed=2), 3)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not torch.equal(a[0][1], c[0][1]) and not torch.equal(a[0][1], d[0][1])


@pytest.mark.parametrize("drop_last", [True, False])
def test_rank_slices_concatenate_to_single_process_batches(drop_last):
    data = make_data()
    single = epoch(DeviceLoader(data, 8, max_shift=2, seed=5, drop_last=drop_last), 2)
    ranks = [
        epoch(DeviceLoader(data, 8, max_shift=2, seed=5, drop_last=drop_last, rank=r, world_size=2), 2)
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(single)
    for step, (images, labels) in enumerate(single):
        assert torch.equal(torch.cat([ranks[r][step][0] for r in range(2)]), images)
        assert torch.equal(torch.cat([ranks[r][step][1] for r in range(2)]), labels)
    assert all(len(lab) == 4 for _, lab in ranks[0][:-1])


def test_accepts_tensor_pair_and_validates():
    images, labels = torch.rand(10, 1, 4, 4), torch.arange(10)
    assert len(DeviceLoader((images, labels), 4)) == 3
    with pytest.raises(ValueError, match="batch_size"):
        DeviceLoader((images, labels), 5, world_size=2)
    with pytest.raises(ValueError, match="rank"):
        DeviceLoader((images, labels), 4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="max_shift"):
        DeviceLoader((images, labels), 4, max_shift=-1)
    with pytest.raises(ValueError, match="targets of N rows"):
        DeviceLoader((images, labels[:9]), 4)
    with pytest.raises(ValueError, match="targets of N rows"):
        DeviceLoader((images, (labels, labels[:9])), 4)
    with pytest.raises(ValueError, match="either data or epoch_data"):
        DeviceLoader(None, 4)


def test_tuples_of_targets_and_data_drawn_each_epoch():
    images, labels = torch.rand(10, 1, 4, 4), torch.arange(10)
    loader = DeviceLoader((images, (labels, labels * 2)), 4, seed=3)
    loader.set_epoch(0)
    batches = list(loader)
    assert [len(b[1][0]) for b in batches] == [4, 4, 2]
    assert all(torch.equal(b[1][1], b[1][0] * 2) for b in batches)  # rows stay together
    drawn = []
    epochs = DeviceLoader(None, 4, epoch_data=lambda epoch: drawn.append(epoch) or (images + epoch, labels))
    epochs.set_epoch(1)
    first = torch.cat([b[0] for b in epochs])
    assert drawn == [2] and torch.allclose(first.sort(0).values, (images + 2).sort(0).values)


def crop_augment(images, generator):
    """A test augment: random 4x4 crop plus a per-image random offset (so it changes values and shape)."""
    from capsnets.data import random_crop

    out = random_crop(images, 4, generator)
    return out + torch.rand(len(images), 1, 1, 1, generator=generator)


def test_augment_is_deterministic_per_seed_and_epoch():
    data = make_data()
    a = epoch(DeviceLoader(data, 16, seed=1, augment=crop_augment), 3)
    torch.manual_seed(99)
    b = epoch(DeviceLoader(data, 16, seed=1, augment=crop_augment), 3)
    c = epoch(DeviceLoader(data, 16, seed=1, augment=crop_augment), 4)
    assert all(x[0].shape[1:] == (1, 4, 4) for x in a)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])
    for images, labels in a:  # each image keeps its own label: constant image label + 1, plus offset in [0, 1)
        offset = images[:, 0, 0, 0] - (labels.float() + 1)
        assert (offset >= 0).all() and (offset < 1).all()


@pytest.mark.parametrize("drop_last", [True, False])
def test_augment_rank_slices_concatenate_to_single_process_batches(drop_last):
    data = make_data()
    kwargs = dict(max_shift=1, seed=5, drop_last=drop_last, augment=crop_augment)
    single = epoch(DeviceLoader(data, 8, **kwargs), 2)
    ranks = [epoch(DeviceLoader(data, 8, rank=r, world_size=2, **kwargs), 2) for r in range(2)]
    for step, (images, labels) in enumerate(single):
        assert torch.equal(torch.cat([ranks[r][step][0] for r in range(2)]), images)
        assert torch.equal(torch.cat([ranks[r][step][1] for r in range(2)]), labels)


def test_augment_taken_from_data_unless_disabled():
    import dataclasses

    data = dataclasses.replace(make_data(), augment=crop_augment)
    assert DeviceLoader(data, 8).augment is crop_augment
    assert next(iter(DeviceLoader(data, 8)))[0].shape == (8, 1, 4, 4)
    assert DeviceLoader(data, 8, augment=False).augment is None
    assert next(iter(DeviceLoader(data, 8, augment=False)))[0].shape == (8, 1, 6, 6)
    with pytest.raises(ValueError, match="augment"):
        DeviceLoader(data, 8, augment="crop")


@pytest.mark.parametrize("augment", [None, crop_augment])
def test_iter_from_continues_an_epoch_where_an_iteration_stopped(augment):
    loader = DeviceLoader(make_data(), 16, seed=2, max_shift=1, augment=augment)
    whole = epoch(loader, 5)  # 7 batches
    for first in (0, 3, 7):
        tail = list(loader.iter_from(first))
        assert len(tail) == 7 - first
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(tail, whole[first:]))
    for bad in (-1, 8, 1.5):
        with pytest.raises(ValueError, match="batch index"):
            loader.iter_from(bad)
