//! Construction-time agreement through the bootstrap.
//!
//! Every decision that makes ranks issue different NCCL calls would deadlock or corrupt, so
//! it is taken collectively:
//!
//! * [`agree`]: every rank says whether it is ready (library loaded, device side built) and,
//!   if so, its library version and the configuration words that shape its calls. All ranks
//!   get everyone's answer and take the same decision: go, or every rank fails with an error
//!   naming the ranks and the reason. A rank that failed locally returns its own error.
//! * [`share_unique_id`]: rank 0 creates the NCCL unique id; everyone receives it, or rank 0's
//!   failure as an error.
use crate::error::NcclError;
use crate::sys::{NCCL_UNIQUE_ID_BYTES, ncclUniqueId};
use crate::version::Version;
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;

/// What a ready rank announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub version: Version,
    /// Configuration every rank must share, with names for messages.
    pub words: Vec<(&'static str, u64)>,
}

const READY: u8 = 1;
const FAILED: u8 = 0;

/// `[1][version i32][n u32][n x u64]` for a ready rank, `[0][utf-8 reason]` otherwise.
pub(crate) fn encode_hello(local: Result<&Hello, &str>) -> Vec<u8> {
    match local {
        Ok(h) => {
            let mut v = vec![READY];
            v.extend_from_slice(&h.version.code().to_le_bytes());
            v.extend_from_slice(&(h.words.len() as u32).to_le_bytes());
            for (_, w) in &h.words {
                v.extend_from_slice(&w.to_le_bytes());
            }
            v
        }
        Err(reason) => {
            let mut v = vec![FAILED];
            v.extend_from_slice(reason.as_bytes());
            v
        }
    }
}

/// What a rank said: `(version code, words)` or its reason for not being ready.
fn decode_hello(b: &[u8]) -> Result<(i32, Vec<u64>), String> {
    match b.split_first() {
        Some((&READY, rest)) if rest.len() >= 8 => {
            let version = i32::from_le_bytes(rest[..4].try_into().unwrap_or_default());
            let n = u32::from_le_bytes(rest[4..8].try_into().unwrap_or_default()) as usize;
            let body = &rest[8..];
            if body.len() != n * 8 {
                return Err(format!("malformed announcement ({} bytes)", b.len()));
            }
            Ok((version, body.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect()))
        }
        Some((&FAILED, reason)) => Err(String::from_utf8_lossy(reason).into_owned()),
        _ => Err(format!("malformed announcement ({} bytes)", b.len())),
    }
}

/// The decision every rank takes from every rank's announcement (`all[q]` from rank `q`) and
/// this rank's word names: `Ok` when all are ready and, with `check`, run one version with
/// equal words (`check` false: a composer's agreement compared those already).
pub(crate) fn decide(all: &[Vec<u8>], names: &[&'static str], check: bool) -> Result<(), String> {
    let decoded: Vec<Result<(i32, Vec<u64>), String>> = all.iter().map(|b| decode_hello(b)).collect();
    let failed: Vec<String> =
        decoded.iter().enumerate().filter_map(|(q, d)| d.as_ref().err().map(|e| format!("rank {q}: {e}"))).collect();
    if !failed.is_empty() {
        return Err(format!("the NCCL/RCCL transport cannot be built: {}", failed.join("; ")));
    }
    let ok: Vec<&(i32, Vec<u64>)> = decoded.iter().filter_map(|d| d.as_ref().ok()).collect();
    let Some(first) = ok.first().filter(|_| check) else { return Ok(()) };
    let mut problems = Vec::new();
    for (q, (version, words)) in ok.iter().enumerate().skip(1) {
        if *version != first.0 {
            problems.push(format!(
                "rank {q} runs NCCL/RCCL {} but rank 0 runs {} (every rank must load the same version)",
                Version::from_code(*version),
                Version::from_code(first.0)
            ));
        }
        if words.len() != first.1.len() {
            problems.push(format!("rank {q} announces {} configuration words, rank 0 {}", words.len(), first.1.len()));
            continue;
        }
        for (i, (a, b)) in first.1.iter().zip(words).enumerate() {
            if a != b {
                let name = names.get(i).copied().unwrap_or("configuration word");
                problems.push(format!("rank {q} has {name} = {b} but rank 0 has {a}"));
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// Collective readiness check. `local` is this rank's outcome (the thing it built and its
/// announcement, or its error). Returns the built thing when every rank is ready and (with
/// `check`) agrees; otherwise every rank fails (this rank's own error if it failed, else
/// `ConfigMismatch`). With `check` false a rank that failed locally still fails every rank at
/// once with its reason.
pub(crate) fn agree<T>(boot: &dyn Bootstrap, local: Result<(T, Hello), Error>, check: bool) -> Result<T, Error> {
    let (names, mine) = match &local {
        Ok((_, h)) => (h.words.iter().map(|(n, _)| *n).collect::<Vec<_>>(), encode_hello(Ok(h))),
        Err(e) => (Vec::new(), encode_hello(Err(&e.to_string()))),
    };
    let all = boot.all_gather_bytes(&mine)?;
    let (thing, _) = local?;
    decide(&all, &names, check).map_err(|detail| Error::ConfigMismatch { detail })?;
    Ok(thing)
}

/// `[1][128-byte id]` or `[0][utf-8 reason]`.
pub(crate) fn encode_id(id: Result<&ncclUniqueId, &str>) -> Vec<u8> {
    match id {
        Ok(id) => {
            let mut v = vec![READY];
            v.extend_from_slice(&id.to_bytes());
            v
        }
        Err(reason) => {
            let mut v = vec![FAILED];
            v.extend_from_slice(reason.as_bytes());
            v
        }
    }
}

/// The id rank 0 sent, or its failure as an error.
pub(crate) fn decode_id(b: &[u8]) -> Result<ncclUniqueId, Error> {
    match b.split_first() {
        Some((&READY, id)) => ncclUniqueId::from_bytes(id).ok_or_else(|| Error::ConfigMismatch {
            detail: format!("rank 0 sent an NCCL unique id of {} bytes, expected {NCCL_UNIQUE_ID_BYTES}", id.len()),
        }),
        Some((&FAILED, reason)) => Err(Error::ConfigMismatch {
            detail: format!("rank 0 could not create the NCCL unique id: {}", String::from_utf8_lossy(reason)),
        }),
        _ => Err(Error::ConfigMismatch {
            detail: format!("rank 0 sent a malformed NCCL unique id message ({} bytes)", b.len()),
        }),
    }
}

/// Rank 0 calls `create`; its id (or failure) reaches every rank through one
/// `all_gather_bytes`. Collective.
pub(crate) fn share_unique_id(
    boot: &dyn Bootstrap,
    create: impl FnOnce() -> Result<ncclUniqueId, NcclError>,
) -> Result<ncclUniqueId, Error> {
    let (mine, own_error) = if boot.rank() == 0 {
        match create() {
            Ok(id) => (encode_id(Ok(&id)), None),
            Err(e) => (encode_id(Err(&e.to_string())), Some(e)),
        }
    } else {
        (Vec::new(), None)
    };
    let all = boot.all_gather_bytes(&mine)?;
    if let Some(e) = own_error {
        return Err(e.into());
    }
    let first = all
        .first()
        .ok_or_else(|| Error::ConfigMismatch { detail: "the bootstrap returned no contribution from rank 0".into() })?;
    decode_id(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::bootstrap::LocalBootstrap;

    fn hello(version: i32, words: &[u64]) -> Hello {
        const NAMES: [&str; 4] = ["capacity", "pack_threshold", "all_to_all_threshold", "blocking"];
        Hello {
            version: Version::from_code(version),
            words: words.iter().enumerate().map(|(i, w)| (NAMES[i], *w)).collect(),
        }
    }

    fn names() -> Vec<&'static str> {
        hello(0, &[0, 0, 0, 0]).words.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn ready_ranks_that_agree_go() {
        let h = encode_hello(Ok(&hello(22803, &[1 << 20, 65536, u64::MAX, 0])));
        assert_eq!(decide(&[h.clone(), h.clone(), h], &names(), true), Ok(()));
    }

    #[test]
    fn one_failed_rank_fails_everyone_with_its_reason() {
        let ok = encode_hello(Ok(&hello(22803, &[1, 2, 3, 4])));
        let bad = encode_hello(Err("libnccl.so.2 could not be loaded: not found"));
        let e = decide(&[ok.clone(), bad, ok], &names(), true).expect_err("must fail");
        assert!(e.contains("rank 1: libnccl.so.2 could not be loaded"), "{e}");
    }

    #[test]
    fn version_and_config_mismatches_are_named() {
        let a = encode_hello(Ok(&hello(22803, &[1, 2, 3, 4])));
        let b = encode_hello(Ok(&hello(22703, &[1, 9, 3, 4])));
        let e = decide(&[a, b], &names(), true).expect_err("must fail");
        assert!(e.contains("rank 1 runs NCCL/RCCL 2.27.3 but rank 0 runs 2.28.3"), "{e}");
        assert!(e.contains("rank 1 has pack_threshold = 9 but rank 0 has 2"), "{e}");
        assert!(decide(&[vec![7, 7]], &names(), true).is_err());
    }

    #[test]
    fn unique_id_bytes_round_trip_through_the_message() {
        let bytes: Vec<u8> = (0..128u8).map(|i| i.wrapping_mul(151)).collect();
        let id = ncclUniqueId::from_bytes(&bytes).expect("128 bytes");
        let back = decode_id(&encode_id(Ok(&id))).expect("decodes");
        assert_eq!(back.to_bytes().as_slice(), bytes.as_slice());
        assert!(
            matches!(decode_id(&encode_id(Err("no network"))), Err(Error::ConfigMismatch { detail }) if detail.contains("no network"))
        );
        assert!(decode_id(&[1, 2, 3]).is_err());
        assert!(decode_id(&[]).is_err());
    }

    #[test]
    fn threads_share_rank_zeros_id_or_its_failure() {
        let id = ncclUniqueId::from_bytes(&[0xAB; 128]).expect("id");
        let got: Vec<Result<ncclUniqueId, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = LocalBootstrap::group(4)
                .into_iter()
                .map(|b| s.spawn(move || share_unique_id(&b, || Ok(id)).map_err(|e| e.to_string())))
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(got.iter().all(|r| r.as_ref().is_ok_and(|x| *x == id)), "{got:?}");

        let got: Vec<Result<ncclUniqueId, Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = LocalBootstrap::group(2)
                .into_iter()
                .map(|b| s.spawn(move || share_unique_id(&b, || Err(NcclError::Unusable("test")))))
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(matches!(got[0], Err(Error::Backend { .. })), "{:?}", got[0]);
        assert!(
            matches!(&got[1], Err(Error::ConfigMismatch { detail }) if detail.contains("rank 0 could not create")),
            "{:?}",
            got[1]
        );
    }

    #[test]
    fn agree_returns_the_local_error_or_a_mismatch() {
        let got: Vec<Result<u32, Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = LocalBootstrap::group(3)
                .into_iter()
                .map(|b| {
                    s.spawn(move || {
                        let local = if b.rank() == 2 {
                            Err(Error::LibraryMissing { library: "libnccl.so.2".into(), detail: "absent".into() })
                        } else {
                            Ok((b.rank() as u32, hello(22803, &[1, 2, 3, 4])))
                        };
                        agree(&b, local, true)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(matches!(&got[0], Err(Error::ConfigMismatch { detail }) if detail.contains("rank 2")), "{:?}", got[0]);
        assert!(matches!(&got[1], Err(Error::ConfigMismatch { .. })));
        assert!(matches!(&got[2], Err(Error::LibraryMissing { .. })));
    }
}
