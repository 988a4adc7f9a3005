from twisted.application.service import ServiceMaker

iop_edge = ServiceMaker(
    "IOP Edge", "iop.edge.tap", "IOP edge gateway: node listener and admin", "iop-edge"
)
iop_node = ServiceMaker(
    "IOP Node", "iop.node.tap", "IOP node: dials its Edge and runs providers", "iop-node"
)
