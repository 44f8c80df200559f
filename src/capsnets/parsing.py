"""YAML and JSON documents from users (config files, ``--model-arg`` / ``--loss-arg`` / ``--set`` values), parsed
safely and within limits.

The one loader of YAML and JSON text a user hands the library. YAML is read with PyYAML's safe loader (no tag
runs code; ``1e-3`` is a float, as in JSON and YAML 1.2). Both formats are held to limits that keep a small
document from asking for unbounded time or memory:

- ``MAX_DOCUMENT_BYTES``: the size of the text (or the file);
- ``MAX_DOCUMENT_DEPTH``: how deep values nest (a scalar document is 1 deep, ``{"a": [1]}`` 3 deep);
- ``MAX_DOCUMENT_VALUES``: how many values (mappings, lists, keys and scalars) the document holds, each YAML
  alias counted as the values of the node it stands for;
- and, for YAML aliases, the text of the scalars they stand for counts against ``MAX_DOCUMENT_BYTES``, so that
  aliases never make a document larger than one written out in full could be.

Keys of mappings must be strings, the names of settings (a YAML key such as ``1:``, ``yes:`` or ``null:``, which
YAML 1.1 reads as a number, a boolean or None, is refused with a hint to quote it).

Counting aliases as what they stand for is what defuses the "billion laughs" (anchors nested 9 deep with 9
aliases each stand for 9**9 values in a few hundred bytes): the count grows while the document is composed, and
the document is refused at the alias that takes it past the limit, before anything is built from it. An alias
to the node that contains it (a cycle) is refused too. Anchors and aliases within the limits, and merge keys
(``<<: *defaults``), work as in any YAML file.

Every refusal is an :class:`~capsnets.validation.ArgumentError` (a ``ValueError``) that names the document,
what it exceeds, the limit and how to fix it. The limits are module attributes read at each call: a program
that needs larger documents may raise them (``capsnets.parsing.MAX_DOCUMENT_VALUES = 100_000``).

Examples::

    >>> load_yaml("lr: 1e-3\\nmodel_args: {routing: {iterations: 2}}")
    {'lr': 0.001, 'model_args': {'routing': {'iterations': 2}}}
    >>> load_json('{"epochs": 3}')
    {'epochs': 3}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from capsnets.validation import ArgumentError, shown

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_DOCUMENT_DEPTH",
    "MAX_DOCUMENT_VALUES",
    "load_json",
    "load_yaml",
    "read_document",
]

#: The largest document, in bytes of UTF-8 (a file's size): a training config takes a few kB, and PyYAML's
#: reader is pure Python.
MAX_DOCUMENT_BYTES = 256 * 1024

#: How deep values may nest (a config nests 3 or 4 deep: ``model_args.routing.iterations``); well below Python's
#: recursion limit, for every function that walks the values afterwards.
MAX_DOCUMENT_DEPTH = 50

#: How many values a document may hold, aliases counted as the values they stand for.
MAX_DOCUMENT_VALUES = 10_000

_FIX_SIZE = "a config takes a few kB: pass a smaller document"
_FIX_ALIASES = "write the document with fewer values, or with aliases to smaller anchors"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, composing within the limits of this module, and reading ``1e-3`` (an exponent
    without a dot) as a float, rather than the string YAML 1.1 makes of it.

    Args:
        text: the document.
        where: what the document is, for the messages (``"config file 'a.yaml'"``).
    """

    def __init__(self, text: str, where: str) -> None:
        super().__init__(text)
        self.where = where
        self.depth = 0
        self.values = 0
        self.chars = 0
        self.sizes: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (values, scalar characters) it holds

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self.sizes.get(id(node))
            if size is None:
                raise ArgumentError(
                    f"{self.where}: the alias *{event.anchor} at {_at(event.start_mark)} stands for a node that "
                    "contains it (a cycle), which no value can hold; remove the alias"
                )
            self._count(*size, event.start_mark)
            return node
        if self.depth >= MAX_DOCUMENT_DEPTH:
            raise _too_deep(self.where, _at(event.start_mark))
        self.depth += 1
        values, chars = self.values, self.chars
        self._count(1, len(event.value) if isinstance(event, yaml.ScalarEvent) else 0, event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if isinstance(node, yaml.MappingNode) and node.tag != _SET:
            self._check_keys(node)
        if event.anchor is not None:
            self.sizes[id(node)] = (self.values - values, self.chars - chars)
        return node

    def _check_keys(self, node: yaml.MappingNode) -> None:
        """Keys are names: YAML 1.1 reads ``1:``, ``yes:`` and ``null:`` as a number, a boolean and None."""
        for key, _ in node.value:
            if key.tag not in _NAME_TAGS:
                kind = key.tag.rsplit(":", 1)[-1]
                kind = _KINDS.get(kind, kind)
                if isinstance(key, yaml.ScalarNode):
                    problem = f"the key {shown(key.value)} at {_at(key.start_mark)} is read as {kind}"
                    fix = f"quote it ({shown(key.value)}: ...)"
                else:
                    problem, fix = f"the key at {_at(key.start_mark)} is {kind}", "use a name"
                raise ArgumentError(f"{self.where}: {problem}, not a name; keys name settings: {fix}")

    def _count(self, values: int, chars: int, mark) -> None:
        self.values += values
        self.chars += chars
        if self.values > MAX_DOCUMENT_VALUES:
            raise _too_many(self.where, f"at {_at(mark)}")
        if self.chars > MAX_DOCUMENT_BYTES:
            raise ArgumentError(
                f"{self.where}: its aliases stand for more than {MAX_DOCUMENT_BYTES} characters of text (at "
                f"{_at(mark)}; limit capsnets.parsing.MAX_DOCUMENT_BYTES); {_FIX_ALIASES}"
            )


#: The tags of the keys a mapping may have (a string, and the merge key ``<<`` and value key ``=`` that PyYAML turns
#: into strings), and the tag of a set (``!!set {a, b}``), whose keys are its items.
_NAME_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")
_SET = "tag:yaml.org,2002:set"
#: The kinds of value a key can be read as, in words.
_KINDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
    "seq": "a list",
    "map": "a mapping",
    "timestamp": "a date",
}

_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def load_yaml(text: str, where: str = "the YAML text") -> Any:
    """Parse one YAML document safely (no tag runs code) and within this module's limits.

    Args:
        text: the document.
        where: what the document is, for the messages (``"config file 'a.yaml'"``, ``"--model-arg 'x=...'"``).

    Returns:
        The values (dicts, lists, strings, numbers, booleans, None; ``1e-3`` is a float), None for an empty
        document.

    Raises:
        ArgumentError: the document is not valid YAML, or exceeds a limit; the message says which and how to fix it.

    Examples::

        >>> load_yaml("base: &b {iterations: 2}\\nrouting: *b")
        {'base': {'iterations': 2}, 'routing': {'iterations': 2}}
    """
    _check_size(text, where)
    loader = _Loader(text, where)
    try:
        return loader.get_single_data()
    except ArgumentError:
        raise
    except yaml.MarkedYAMLError as err:
        raise ArgumentError(f"{where} cannot be read as YAML: {_yaml_problem(err)}; correct it there") from None
    except yaml.YAMLError as err:
        raise ArgumentError(f"{where} cannot be read as YAML: {_one_line(err)}; correct it there") from None
    except RecursionError:
        raise _too_deep(where, "while it was read") from None
    except (ValueError, OverflowError) as err:  # a number or date Python cannot hold (e.g. an int of 5000 digits)
        raise ArgumentError(f"{where} holds a value Python cannot read ({_one_line(err)}); correct it there") from None
    finally:
        loader.dispose()


def load_json(text: str, where: str = "the JSON text") -> Any:
    """Parse one JSON document within this module's limits (JSON has no aliases: depth, values and size).

    Args:
        text: the document.
        where: what the document is, for the messages.

    Raises:
        ArgumentError: the document is not valid JSON, or exceeds a limit; the message says which and how to fix it.
    """
    _check_size(text, where)
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where, "while it was read") from None
    except json.JSONDecodeError as err:
        raise ArgumentError(f"{where} is not valid JSON: {err}; correct it there") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise ArgumentError(f"{where} holds a value Python cannot read ({_one_line(err)}); correct it there") from None
    _check_tree(value, where)
    return value


def read_document(path: str | Path, what: str = "config file") -> Any:
    """Read a YAML file (JSON for a ``.json`` suffix) within this module's limits; no more than
    ``MAX_DOCUMENT_BYTES`` + 1 bytes are read, whatever the file is.

    Args:
        path: the file.
        what: what the file is, for the messages.

    Raises:
        ArgumentError: the file is missing, unreadable, not UTF-8, not valid YAML/JSON, or exceeds a limit.
    """
    path = Path(path)
    where = f"{what} {str(path)!r}"
    if not path.is_file():
        raise ArgumentError(f"{where} does not exist (or is not a file); check the path")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ArgumentError(f"cannot read {where} ({err}); pass a readable UTF-8 text file") from None
    return load_json(text, where) if path.suffix.lower() == ".json" else load_yaml(text, where)


def _check_size(text: str, where: str) -> None:
    if not isinstance(text, str):
        raise ArgumentError(f"{where} must be text (a str), got {type(text).__name__}")
    if len(text) > MAX_DOCUMENT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise ArgumentError(
            f"{where} is larger than {MAX_DOCUMENT_BYTES} bytes (limit capsnets.parsing.MAX_DOCUMENT_BYTES); "
            f"{_FIX_SIZE}"
        )


def _check_tree(value: Any, where: str) -> None:
    """Depth and value count of parsed JSON, walked without recursion."""
    stack, count = [(value, 1)], 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_DOCUMENT_VALUES:
            raise _too_many(where, "")
        if depth > MAX_DOCUMENT_DEPTH:
            raise _too_deep(where, "")
        if isinstance(item, dict):
            count += len(item)  # the keys
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def _too_deep(where: str, at: str) -> ArgumentError:
    at = f"{at}; " if at else ""
    return ArgumentError(
        f"{where} nests values more than {MAX_DOCUMENT_DEPTH} deep ({at}limit capsnets.parsing.MAX_DOCUMENT_DEPTH); "
        "a config nests 3 or 4 deep: write it with fewer levels"
    )


def _too_many(where: str, at: str) -> ArgumentError:
    at = f"{at}; " if at else ""
    return ArgumentError(
        f"{where} holds more than {MAX_DOCUMENT_VALUES} values, each alias counted as the values it stands for "
        f"({at}limit capsnets.parsing.MAX_DOCUMENT_VALUES); {_FIX_ALIASES}"
    )


def _at(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(err: yaml.MarkedYAMLError) -> str:
    """A parse error in one line: what is wrong and where (PyYAML's message spans several)."""
    problem = ", ".join(part for part in (err.context, err.problem) if part) or "cannot parse it"
    mark = err.problem_mark or err.context_mark
    return f"{problem} ({_at(mark)})" if mark is not None else problem


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
