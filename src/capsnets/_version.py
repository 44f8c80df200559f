"""The version of capsnets, in one place (``pyproject.toml`` reads it from here)."""

__version__ = "0.2.0"
