"""``python -m msgq.demo``: the throughput demo (the end-to-end pipeline comes next)."""

from msgq.demo.throughput import main

raise SystemExit(main())
