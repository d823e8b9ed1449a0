"""detcoll: bitwise-deterministic collectives for PyTorch, numpy and CuPy.

Every reduction evaluates one fixed balanced rank tree, ``((r0 + r1) + (r2 + r3)) + ...``, in
the tensor's own dtype (f32, f16, bf16), so the bits are identical on every rank, run, route
and message size, and TP-invariant layers give the same bits at every TP size.

    import detcoll
    comm = detcoll.create_deterministic_collective(group=None, capacity=None, device=None)
    comm.all_reduce(x)                   # in place
    y = comm.all_gather(x)               # world_size * x along dim 0
    s = comm.reduce_scatter(x)           # this rank's shard of the tree
    comm.synchronize()                   # then read (CUDA calls are asynchronous)
"""

from ._detcoll import (  # noqa: F401  (the exception classes: one per Rust Error variant)
    BackendError,
    BootstrapError,
    CapacityExceeded,
    Closed,
    CloseFailed,
    ConfigMismatch,
    DetcollError,
    DtypeMismatch,
    ForkedHandle,
    InvalidArgument,
    InvalidConfig,
    LanesOverlap,
    LengthMismatch,
    LibraryMissing,
    Misaligned,
    NotContiguous,
    NotDivisible,
    OutOfMemory,
    Overlap,
    PeerClosed,
    PeerDied,
    PeerError,
    PeerFailed,
    PeerTimeout,
    Poisoned,
    SignatureMismatch,
    SizeOverflow,
    TooManyLanes,
    UnsupportedDtype,
    UnsupportedWorldSize,
    WrongDevice,
    __version__,
)
from .collective import Collective  # noqa: F401
from .factory import create_deterministic_collective, thread_group  # noqa: F401

__all__ = ["Collective", "create_deterministic_collective", "thread_group", "DetcollError"]
