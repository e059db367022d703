"""``python -m msgq``: the ``msgq`` command (see msgq.cli)."""

import sys

from msgq.cli import main

if __name__ == "__main__":
    sys.exit(main())
