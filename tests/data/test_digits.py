import numpy as np
import pytest
import torch

from capsnets.data import load_digits_split
from capsnets.data.digits import stratified_split


def test_shapes_and_range():
    images, labels = load_digits_split(train=True)
    assert images.shape == (1437, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (1437,) and labels.dtype == torch.int64
    assert images.min() == 0 and images.max() == 1
    assert load_digits_split(train=False)[0].shape == (360, 1, 8, 8)


def test_deterministic_and_independent_of_global_rng():
    torch.manual_seed(1), np.random.seed(1)
    a = load_digits_split(train=False)
    torch.manual_seed(2), np.random.seed(2)
    b = load_digits_split(train=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], load_digits_split(train=False, seed=1)[0])


def test_split_is_disjoint_and_stratified():
    labels = np.repeat(np.arange(10), [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
    train, test = stratified_split(labels, 360, seed=0)
    assert len(train) == 1437 and len(test) == 360
    assert set(train).isdisjoint(test) and len(set(train) | set(test)) == 1797
    assert np.abs(np.bincount(labels[test]) - 36).max() <= 1
    _, test_labels = load_digits_split(train=False)
    assert torch.bincount(test_labels, minlength=10).min() >= 34


def test_bad_test_size():
    with pytest.raises(ValueError, match="test_size"):
        stratified_split(np.zeros(5, int), 6)


def test_the_file_scikit_learn_ships_is_read_as_load_digits_reads_it(monkeypatch):
    from sklearn.datasets import load_digits

    from capsnets.data import digits

    bunch = load_digits()
    for found in (True, False):  # the file in scikit-learn's package, else load_digits itself
        if not found:
            monkeypatch.setattr(digits.importlib.util, "find_spec", lambda name: None)
        pixels, labels = digits._read_digits()
        assert np.array_equal(pixels, bunch.data) and np.array_equal(labels, bunch.target)
