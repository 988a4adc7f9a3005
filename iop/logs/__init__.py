# -*- test-case-name: iop.test.logs -*-
"""
How both daemons write their log (``logging:`` in edge.yaml and node.yaml): the JSON-lines
format (:mod:`iop.logs.jsonlines`), the observer installed under twistd with its level
filter (:mod:`iop.logs.twistd`), and :mod:`iop.logs.limiter` for lines that may come in a
flood. Side-neutral: imports neither ``iop.edge`` nor ``iop.node``.
"""
