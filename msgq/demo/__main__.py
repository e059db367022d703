"""``python -m msgq.demo``: the end-to-end demo (see :mod:`msgq.demo.pipeline`)."""

from msgq.demo.pipeline import main

raise SystemExit(main())
