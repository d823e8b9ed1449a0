//! What a collective honestly supports.

/// The reduction order every backend evaluates, as reported in bench output.
pub const REDUCTION_ORDER: &str = "((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))";

/// What a collective supports. Reported honestly: a capability is `true` only when a mode
/// exists and is tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Every reduction evaluates the fixed balanced rank tree in the element's dtype.
    pub strict_fixed_order: bool,
    /// Communication overlapping independent compute on another stream with a strictness proof.
    pub supports_async_overlap: bool,
    /// Fused GEMM + collective kernels.
    pub supports_compute_communication_fusion: bool,
    /// Calls may be captured into a CUDA/HIP graph and replayed.
    pub supports_graph_capture: bool,
    /// Staging bytes per frame: on the IPC backends a performance and memory knob (larger
    /// calls run in chunks of it), on a backend that cannot chunk the largest call too.
    pub capacity_bytes: usize,
    /// The most bytes one rank may contribute to one call without `Error::CapacityExceeded`;
    /// `usize::MAX`: any size. Backends may accept some larger calls (the transport's
    /// `all_gather`), but only calls up to this size are promised. Per route: the IPC routes
    /// take any size (chunks of `capacity_bytes`), the transport route its capacity; a
    /// collective that routes calls by size (the factory's) reports the smallest limit of the
    /// routes its calls can take, so `usize::MAX` there means no route has a limit.
    pub max_call_bytes: usize,
}

impl Capabilities {
    /// Capabilities of a strict collective with `capacity_bytes` of staging, which also bounds
    /// its calls (`max_call_bytes`; see [`Capabilities::with_max_call_bytes`]).
    pub const fn strict(capacity_bytes: usize, supports_graph_capture: bool) -> Self {
        Capabilities {
            strict_fixed_order: true,
            supports_async_overlap: false,
            supports_compute_communication_fusion: false,
            supports_graph_capture,
            capacity_bytes,
            max_call_bytes: capacity_bytes,
        }
    }

    /// These capabilities with calls of up to `bytes` per rank (`usize::MAX`: any size, for
    /// backends that chunk calls through their staging).
    pub const fn with_max_call_bytes(self, bytes: usize) -> Self {
        Capabilities { max_call_bytes: bytes, ..self }
    }
}
