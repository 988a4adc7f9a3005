"""Tests for iop.config: edge.yaml and node.yaml loading and validation."""
