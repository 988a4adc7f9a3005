# -*- test-case-name: iop.test.cli.test_main -*-
"""``python -m iop.cli``: the ``iop`` command without the installed console script."""

import sys

from iop.cli.main import main

sys.exit(main())
