# -*- test-case-name: iop.test.logs -*-
"""
How both daemons write their log (``logging:`` in edge.yaml and node.yaml): the JSON-lines
format (:mod:`iop.logs.jsonlines`) and the observer installed under twistd with its level
filter (:mod:`iop.logs.twistd`). Side-neutral: imports neither ``iop.edge`` nor ``iop.node``.
"""
