"""Tests for the Node daemon: adapter registry, Edge transport, supervisor."""
