"""``python -m msgq.bench``: the core suite (:mod:`msgq.bench.core`)."""

import sys

from msgq.bench.core import main

sys.exit(main())
