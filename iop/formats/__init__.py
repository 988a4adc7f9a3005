"""
Side-neutral stream and payload formats that both the Edge and the Node read: Server-Sent
Events (:mod:`iop.formats.sse`), newline-delimited JSON (:mod:`iop.formats.ndjson`), the usage a
provider reports (:mod:`iop.formats.usage`) and the message of an upstream error body
(:mod:`iop.formats.errors`).

Nothing here imports :mod:`iop.edge`, :mod:`iop.node` or :mod:`iop.wire`: it is pure parsing
into the runtime vocabulary (:mod:`iop.runtime`).
"""
