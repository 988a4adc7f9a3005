"""Tests for the side-neutral formats (iop.formats)."""
