"""`monarch.rdma` on xmesh: Monarch's RDMA buffers (xmesh.rdma; README "RDMA buffers" says
where xmesh differs)."""
from xmesh.rdma import (  # noqa: F401
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)

__all__ = [
    "RDMAAction", "RDMABuffer", "RDMAReadTransferWarning", "RDMATcpFallbackWarning", "RDMAWriteTransferWarning",
    "get_rdma_backend", "is_ibverbs_available", "is_rdma_available",
]
