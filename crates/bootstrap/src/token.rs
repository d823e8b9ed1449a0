//! Job identity of the TCP rendezvous: SHA-256 / HMAC-SHA256 (a small, dependency-free
//! implementation: the bootstrap only needs a keyed digest of 60 bytes per handshake), nonces,
//! token validation and derivation.
//!
//! The job token never crosses the wire. Rank 0 sends every new connection a random nonce
//! (its *challenge*); a rank answers with `HMAC-SHA256(token, context || nonce || rank ||
//! world)`. Rank 0 recomputes it and compares in constant time. A stranger therefore learns
//! nothing from rank 0 (which never echoes anything but a fresh nonce), and a rank that
//! connects to another job's rank 0 reveals only a MAC over that rank 0's own nonce, which
//! cannot be replayed to its real rank 0 (whose nonces differ).

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Longest accepted job token, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;
/// Length of a nonce and of a MAC.
pub(crate) const DIGEST_LEN: usize = 32;

/// Domain separation of the handshake MAC (a MAC of this protocol is not valid elsewhere).
const HELLO_CONTEXT: &[u8] = b"detcoll-bootstrap-hello-v2\0";

/// Why a token is unusable (empty or longer than [`MAX_TOKEN_LEN`]).
pub(crate) fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("the job token is empty".to_owned());
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(format!("the job token is {} bytes long; at most {MAX_TOKEN_LEN} are accepted", token.len()));
    }
    Ok(())
}

/// A token derived from public facts of the job (`parts`, e.g. the torchelastic run id and the
/// port). It separates jobs that differ in these facts; it is no secret.
pub(crate) fn derive_token(kind: &str, parts: &[&str]) -> String {
    let mut msg = Vec::new();
    msg.extend_from_slice(b"detcoll-job-token-v1\0");
    msg.extend_from_slice(kind.as_bytes());
    for p in parts {
        msg.push(0);
        // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        msg.extend_from_slice(&(p.len() as u64).to_le_bytes());
        msg.extend_from_slice(p.as_bytes());
    }
    hex(&sha256(&msg))
}

/// The MAC a rank sends in its hello.
pub(crate) fn hello_mac(token: &str, nonce: &[u8; DIGEST_LEN], rank: u64, world: u64) -> [u8; DIGEST_LEN] {
    let mut msg = Vec::with_capacity(HELLO_CONTEXT.len() + DIGEST_LEN + 16);
    msg.extend_from_slice(HELLO_CONTEXT);
    msg.extend_from_slice(nonce);
    msg.extend_from_slice(&rank.to_le_bytes());
    msg.extend_from_slice(&world.to_le_bytes());
    hmac_sha256(token.as_bytes(), &msg)
}

/// Constant-time equality (no early exit on the first differing byte), so the time rank 0
/// takes to drop a hello does not reveal how much of a MAC was right.
pub(crate) fn ct_eq(a: &[u8; DIGEST_LEN], b: &[u8; DIGEST_LEN]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// 32 random bytes: `getrandom(2)`, else `/dev/urandom`, else (neither available) a digest of
/// the time, the process id and a counter, which is still unique per challenge. Nonces need to
/// be unpredictable to strangers only so that a recorded answer cannot be replayed.
pub(crate) fn nonce() -> [u8; DIGEST_LEN] {
    let mut out = [0u8; DIGEST_LEN];
    if fill_random(&mut out) {
        return out;
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut msg = Vec::new();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    msg.extend_from_slice(&now.to_le_bytes());
    msg.extend_from_slice(&std::process::id().to_le_bytes());
    msg.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    msg.extend_from_slice(&(&out as *const _ as usize).to_le_bytes());
    sha256(&msg)
}

fn fill_random(buf: &mut [u8]) -> bool {
    #[cfg(target_os = "linux")]
    {
        let mut filled = 0usize;
        while filled < buf.len() {
            let rest = &mut buf[filled..];
            // SAFETY: `rest` is a live, exclusively borrowed buffer of `rest.len()` writable
            // bytes for the whole call; getrandom(2) writes at most that many.
            let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            filled += n as usize;
        }
        if filled == buf.len() {
            return true;
        }
    }
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(buf)).is_ok()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

// ---- SHA-256 (FIPS 180-4) and HMAC (RFC 2104) ----

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
];

pub(crate) fn sha256(data: &[u8]) -> [u8; DIGEST_LEN] {
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let bit_len = (data.len() as u64).wrapping_mul(8);
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, v) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(v);
        }
    }
    let mut out = [0u8; DIGEST_LEN];
    for (o, x) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&x.to_be_bytes());
    }
    out
}

pub(crate) fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; DIGEST_LEN] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..DIGEST_LEN].copy_from_slice(&sha256(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Vec::with_capacity(64 + msg.len());
    inner.extend(k.iter().map(|b| b ^ 0x36));
    inner.extend_from_slice(msg);
    let mut outer = Vec::with_capacity(64 + DIGEST_LEN);
    outer.extend(k.iter().map(|b| b ^ 0x5c));
    outer.extend_from_slice(&sha256(&inner));
    sha256(&outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_vectors() {
        assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            hex(&sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn hmac_vectors() {
        // RFC 4231 test cases 1 and 2, and 6 (key longer than a block).
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn tokens() {
        assert!(check_token("").is_err());
        assert!(check_token(&"x".repeat(MAX_TOKEN_LEN)).is_ok());
        assert!(check_token(&"x".repeat(MAX_TOKEN_LEN + 1)).is_err());
        assert_ne!(derive_token("k", &["ab", "c"]), derive_token("k", &["a", "bc"]));
        assert_eq!(derive_token("k", &["a"]), derive_token("k", &["a"]));
        let n = [7u8; DIGEST_LEN];
        let a = hello_mac("t1", &n, 1, 2);
        assert!(ct_eq(&a, &hello_mac("t1", &n, 1, 2)));
        assert!(!ct_eq(&a, &hello_mac("t2", &n, 1, 2)));
        assert!(!ct_eq(&a, &hello_mac("t1", &n, 2, 2)));
        assert_ne!(nonce(), nonce());
    }
}
