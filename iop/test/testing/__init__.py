"""Tests for the shared test fakes in iop.testing."""
