"""Unit tests (trial): deterministic, no real network."""
