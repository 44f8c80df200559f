"""``python -m capsnets``: the same as the ``capsnets`` command."""

import sys

from capsnets.cli import main

if __name__ == "__main__":
    sys.exit(main())
