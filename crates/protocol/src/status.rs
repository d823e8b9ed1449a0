//! Turning the error record a GPU kernel wrote into a typed [`Error`] (shared by `cuda-ipc` and
//! `hip-ipc`; moved verbatim from `crates/cuda-ipc/src/status.rs`, the backend name became a
//! parameter).
//!
//! Record words (kernels/detcoll_protocol.h, `dc_fail`): `[code, peer, generation, observed flag
//! or peer status, our signature (2 words), their signature (2 words, mismatch only)]`.
use super::FlagWord;
use collective_core::{Error, Signature};
use std::time::Duration;

/// Words of the error record a kernel writes on failure.
pub const RECORD_WORDS: usize = 8;

/// Words of a rank's status line (`DC_ST_*`), as indices of 8-byte words from
/// `Layout::status`: the first error code (compare-and-swap; peers read it), the last completed
/// generation, the blocks of the running call that finished, and the calls that still rewrite
/// every LL line (a generation preset sets it).
pub const ST_ABORT: usize = 0;
pub const ST_GEN: usize = 1;
pub const ST_FINISHED: usize = 2;
pub const ST_REFRESH: usize = 3;

/// `(g >> 1) & LL_EPOCH_MASK == 0` picks the generations (g mod 2^30 in {0, 1}) whose calls
/// rewrite every LL line, so a stale LL word can never carry a current generation (that needs
/// 2^32 calls). The kernels' `DC_LL_EPOCH_MASK`; the CPU twin uses this one.
pub const LL_EPOCH_MASK: u32 = 0x1FFF_FFFF;

pub const ERR_TIMEOUT_READY: u64 = 1;
pub const ERR_TIMEOUT_PHASE2: u64 = 2;
pub const ERR_MISMATCH: u64 = 3;
pub const ERR_CORRUPT: u64 = 4;
pub const ERR_PEER_FAILED: u64 = 5;
pub const ERR_PEER_CLOSED: u64 = 6;
/// Recorded by the host executor only (the CPU twin, `shm-ipc`): the peer's process exited
/// while this rank waited for it (`observed` is its process id). No GPU kernel can see this.
pub const ERR_PEER_EXITED: u64 = 7;
/// Recorded by the host executor only: a shared object this rank reads was truncated under
/// its mapping (the executor's device returns the precise error for the object).
pub const ERR_HOST_FAULT: u64 = 8;
/// Written by the host into a rank's own status word, never into a record
/// (`IpcCollective::abandon`): the rank stopped taking part — after a failure in another part
/// of a composite call (the hierarchical route's step across nodes), or because its caller
/// aborted it — so a peer waiting for it fails at its next poll (`ERR_PEER_FAILED` with this
/// code) rather than at its own bound.
pub const ERR_ABANDONED: u64 = 9;

/// What a peer's status word `code` (the first failure it recorded) says it saw.
fn peer_failure(code: u64) -> String {
    match code {
        ERR_TIMEOUT_READY | ERR_TIMEOUT_PHASE2 => "it timed out waiting for a rank".into(),
        ERR_MISMATCH => "a rank's call differed from its own".into(),
        ERR_CORRUPT => "it found corrupt protocol state".into(),
        ERR_PEER_FAILED => "a rank it waited for had stopped".into(),
        ERR_PEER_CLOSED => "a rank it waited for had closed the collective".into(),
        ERR_PEER_EXITED => "the process of a rank it waited for exited".into(),
        ERR_HOST_FAULT => "a shared-memory object was truncated under it".into(),
        ERR_ABANDONED => {
            "it stopped taking part (abandoned after a failure elsewhere, or aborted by its caller)".into()
        }
        other => format!("error code {other}"),
    }
}

fn describe(w0: u64, w1: u64) -> String {
    Signature::unpack([w0, w1]).map_or_else(|| format!("an unreadable signature [{w0:#x}, {w1:#x}]"), |s| s.to_string())
}

/// The typed error for a nonzero record. `timeout` is the configured per-wait bound; `backend`
/// names the caller in [`Error::Backend`].
pub fn decode(w: &[u64; RECORD_WORDS], timeout: Duration, backend: &'static str) -> Error {
    let (code, peer, generation, observed) = (w[0], w[1] as usize, w[2] as u32, w[3]);
    let ours = Signature::unpack([w[4], w[5]]);
    match code {
        ERR_TIMEOUT_READY => {
            Error::PeerTimeout { peer, what: "publish its ready flag (stage its input)", waited: timeout }
        }
        ERR_TIMEOUT_PHASE2 => Error::PeerTimeout { peer, what: "publish its reduced shard (phase 2)", waited: timeout },
        ERR_MISMATCH => match (ours, Signature::unpack([w[6], w[7]])) {
            (Some(ours), Some(theirs)) => Error::SignatureMismatch { peer, ours, theirs },
            _ => Error::Backend {
                backend,
                detail: format!(
                    "rank {peer} published generation {generation} with signature digest {:#x} while this rank called {} \
                     (their full signature: {})",
                    FlagWord(observed).digest(),
                    describe(w[4], w[5]),
                    describe(w[6], w[7])
                ),
            },
        },
        ERR_CORRUPT => Error::Backend {
            backend,
            detail: format!(
                "rank {peer}'s flag holds generation {} while this rank is at generation {generation}: corrupt protocol state",
                FlagWord(observed).generation()
            ),
        },
        ERR_PEER_FAILED => Error::PeerFailed {
            peer,
            detail: format!(
                "{} (its failure code {observed}; protocol generation {generation}, one per call or chunk)",
                peer_failure(observed)
            ),
        },
        ERR_PEER_CLOSED => Error::PeerClosed { peer, what: "complete a call that needs it" },
        ERR_HOST_FAULT => Error::Backend {
            backend,
            detail: "a shared-memory object was truncated under this rank's mapping during the call".into(),
        },
        ERR_PEER_EXITED => Error::PeerDied {
            peer,
            detail: format!(
                "its process {observed} exited while this rank waited for it (protocol generation {generation}, one per call or chunk)"
            ),
        },
        other => Error::Backend { backend, detail: format!("unknown error code {other} in the device error record") },
    }
}
