"""
Unit tests (trial): deterministic, no real network.

Property tests (hypothesis) run derandomized and without an example database, so every run
explores the same examples. To explore fresh ones locally: ``HYPOTHESIS_PROFILE=explore trial
iop``.
"""

import os

from hypothesis import settings

settings.register_profile("unit", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "unit"))
