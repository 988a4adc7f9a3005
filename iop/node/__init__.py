"""
The Node daemon: dials out to its Edge, registers with a token, receives its whole runtime
configuration and serves it.

- :mod:`iop.node.transport`: the Edge socket (framing, heartbeat, register/ready handshake).
- :mod:`iop.node.supervisor`: one reconnect loop for the initial dial and every re-dial.
- :mod:`iop.node.adapters`: the adapter-instance registry built from ``NodeConfigPayload``.
"""
