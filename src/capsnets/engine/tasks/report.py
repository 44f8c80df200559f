"""What the tasks' reports share: percentages, per-class tables and the evaluation's JSON file.

A task's :meth:`~capsnets.engine.tasks.Task.report` writes ``STEM.json`` (``capsnets evaluate``'s record of a
checkpoint on a test split, marked by :func:`~capsnets.outputs.json_header`) and returns the text to print.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsnets.files import atomic_write_text
from capsnets.outputs import json_header

__all__ = ["class_names", "class_table", "percent", "write_evaluation"]


def chosen_on(summary: dict[str, Any]) -> str:
    """``", chosen on the validation split"`` where the summary says the ``best`` checkpoint was, else ``""``."""
    split = summary.get("best_chosen_on")
    return f", chosen on the {split} split" if split else ""


def percent(value: float | None) -> str:
    """``value`` as a percentage with two decimals (``"98.25%"``); ``"n/a"`` for None or NaN.

    Examples::

        >>> percent(0.98254), percent(float("nan"))
        ('98.25%', 'n/a')
    """
    return "n/a" if value is None or value != value else f"{100 * value:.2f}%"


def class_names(data: Any) -> list[str]:
    """The names of ``data``'s classes: its ``classes``, else ``"0"``, ``"1"``..."""
    return list(data.classes) or [str(k) for k in range(data.num_classes)]


def class_table(classes: Sequence[str], columns: dict[str, Sequence[str]]) -> list[str]:
    """The lines of a per-class table: a header, then a row per class (its name and its cell of each column),
    every column right-aligned, the name's at least 6 characters wide and the others' at least 7.

    Args:
        classes: the class names, one per row.
        columns: each column's header and its cells, one per class, already formatted.

    Examples::

        >>> print("\\n".join(class_table(["cat", "dog"], {"accuracy": ["90.00%", "80.00%"]})))
         class  accuracy
           cat    90.00%
           dog    80.00%
    """
    widths = [max(6, *(len(c) for c in classes))] + [max(7, len(header)) for header in columns]
    rows = [["class", *columns], *([name, *cells] for name, *cells in zip(classes, *columns.values()))]
    return ["  ".join(f"{cell:>{width}}" for cell, width in zip(row, widths)) for row in rows]


def write_evaluation(path: Path, record: dict[str, Any], entries: dict[str, Any]) -> Path:
    """Write ``path`` (atomically): the evaluation's mark, ``record`` (which checkpoint, which epoch), then the
    task's ``entries``; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {**json_header("evaluation"), **record, **entries}
    return atomic_write_text(path, json.dumps(report, indent=2) + "\n")
