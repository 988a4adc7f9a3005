"""
Unit tests (trial): deterministic, no real network.

Property tests (hypothesis) run derandomized and without an example database, so every run
explores the same examples. To explore fresh ones locally: ``HYPOTHESIS_PROFILE=explore trial
iop`` — fresh examples, and :func:`examples` times :data:`EXPLORE_FACTOR` of them where a test
sets its count with it (the heaviest tests do: the suite stays well under a minute).
"""

import os

from hypothesis import settings

settings.register_profile("unit", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "unit")
settings.load_profile(PROFILE)
EXPLORE_FACTOR = 10


def examples(count: int) -> int:
    """A property test's example count: ``count`` in the unit suite, more when exploring."""
    return count * EXPLORE_FACTOR if PROFILE == "explore" else count
