"""
The ``iop`` operator command: one module per command group, each with a ``register(subparsers)``
that adds its subcommands (:mod:`iop.cli.pki`, :mod:`iop.cli.keys`); :mod:`iop.cli.main` puts
them together; :mod:`iop.cli.command` is what every command shares (its error, its report of
what went where).
"""
