"""Fault class "CLI and config": hostile YAML and JSON in ``--config``, ``model_args``, ``--model-arg``,
``--loss-arg`` and ``--set``, and the limits of :mod:`capsnets.parsing` (size, nesting depth, values with aliases
expanded), at and past each limit.

A command line refuses each with one error line and status 1, no traceback, in a fraction of a second and without
expanding the document; the library functions raise :class:`~capsnets.validation.ArgumentError`. Error messages
show values through :func:`capsnets.validation.shown`, a :class:`reprlib.Repr` that walks a value only as far as its
limits.
"""

from __future__ import annotations

import tracemalloc

import pytest
from reliability.faults import one_error_line

from capsnets import parsing
from capsnets.cli import main, parse_key_values
from capsnets.engine.config import build_config, read_config_file
from capsnets.parsing import (
    MAX_DOCUMENT_BYTES,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_VALUES,
    load_json,
    load_yaml,
    read_document,
)
from capsnets.validation import ArgumentError, check_device, shown


def laughs(depth: int = 9, width: int = 9) -> str:
    """A YAML "billion laughs" in flow style: ``depth`` anchors, each a list of ``width`` aliases of the one before
    (the first a list of ``width`` strings); it stands for ``width**depth`` strings in a few hundred bytes."""
    items = ["&a0 [" + ", ".join(['"lol"'] * width) + "]"]
    items += [f"&a{k} [" + ", ".join([f"*a{k - 1}"] * width) + "]" for k in range(1, depth)]
    return "[" + ", ".join(items) + "]"


def laughs_block(depth: int = 9, width: int = 9) -> str:
    """The same bomb as a block list under ``epochs:`` (the form of a hand-written config), under 500 bytes."""
    items = ["&a0 [" + ",".join(['"lol"'] * width) + "]"]
    items += [f"&a{k} [" + ",".join([f"*a{k - 1}"] * width) + "]" for k in range(1, depth)]
    return "epochs:\n" + "".join(f"  - {item}\n" for item in items)


def nested(depth: int) -> str:
    """A document ``depth`` deep: lists nested ``depth - 1`` deep around a 0 (a scalar is a level too)."""
    return "[" * (depth - 1) + "0" + "]" * (depth - 1)


def refused(argv: list[str], capsys, command: str = "train") -> str:
    assert main(argv) == 1
    return one_error_line(capsys.readouterr().err, command)


# The cases of the command line


@pytest.mark.parametrize("text", [f"epochs: {laughs()}\n", laughs_block()], ids=["flow", "block"])
def test_billion_laughs_in_config_is_refused_unexpanded(text, tmp_path, capsys):
    config = tmp_path / "laughs.yaml"
    config.write_text(text)
    assert len(config.read_bytes()) < 500
    line = refused(["train", "--config", str(config)], capsys)
    assert f"holds more than {MAX_DOCUMENT_VALUES} values" in line and "MAX_DOCUMENT_VALUES" in line
    assert "aliases" in line and ", column " in line


def test_billion_laughs_under_model_args_is_refused(tmp_path, capsys):
    config = tmp_path / "laughs.yaml"
    config.write_text(f"model: capsnet_digits\nmodel_args:\n  num_classes: {laughs()}\n")
    line = refused(["train", "--config", str(config)], capsys)
    assert f"config file '{config}' holds more than {MAX_DOCUMENT_VALUES} values" in line


@pytest.mark.parametrize("flag", ["--model-arg", "--loss-arg"])
def test_billion_laughs_in_a_key_value_flag_is_refused(flag, capsys):
    line = refused(["train", flag, f"num_classes={laughs()}"], capsys)
    assert f"the value of {flag} 'num_classes' holds more than {MAX_DOCUMENT_VALUES} values" in line


def test_billion_laughs_in_set_is_refused(tmp_path, capsys):
    argv = ["experiment", "dimensions", "--out", str(tmp_path / "x"), "--set", f"epochs={laughs()}"]
    line = refused(argv, capsys, "experiment")
    assert f"the value of --set 'epochs' holds more than {MAX_DOCUMENT_VALUES} values" in line
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_config_nested_200000_deep_is_refused_by_its_size(suffix, tmp_path, capsys):
    config = tmp_path / f"deep{suffix}"
    config.write_text('{"epochs": ' + nested(200_000) + "}")
    line = refused(["train", "--config", str(config)], capsys)
    assert f"is larger than {MAX_DOCUMENT_BYTES} bytes" in line and "MAX_DOCUMENT_BYTES" in line


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_config_nested_deep_within_the_size_is_refused_by_its_depth(suffix, tmp_path, capsys):
    config = tmp_path / f"deep{suffix}"
    config.write_text('{"epochs": ' + nested(100_000) + "}")
    assert config.stat().st_size <= MAX_DOCUMENT_BYTES
    line = refused(["train", "--config", str(config)], capsys)
    assert f"nests values more than {MAX_DOCUMENT_DEPTH} deep" in line and "MAX_DOCUMENT_DEPTH" in line


def test_a_huge_config_file_is_not_read_whole(tmp_path, capsys):
    config = tmp_path / "huge.yaml"
    with config.open("wb") as handle:  # 1 GiB, sparse: reading it whole would take a gigabyte
        handle.truncate(2**30)
    assert f"is larger than {MAX_DOCUMENT_BYTES} bytes" in refused(["train", "--config", str(config)], capsys)
    tracemalloc.start()
    try:
        with pytest.raises(ArgumentError, match="is larger than"):
            read_config_file(config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_DOCUMENT_BYTES


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("epochs: " + "1" * 5000, "holds a value Python cannot read (Exceeds the limit (4300 digits)"),
        ("epochs: 2020-02-30", "holds a value Python cannot read (day is out of range for month)"),
        ("epochs: &e [1, *e]", "the alias *e at line 1, column 16 stands for a node that contains it (a cycle)"),
        ("epochs: [1, 2\n", "cannot be read as YAML: while parsing a flow sequence, expected ',' or ']'"),
        ("a: 1\n---\nb: 2\n", "expected a single document in the stream, but found another document (line 2"),
        ("epochs: !!python/object/apply:os.system ['true']", "could not determine a constructor for the tag"),
        (
            "model_args: {1: 2}",
            "the key '1' at line 1, column 14 is read as an integer, not a name; keys name settings: "
            "quote it ('1': ...)",
        ),
        ("null: 2", "the key 'null' at line 1, column 1 is read as null, not a name"),
        (
            "model_args:\n  ? [1]\n  : 2",
            "the key at line 2, column 5 is a list, not a name; keys name settings: use a name",
        ),
    ],
)
def test_unreadable_values_get_one_line(text, words, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    assert words in refused(["train", "--config", str(config)], capsys)


def test_a_key_that_is_not_a_name_in_a_flag_is_refused(capsys):
    line = refused(["train", "--model-arg", "routing={1: 2}"], capsys)
    assert "the value of --model-arg 'routing': the key '1' at line 1, column 2 is read as an integer" in line


def test_keys_of_sets_and_merge_keys_are_taken():
    assert load_yaml("s: !!set {1, 2}\nb: &b {x: 1}\nc: {<<: *b}") == {"s": {1, 2}, "b": {"x": 1}, "c": {"x": 1}}


def test_a_config_that_is_not_a_file_is_refused(capsys):
    assert "does not exist (or is not a file)" in refused(["train", "--config", "/dev/zero"], capsys)


# The library's exceptions


def test_library_functions_raise_argument_errors(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(f"epochs: {laughs()}\n")
    for call in (
        lambda: read_config_file(path),
        lambda: build_config(path),
        lambda: read_document(path),
        lambda: load_yaml(laughs()),
        lambda: parse_key_values([f"num_classes={laughs()}"], "--model-arg"),
        lambda: load_json("[" * 10_000 + "]" * 10_000),
    ):
        with pytest.raises(ArgumentError, match="limit capsnets.parsing.MAX_DOCUMENT"):
            call()


def test_the_bomb_is_refused_in_bounded_memory():
    tracemalloc.start()
    try:
        with pytest.raises(ArgumentError):
            load_yaml(f"epochs: {laughs()}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_merge_keys_count_as_the_values_they_copy():
    """``<<: [*a, *a, ...]`` nested 9 deep would make PyYAML build 9**9 key/value pairs."""
    text = "a0: &a0 {x: 1, y: 2}\n" + "".join(
        f"a{k}: &a{k} {{<<: [{', '.join([f'*a{k - 1}'] * 9)}]}}\n" for k in range(1, 9)
    )
    with pytest.raises(ArgumentError, match="MAX_DOCUMENT_VALUES"):
        load_yaml(text)


def test_anchors_aliases_and_merge_keys_within_the_limits_work():
    text = "base: &b {iterations: 2, detach_routing: false}\nrouting: {<<: *b, iterations: 3}\nagain: *b\n"
    assert load_yaml(text) == {
        "base": {"iterations": 2, "detach_routing": False},
        "routing": {"iterations": 3, "detach_routing": False},
        "again": {"iterations": 2, "detach_routing": False},
    }
    assert load_yaml("lr: 1e-3") == {"lr": 0.001}


# Each limit, at and past it


@pytest.mark.parametrize("load", [load_yaml, load_json])
def test_size_limit(load):
    at = '"' + "x" * (MAX_DOCUMENT_BYTES - 2) + '"'
    assert len(load(at)) == MAX_DOCUMENT_BYTES - 2
    with pytest.raises(ArgumentError, match=f"larger than {MAX_DOCUMENT_BYTES} bytes"):
        load(at + " ")
    with pytest.raises(ArgumentError, match="larger than"):  # bytes of UTF-8, not characters
        load('"' + "é" * (MAX_DOCUMENT_BYTES // 2) + '"')


def test_size_limit_of_a_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("out: " + "x" * (MAX_DOCUMENT_BYTES - 5))
    assert len(read_config_file(path)["out"]) == MAX_DOCUMENT_BYTES - 5
    path.write_text("out: " + "x" * (MAX_DOCUMENT_BYTES - 4))
    with pytest.raises(ArgumentError, match=f"config file '{path}' is larger than {MAX_DOCUMENT_BYTES} bytes"):
        read_config_file(path)


@pytest.mark.parametrize("load", [load_yaml, load_json])
def test_depth_limit(load):
    assert load(nested(MAX_DOCUMENT_DEPTH)) is not None
    with pytest.raises(ArgumentError, match=f"more than {MAX_DOCUMENT_DEPTH} deep"):
        load(nested(MAX_DOCUMENT_DEPTH + 1))


def test_values_at_the_depth_limit_survive_the_library(tmp_path):
    """A config as deep as the loader takes is validated, saved as YAML and read back without a RecursionError."""
    path = tmp_path / "config.yaml"
    path.write_text("model_args:\n  x: " + nested(MAX_DOCUMENT_DEPTH - 2))
    config = build_config(path)
    config.save(tmp_path / "again.yaml")
    assert build_config(tmp_path / "again.yaml").to_dict() == config.to_dict()
    assert config.replace(epochs=2).model_args == config.model_args


@pytest.mark.parametrize("load", [load_yaml, load_json])
def test_value_limit_without_aliases(load):
    at = "[" + ", ".join(["0"] * (MAX_DOCUMENT_VALUES - 1)) + "]"  # the list and its items
    assert len(load(at)) == MAX_DOCUMENT_VALUES - 1
    with pytest.raises(ArgumentError, match=f"more than {MAX_DOCUMENT_VALUES} values"):
        load(at[:-1] + ", 0]")


def test_value_limit_counts_each_alias_as_what_it_stands_for():
    anchor = "a: &a [" + ", ".join(["0"] * 99) + "]\n"  # the mapping, the key, the list and its 99 zeros: 102
    aliases = "b: [" + ", ".join(["*a"] * 98)  # the key and the list: 104; 98 aliases of 100 values: 9904
    at = anchor + aliases + ", 0" * (MAX_DOCUMENT_VALUES - 9904) + "]"
    assert len(load_yaml(at)["b"]) == 98 + MAX_DOCUMENT_VALUES - 9904
    with pytest.raises(ArgumentError, match="each alias counted as the values it stands for"):
        load_yaml(at[:-1] + ", 0]")


def test_aliases_never_stand_for_more_text_than_the_size_limit():
    half = MAX_DOCUMENT_BYTES // 2 - 8
    text = f"s: &s {'x' * half}\nt: *s\n"  # the keys, s and t: 2 characters more
    assert load_yaml(text)["t"] == "x" * half
    with pytest.raises(ArgumentError, match=f"aliases stand for more than {MAX_DOCUMENT_BYTES} characters"):
        load_yaml(text + "u: *s\n")


@pytest.mark.parametrize("load", [load_yaml, load_json])
def test_recursion_error_is_caught(load, monkeypatch):
    """Past Python's recursion limit the parser itself would raise RecursionError: it becomes the depth error."""
    monkeypatch.setattr(parsing, "MAX_DOCUMENT_DEPTH", 10**9)
    with pytest.raises(ArgumentError, match="nests values more than 1000000000 deep"):
        load(nested(5_000))


def test_limits_are_read_at_each_call(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_DOCUMENT_VALUES", 3)
    assert load_yaml("[1, 2]") == [1, 2]
    with pytest.raises(ArgumentError, match="more than 3 values"):
        load_yaml("[1, 2, 3]")


# Messages never expand a value


def test_shown_walks_a_value_only_as_far_as_its_limit():
    bomb = ["lol"] * 9
    for _ in range(7):  # 9**8 strings: a repr of about 300 MB
        bomb = [bomb] * 9
    tracemalloc.start()
    try:
        text = shown(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text.startswith("[[[[[...], [...],") and text.endswith("...") and len(text) == 80
    assert peak < 2**20
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert shown(deep) == "[[[[[...]]]]]"
    assert shown(10**100_000) == "<an integer of 332193 bits>"
    assert shown("y" * 10**7) == "'" + "y" * 37 + "..." + "y" * 38 + "'"
    assert shown(b"y" * 10**7, 20) == "b'yyyyyy...yyyyyyyy'"
    assert shown(list(range(10**6)), 20) == "[0, 1, 2, 3, 4, 5..."


@pytest.mark.parametrize(
    "value", [0, -1.5, None, True, "a'b", b"x", [1, [2, (3,)]], (), (1,), {}, {"a": {1, 2}}, set(), frozenset({3})]
)
def test_shown_is_repr_for_short_values(value):
    assert shown(value) == repr(value)


def test_shown_stops_at_a_value_that_holds_itself():
    loop: list = [1]
    loop.append(loop)
    mapping: dict = {}
    mapping["x"] = mapping
    assert (shown(loop), shown(mapping)) == ("[1, [1, [1, [1, [...]]]]]", "{'x': {'x': {'x': {'x': {...}}}}}")


def test_a_device_argument_is_shown_bounded():
    bomb = ["cpu"] * 9
    for _ in range(9):
        bomb = [bomb] * 9
    with pytest.raises(ArgumentError) as caught:
        check_device(bomb)
    assert len(str(caught.value)) < 400
