from twisted.application.service import ServiceMaker

iopEdge = ServiceMaker(
    "IOP Edge", "iop.edge.tap", "IOP edge gateway: node listener and admin", "iop-edge"
)
iopNode = ServiceMaker(
    "IOP Node", "iop.node.tap", "IOP node: dials its Edge and runs providers", "iop-node"
)
