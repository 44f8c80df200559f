"""The Examples in capsnets.functional's docstrings run and print what they say (doctest)."""
import doctest
import importlib
import pkgutil

import pytest
import torch

import capsnets.functional

MODULES = [info.name for info in pkgutil.iter_modules(capsnets.functional.__path__, "capsnets.functional.")]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    import capsnets.functional as functional
    import capsnets.layers as layers
    from capsnets.capsules import MatrixCapsules

    names = {"torch": torch, "MatrixCapsules": MatrixCapsules}
    for package in (functional, layers):
        names.update({k: getattr(package, k) for k in package.__all__})
    torch.manual_seed(0)
    result = doctest.testmod(importlib.import_module(name), extraglobs=names, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see the output)"
