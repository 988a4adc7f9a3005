"""Tests for the Node adapters."""
