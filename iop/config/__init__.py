# -*- test-case-name: iop.test.config -*-
"""
Typed configuration for ``iop-edge`` (edge.yaml) and ``iop-node`` (node.yaml).

``load_*_config(path)`` reads a YAML file; ``parse_*_config(data, base_dir=..., environ=...)``
validates already-loaded data. Both return frozen objects from :mod:`iop.config.model` or raise
:class:`ConfigError` listing every problem found.
"""

from iop.config.edge import load_edge_config, parse_edge_config
from iop.config.errors import ConfigError, ConfigIssue
from iop.config.node import load_node_config, parse_node_config

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "load_edge_config",
    "load_node_config",
    "parse_edge_config",
    "parse_node_config",
]
