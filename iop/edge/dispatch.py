# -*- test-case-name: iop.test.edge.test_runs -*-
"""
Transitional: the run dispatcher moved to :mod:`iop.edge.runs` and the errors to
:mod:`iop.edge.errors`. Remove this module once nothing imports it.
"""

from __future__ import annotations

from iop.edge.errors import DispatchError as DispatchError
from iop.edge.errors import NodeUnavailable as NodeUnavailable
from iop.edge.errors import NoRoute as NoRoute
from iop.edge.runs import CANCEL_GRACE_SEC as CANCEL_GRACE_SEC
from iop.edge.runs import RunDispatcher as RunDispatcher
from iop.edge.runs import RunHandle as RunHandle
