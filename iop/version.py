# -*- test-case-name: iop.test.test_version -*-
"""IOP's version, as every program says it (``iop --version``, ``twistd iop-edge --version``,
``twistd iop-node --version``): the program, IOP's version, and the Python and Twisted under
it (what a bug report needs)."""

from __future__ import annotations

import platform

import twisted
from iop import __version__

__all__ = ["version_line"]


def version_line(program: str) -> str:
    """``"<program> <IOP version> (Python X.Y.Z, Twisted N)"``."""
    return (
        f"{program} {__version__} "
        f"(Python {platform.python_version()}, Twisted {twisted.__version__})"
    )
