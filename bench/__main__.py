"""``python -m bench``: the benchmark entry point (see :mod:`bench.run`)."""

from bench.run import main

raise SystemExit(main())
