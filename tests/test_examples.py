"""The Examples in the docstrings of capsnets.functional, capsnets.layers, capsnets.models and capsnets.inference run
and print what they say (doctest)."""

import doctest
import importlib
import pkgutil

import pytest
import torch

import capsnets
import capsnets.functional
import capsnets.layers
import capsnets.models

MODULES = [
    info.name
    for package in (capsnets.functional, capsnets.layers, capsnets.models)
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
] + ["capsnets.inference"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    from capsnets.layers import MatrixCapsules

    names = {"torch": torch, "capsnets": capsnets, "MatrixCapsules": MatrixCapsules}
    for package in (capsnets.functional, capsnets.layers):
        names.update({k: getattr(package, k) for k in package.__all__})
    torch.manual_seed(0)
    result = doctest.testmod(importlib.import_module(name), extraglobs=names, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see the output)"
