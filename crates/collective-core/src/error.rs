//! Typed errors. Each validation failure is its own variant whose message names the argument
//! and what was expected; when one is returned, nothing was written to the output.
use crate::bootstrap::BootstrapError;
use crate::{DType, Op, Signature};
use std::time::Duration;

/// Everything a collective can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "world size {world} is not supported here: expected 1 to 8 ranks in one node (IPC, the device's tree), \
         1 to 4096 across nodes"
    )]
    UnsupportedWorldSize { world: usize },
    #[error("{op} does not reduce {dtype}: expected f32, f16 or bf16")]
    UnsupportedDtype { op: Op, dtype: DType },
    #[error("{op}: `{argument}` is {got} but `{reference}` is {expected}; they must match")]
    DtypeMismatch { op: Op, argument: &'static str, got: DType, reference: &'static str, expected: DType },
    #[error("{op}: `{argument}` has {got} elements, expected {expected} ({why})")]
    LengthMismatch { op: Op, argument: &'static str, expected: usize, got: usize, why: &'static str },
    #[error("{op}: `{argument}` has {len} elements, which does not divide into {world} equal shards")]
    NotDivisible { op: Op, argument: &'static str, len: usize, world: usize },
    #[error("{op}: `{argument}` address {addr:#x} is not aligned to its element size {align}")]
    Misaligned { op: Op, argument: &'static str, addr: u64, align: usize },
    /// A view whose byte length or end address does not fit in 64 bits (only raw views can
    /// claim such lengths).
    #[error("{op}: `{argument}` of {len} elements ends beyond the address space")]
    SizeOverflow { op: Op, argument: &'static str, len: usize },
    #[error("{op}: input and output overlap; use the in-place form instead")]
    Overlap { op: Op },
    /// Two arguments of a call with several buffers (the fused all_reduce + residual +
    /// RMSNorm) share memory in a way the call cannot evaluate correctly.
    #[error("{op}: {first} and {second} overlap; they must be separate buffers")]
    ArgumentsOverlap { op: Op, first: &'static str, second: &'static str },
    /// A view built from a host slice (`Io::host`, `RawRef::host`, `RawMut::host`) given to a
    /// collective whose kernels read device memory: they would dereference a host address
    /// after the slice's borrow ended (calls are asynchronous). Nothing was enqueued.
    #[error(
        "{op}: `{argument}` is a host slice (`Io::host`, `RawRef::host`), but this collective's kernels read device \
         memory: pass device buffers (the typed cudarc entry points, or views of device addresses)"
    )]
    HostMemory { op: Op, argument: &'static str },
    /// An argument that is not a buffer (a shape, a constant) is out of its range.
    #[error("{op}: {argument} {detail}")]
    InvalidArgument { op: Op, argument: &'static str, detail: String },
    /// Two lanes of one `reduce_scatter_many` call share memory that one of them writes (in
    /// place or not: a lane's output must not overlap another lane's input or output).
    #[error(
        "{op}: lanes[{lane}] and lanes[{other}] overlap: a lane's output must not share memory with another lane's input or output"
    )]
    LanesOverlap { op: Op, lane: usize, other: usize },
    #[error("{op}: this rank would stage {needed} bytes but the collective's capacity is {capacity} bytes")]
    CapacityExceeded { op: Op, needed: usize, capacity: usize },
    #[error("reduce_scatter_many: {lanes} lanes given, at most {max} supported")]
    TooManyLanes { lanes: usize, max: usize },
    #[error("the collective is closed")]
    Closed,
    /// `close()` again after a close that failed: the first failure.
    #[error("an earlier close of this collective failed: {cause}")]
    CloseFailed { cause: String },
    /// The handle was created by another process: this one is a fork of it. A forked child
    /// must build its own collective; the handle touches nothing shared from here.
    #[error(
        "this collective was created by process {owner}; process {pid} (a fork of it) cannot use it: build a collective in this process"
    )]
    ForkedHandle { owner: u32, pid: u32 },
    #[error("the collective is poisoned by an earlier failure: {cause}")]
    Poisoned { cause: String },
    #[error("rank {peer} did not {what} within {waited:?}")]
    PeerTimeout { peer: usize, what: &'static str, waited: Duration },
    /// The peer's process (or its memory) is gone.
    #[error("rank {peer} is gone: {detail}")]
    PeerDied { peer: usize, detail: String },
    /// The peer is alive but stopped taking part after a failure of its own (it timed out on a
    /// rank, saw a mismatch, lost a peer): its own error names the cause; `detail` says which.
    /// This rank's call cannot complete, so the collective is poisoned too.
    #[error("rank {peer} stopped after a failure of its own: {detail}")]
    PeerFailed { peer: usize, detail: String },
    /// The peer closed its handle (or dropped it) while this rank still makes calls.
    #[error("rank {peer} has closed the collective; this rank cannot {what}")]
    PeerClosed { peer: usize, what: &'static str },
    /// Memory the collective needs could not be reserved (e.g. a full `/dev/shm`).
    #[error("out of memory: {what} needs {bytes} bytes: {source}")]
    OutOfMemory {
        what: String,
        bytes: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", signature_mismatch(*peer, ours, theirs))]
    SignatureMismatch { peer: usize, ours: Signature, theirs: Signature },
    #[error("ranks disagree on the collective's configuration: {detail}")]
    ConfigMismatch { detail: String },
    #[error("invalid configuration: {detail}")]
    InvalidConfig { detail: String },
    #[error("{library} could not be loaded: {detail}")]
    LibraryMissing { library: String, detail: String },
    #[error("{backend}: {detail}")]
    Backend { backend: &'static str, detail: String },
    /// A GPU runtime or library call failed; the vendor's own error (cudarc's `DriverError`,
    /// the HIP runtime's, NCCL/RCCL's) is the [`std::error::Error::source`].
    #[error("{backend}: {call} failed: {source}")]
    Vendor {
        backend: &'static str,
        call: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
}

/// The text of [`Error::SignatureMismatch`]: the two calls, and where they differ only in
/// their `split`, what that is likely to mean (most often: the ranks are out of step).
fn signature_mismatch(peer: usize, ours: &Signature, theirs: &Signature) -> String {
    let same_call = Signature { split: 0, ..*ours } == Signature { split: 0, ..*theirs };
    let why = if same_call && ours.split != theirs.split {
        ": the same call signed differently, so the ranks are out of step (a rank refused a call its peers \
         made, for a bad argument of its own, or made one they did not) or disagree on a fused RMSNorm's \
         hidden or eps, or on the call a part belongs to"
    } else {
        ""
    };
    format!(
        "rank {peer} called {theirs} while this rank called {ours}{why}; all ranks must make the same calls in the \
         same order"
    )
}

impl Error {
    /// The rank this error blames, if any: a peer that timed out, died, stopped, closed or made
    /// another call, or the rank a bootstrap failure names ([`BootstrapError::culprit`]).
    pub fn culprit(&self) -> Option<usize> {
        match self {
            Error::PeerTimeout { peer, .. }
            | Error::PeerDied { peer, .. }
            | Error::PeerFailed { peer, .. }
            | Error::PeerClosed { peer, .. }
            | Error::SignatureMismatch { peer, .. } => Some(*peer),
            Error::Bootstrap(b) => b.culprit(),
            _ => None,
        }
    }

    /// The error with every peer rank it names renamed by `rank`: for an error of a smaller
    /// collective a composed one runs (the hierarchical route's collective inside a node, its
    /// transport across nodes), `rank` maps that collective's ranks to the world's, so the
    /// message names the rank the user's world knows. Text carried from earlier failures
    /// (`Poisoned`, `CloseFailed`) is left as it is.
    pub fn map_ranks(self, rank: impl Fn(usize) -> usize) -> Error {
        match self {
            Error::PeerTimeout { peer, what, waited } => Error::PeerTimeout { peer: rank(peer), what, waited },
            Error::PeerDied { peer, detail } => Error::PeerDied { peer: rank(peer), detail },
            Error::PeerFailed { peer, detail } => Error::PeerFailed { peer: rank(peer), detail },
            Error::PeerClosed { peer, what } => Error::PeerClosed { peer: rank(peer), what },
            Error::SignatureMismatch { peer, ours, theirs } => {
                Error::SignatureMismatch { peer: rank(peer), ours, theirs }
            }
            Error::Bootstrap(b) => Error::Bootstrap(b.map_ranks(rank)),
            other => other,
        }
    }

    /// The error as a reason inside another `InvalidConfig`: an `InvalidConfig`'s detail alone
    /// (the outer message says "invalid configuration" once), any other error's message.
    pub fn config_reason(&self) -> String {
        match self {
            Error::InvalidConfig { detail } => detail.clone(),
            e => e.to_string(),
        }
    }

    /// Whether this error means the protocol state is unknown, so the collective must be poisoned.
    pub fn poisons(&self) -> bool {
        matches!(
            self,
            Error::PeerTimeout { .. }
                | Error::PeerDied { .. }
                | Error::PeerFailed { .. }
                | Error::PeerClosed { .. }
                | Error::SignatureMismatch { .. }
                | Error::Backend { .. }
                | Error::Vendor { .. }
                | Error::Bootstrap(_)
        )
    }
}

/// `e` with its whole `source()` chain, `": "`-separated: for errors whose `Display` leaves the
/// cause to `source()` (libloading's is only "dlopen failed"; the loader's reason, such as
/// "invalid ELF header", is its source) where the text goes into a message of its own.
pub fn display_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod chain_tests {
    use super::display_chain;
    use std::fmt;

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("dlopen failed")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("libcuda.so: invalid ELF header")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    impl std::error::Error for Inner {}

    #[test]
    fn the_chain_keeps_the_cause() {
        assert_eq!(display_chain(&Outer(Inner)), "dlopen failed: libcuda.so: invalid ELF header");
        assert_eq!(display_chain(&Inner), "libcuda.so: invalid ELF header");
    }
}
