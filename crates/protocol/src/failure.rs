//! A construction step that failed on one rank, sent to the others in place of that step's
//! message, so every rank of a collective construction returns at once with an error of the
//! same kind instead of waiting for the bootstrap's timeout (the way the exchanges of
//! `IpcCollective::new` and the factory's agreement fail).
use collective_core::Error;

/// First byte of a step's message: what follows is this rank's payload.
const OK: u8 = b'+';
/// First byte of a step's message: what follows is this rank's failure.
const FAILED: u8 = b'!';

/// The message of a step: `payload` when it succeeded, else the failure.
pub fn encode(step: Result<Vec<u8>, &Error>) -> Vec<u8> {
    match step {
        Ok(payload) => {
            let mut m = Vec::with_capacity(payload.len() + 1);
            m.push(OK);
            m.extend_from_slice(&payload);
            m
        }
        Err(e) => {
            let (kind, bytes, errno, msg) = match e {
                Error::OutOfMemory { what, bytes, source } => {
                    ("oom", *bytes, source.raw_os_error().unwrap_or(0), what.clone())
                }
                Error::InvalidConfig { detail } => ("invalid", 0, 0, detail.clone()),
                Error::ConfigMismatch { detail } => ("mismatch", 0, 0, detail.clone()),
                other => ("other", 0, 0, other.to_string()),
            };
            let mut m = vec![FAILED];
            m.extend_from_slice(format!("{kind}\n{bytes}\n{errno}\n{msg}").as_bytes());
            m
        }
    }
}

/// Every rank's payload of a step, or the first failure (in rank order) rebuilt as this rank's
/// error naming the rank that failed. A message that is neither is `Backend` (`backend`).
pub fn decode(all: Vec<Vec<u8>>, backend: &'static str) -> Result<Vec<Vec<u8>>, Error> {
    if let Some(e) = all.iter().enumerate().find_map(|(q, m)| failure(q, m, backend)) {
        return Err(e);
    }
    all.into_iter()
        .enumerate()
        .map(|(q, mut m)| {
            if m.first() != Some(&OK) {
                return Err(Error::Backend {
                    backend,
                    detail: format!("rank {q} sent an unreadable construction message"),
                });
            }
            m.remove(0);
            Ok(m)
        })
        .collect()
}

fn failure(q: usize, m: &[u8], backend: &'static str) -> Option<Error> {
    let (&first, rest) = m.split_first()?;
    if first != FAILED {
        return None;
    }
    let text = String::from_utf8_lossy(rest);
    let mut it = text.splitn(4, '\n');
    let kind = it.next().unwrap_or("other");
    let bytes: usize = it.next().and_then(|b| b.parse().ok()).unwrap_or(0);
    let errno: i32 = it.next().and_then(|e| e.parse().ok()).unwrap_or(0);
    let msg = it.next().unwrap_or("");
    Some(match kind {
        "oom" => Error::OutOfMemory {
            what: format!("on rank {q}, {msg}"),
            bytes,
            source: if errno != 0 {
                std::io::Error::from_raw_os_error(errno)
            } else {
                std::io::ErrorKind::OutOfMemory.into()
            },
        },
        "invalid" => Error::InvalidConfig { detail: format!("on rank {q}: {msg}") },
        "mismatch" => Error::ConfigMismatch { detail: format!("seen by rank {q}: {msg}") },
        _ => Error::Backend { backend, detail: format!("rank {q} failed to construct: {msg}") },
    })
}
