"""What both daemons (``twistd iop-edge``, ``twistd iop-node``) share as processes, and neither
side's code: how a failure to start is told (:mod:`iop.daemon.errors`)."""
