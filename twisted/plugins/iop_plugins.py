from iop.daemon.errors import DaemonMaker

# DaemonMaker: twistd's ServiceMaker, but every startup failure is one or two plain lines.
iop_edge = DaemonMaker(
    "IOP Edge", "iop.edge.tap", "IOP edge gateway: node listener and admin", "iop-edge"
)
iop_node = DaemonMaker(
    "IOP Node", "iop.node.tap", "IOP node: dials its Edge and runs providers", "iop-node"
)
