//! Wire format of the TCP bootstrap.
//!
//! Every message is one frame: a 24-byte header (`magic: u32`, `kind: u8`, 3 zero bytes,
//! `seq: u64`, `len: u64`, all little-endian) and `len` payload bytes.
//!
//! | kind | direction | seq | payload |
//! | --- | --- | --- | --- |
//! | `Challenge` | rank 0 → client, on accept | protocol version | `nonce: [u8; 32]` |
//! | `Hello` | client → rank 0 | protocol version | `rank: u64, world_size: u64, mac: [u8; 32]` |
//! | `Ack` | rank 0 → client | 0 | empty: handshake accepted, wait for `Welcome` |
//! | `Welcome` | rank 0 → client | 0 | empty: every rank connected |
//! | `Data` | client → rank 0 | exchange number | this rank's bytes |
//! | `Result` | rank 0 → client | exchange number | `count: u64`, then per rank `len: u64, bytes` |
//! | `Error` | rank 0 → client | exchange number | an encoded [`BootstrapError`] naming the culprit |
//!
//! `mac` is `HMAC-SHA256(job token, context || nonce || rank || world_size)` (see
//! `bootstrap::token`): the token itself is never sent. Version 1 had no challenge and no MAC.
//!
//! Challenge and hello have one exact size each, and readers accept nothing else, so garbage
//! cannot make a handshake allocate. Other frames are read incrementally (the buffer grows with
//! the bytes that actually arrive), so a header claiming a huge length costs nothing until the
//! bytes come, and is rejected outright above [`MAX_PAYLOAD`].

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::BootstrapError;
use crate::token::DIGEST_LEN;

pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"DCBS");
/// 2: challenge/response handshake with the job token (1: plain hello, no job identity).
pub(crate) const PROTOCOL_VERSION: u64 = 2;
/// Largest payload accepted (a bound for garbage lengths; payloads are read incrementally, so
/// the bound is on what a peer must actually send, not on an up-front allocation).
pub(crate) const MAX_PAYLOAD: u64 = 1 << 30;
pub(crate) const HEADER_LEN: usize = 24;
/// Payload of a `Hello`: rank, world size, MAC.
pub(crate) const HELLO_PAYLOAD_LEN: usize = 16 + DIGEST_LEN;
/// A whole `Hello` frame.
pub(crate) const HELLO_FRAME_LEN: usize = HEADER_LEN + HELLO_PAYLOAD_LEN;
/// A whole `Challenge` frame.
pub(crate) const CHALLENGE_FRAME_LEN: usize = HEADER_LEN + DIGEST_LEN;

pub(crate) const WHAT_CONNECT: &str = "connect to rank 0's rendezvous";
pub(crate) const WHAT_WELCOME: &str = "confirm that all ranks connected";
pub(crate) const WHAT_EXCHANGE: &str = "contribute to all_gather_bytes";
pub(crate) const WHAT_RESULT: &str = "send the result of all_gather_bytes";
pub(crate) const WHAT_ACCEPT: &str = "accept this rank's contribution to all_gather_bytes";
const WHATS: &[&str] = &[WHAT_CONNECT, WHAT_WELCOME, WHAT_EXCHANGE, WHAT_RESULT, WHAT_ACCEPT];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Hello = 1,
    Ack = 2,
    Welcome = 3,
    Data = 4,
    Result = 5,
    Error = 6,
    Challenge = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Ack,
            3 => Self::Welcome,
            4 => Self::Data,
            5 => Self::Result,
            6 => Self::Error,
            7 => Self::Challenge,
            _ => return None,
        })
    }
}

#[derive(Debug)]
pub(crate) struct Frame {
    pub kind: Kind,
    pub seq: u64,
    pub payload: Vec<u8>,
}

#[derive(Debug)]
pub(crate) enum ReadError {
    Io(io::Error),
    Malformed(String),
}

impl ReadError {
    /// Timeouts (as opposed to closed/reset connections).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, ReadError::Io(e) if is_timeout(e))
    }
}

pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => f.write_str("connection closed"),
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Malformed(m) => write!(f, "malformed frame: {m}"),
        }
    }
}

pub(crate) fn encode_frame(kind: Kind, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN + payload.len());
    buf.extend_from_slice(&MAGIC.to_le_bytes());
    buf.push(kind as u8);
    buf.extend_from_slice(&[0; 3]);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    buf.extend_from_slice(payload);
    buf
}

pub(crate) fn write_frame<W: Write>(w: &mut W, kind: Kind, seq: u64, payload: &[u8]) -> io::Result<()> {
    w.write_all(&encode_frame(kind, seq, payload))?;
    w.flush()
}

/// A parsed header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub kind: Kind,
    pub seq: u64,
    pub len: u64,
}

pub(crate) fn parse_header(h: &[u8; HEADER_LEN]) -> Result<Header, String> {
    let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    if magic != MAGIC {
        return Err(format!("bad magic {magic:#010x}"));
    }
    let kind = Kind::from_u8(h[4]).ok_or_else(|| format!("unknown frame kind {}", h[4]))?;
    let seq = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    Ok(Header { kind, seq, len })
}

/// Reads one frame of at most `max` payload bytes. The payload buffer grows with the bytes
/// received (never `vec![0; len]` up front).
pub(crate) fn read_frame_max<R: Read>(r: &mut R, max: u64) -> Result<Frame, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h).map_err(ReadError::Io)?;
    let Header { kind, seq, len } = parse_header(&h).map_err(ReadError::Malformed)?;
    if len > max {
        return Err(ReadError::Malformed(format!("payload of {len} bytes exceeds the limit of {max}")));
    }
    let mut payload = Vec::with_capacity(usize::try_from(len.min(64 * 1024)).unwrap_or(0));
    r.take(len).read_to_end(&mut payload).map_err(ReadError::Io)?;
    if payload.len() as u64 != len {
        return Err(ReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection closed after {} of {len} payload bytes", payload.len()),
        )));
    }
    Ok(Frame { kind, seq, payload })
}

pub(crate) fn read_frame<R: Read>(r: &mut R) -> Result<Frame, ReadError> {
    read_frame_max(r, MAX_PAYLOAD)
}

/// A reader over a blocking stream that fails with `TimedOut` once `deadline` has passed: a
/// deadline for a whole frame, not per `read` call (a peer trickling one byte at a time cannot
/// extend it).
pub(crate) struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl<'a> DeadlineReader<'a> {
    pub(crate) fn new(stream: &'a TcpStream, deadline: Instant) -> Self {
        Self { stream, deadline }
    }
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed while reading a frame"));
        }
        self.stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        let mut s = self.stream;
        s.read(buf)
    }
}

/// Reads one frame before `deadline` (the whole frame, see [`DeadlineReader`]).
pub(crate) fn read_frame_by(stream: &TcpStream, deadline: Instant) -> Result<Frame, ReadError> {
    read_frame(&mut DeadlineReader::new(stream, deadline))
}

// ---- payload helpers ----

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Result<u64, String> {
        let (head, rest) = self.buf.split_at_checked(8).ok_or_else(|| "truncated integer".to_owned())?;
        self.buf = rest;
        Ok(u64::from_le_bytes(head.try_into().expect("8 bytes")))
    }
    fn usize(&mut self) -> Result<usize, String> {
        usize::try_from(self.u64()?).map_err(|_| "integer does not fit usize".to_owned())
    }
    fn u8(&mut self) -> Result<u8, String> {
        let (&b, rest) = self.buf.split_first().ok_or_else(|| "truncated byte".to_owned())?;
        self.buf = rest;
        Ok(b)
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.usize()?;
        let (head, rest) = self.buf.split_at_checked(len).ok_or_else(|| "truncated byte string".to_owned())?;
        self.buf = rest;
        Ok(head)
    }
    fn string(&mut self) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
    fn finish(self) -> Result<(), String> {
        if self.buf.is_empty() { Ok(()) } else { Err(format!("{} trailing bytes", self.buf.len())) }
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The hello payload: rank, world size and the MAC over rank 0's nonce.
pub(crate) fn encode_hello(rank: usize, world: usize, mac: &[u8; DIGEST_LEN]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HELLO_PAYLOAD_LEN);
    put_u64(&mut out, rank as u64);
    put_u64(&mut out, world as u64);
    out.extend_from_slice(mac);
    out
}

/// A hello as rank 0 received it (`rank`/`world` as sent, not yet validated).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hello {
    pub rank: u64,
    pub world: u64,
    pub mac: [u8; DIGEST_LEN],
}

/// Checks a hello header (the first [`HEADER_LEN`] bytes of a connection after the challenge):
/// magic, kind, this protocol version and the exact hello size.
pub(crate) fn check_hello_header(h: &[u8; HEADER_LEN]) -> Result<(), String> {
    let hd = parse_header(h)?;
    if hd.kind != Kind::Hello {
        return Err(format!("expected a hello, got a {:?} frame", hd.kind));
    }
    if hd.seq != PROTOCOL_VERSION {
        return Err(format!("protocol version {} (rank 0 speaks {PROTOCOL_VERSION})", hd.seq));
    }
    if hd.len != HELLO_PAYLOAD_LEN as u64 {
        return Err(format!("hello of {} bytes (expected {HELLO_PAYLOAD_LEN})", hd.len));
    }
    Ok(())
}

/// Decodes a complete hello frame (header already checked by [`check_hello_header`]).
pub(crate) fn decode_hello(frame: &[u8; HELLO_FRAME_LEN]) -> Hello {
    let p = &frame[HEADER_LEN..];
    let rank = u64::from_le_bytes(p[0..8].try_into().expect("8 bytes"));
    let world = u64::from_le_bytes(p[8..16].try_into().expect("8 bytes"));
    let mut mac = [0u8; DIGEST_LEN];
    mac.copy_from_slice(&p[16..16 + DIGEST_LEN]);
    Hello { rank, world, mac }
}

/// Parses a challenge frame; `Err` describes what the peer sent instead.
pub(crate) fn decode_challenge(frame: &[u8; CHALLENGE_FRAME_LEN]) -> Result<[u8; DIGEST_LEN], String> {
    let h: &[u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().expect("header");
    let hd = parse_header(h)?;
    if hd.kind != Kind::Challenge {
        return Err(format!("expected a challenge, got a {:?} frame", hd.kind));
    }
    if hd.seq != PROTOCOL_VERSION {
        return Err(format!(
            "rank 0 speaks bootstrap protocol version {}, this rank speaks {PROTOCOL_VERSION} \
             (different detcoll builds?)",
            hd.seq
        ));
    }
    if hd.len != DIGEST_LEN as u64 {
        return Err(format!("challenge of {} bytes (expected {DIGEST_LEN})", hd.len));
    }
    let mut nonce = [0u8; DIGEST_LEN];
    nonce.copy_from_slice(&frame[HEADER_LEN..]);
    Ok(nonce)
}

pub(crate) fn encode_result(parts: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len() + 8).sum::<usize>() + 8;
    let mut out = Vec::with_capacity(total);
    put_u64(&mut out, parts.len() as u64);
    for p in parts {
        put_bytes(&mut out, p);
    }
    out
}

pub(crate) fn decode_result(p: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut c = Cursor { buf: p };
    let n = c.usize()?;
    if n > p.len() {
        return Err(format!("implausible rank count {n}"));
    }
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        parts.push(c.bytes()?.to_vec());
    }
    c.finish()?;
    Ok(parts)
}

/// Encodes the error rank 0 forwards to the other ranks. Errors that do not name a rank travel
/// as their message and arrive as [`BootstrapError::Protocol`].
pub(crate) fn encode_error(e: &BootstrapError) -> Vec<u8> {
    let mut out = Vec::new();
    match e {
        BootstrapError::PeerTimeout { rank, waited, what } => {
            out.push(1);
            put_u64(&mut out, *rank as u64);
            put_u64(&mut out, u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX));
            put_bytes(&mut out, what.as_bytes());
        }
        BootstrapError::PeerGone { rank, detail } => {
            out.push(2);
            put_u64(&mut out, *rank as u64);
            put_bytes(&mut out, detail.as_bytes());
        }
        BootstrapError::SequenceMismatch { rank, expected, got } => {
            out.push(3);
            put_u64(&mut out, *rank as u64);
            put_u64(&mut out, *expected);
            put_u64(&mut out, *got);
        }
        BootstrapError::WorldSizeMismatch { rank, ours, theirs } => {
            out.push(4);
            put_u64(&mut out, *rank as u64);
            put_u64(&mut out, *ours as u64);
            put_u64(&mut out, *theirs as u64);
        }
        BootstrapError::DuplicateRank { rank } => {
            out.push(5);
            put_u64(&mut out, *rank as u64);
        }
        BootstrapError::RankOutOfRange { rank, world } => {
            out.push(6);
            put_u64(&mut out, *rank as u64);
            put_u64(&mut out, *world as u64);
        }
        BootstrapError::MissingRanks { ranks, waited } => {
            out.push(8);
            put_u64(&mut out, ranks.len() as u64);
            for r in ranks {
                put_u64(&mut out, *r as u64);
            }
            put_u64(&mut out, u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX));
        }
        other => {
            out.push(7);
            put_bytes(&mut out, other.to_string().as_bytes());
        }
    }
    out
}

/// Decodes an error frame from rank 0 (from rank 0's point of view; see the caller for the
/// world-size perspective).
pub(crate) fn decode_error(p: &[u8]) -> BootstrapError {
    fn inner(p: &[u8]) -> Result<BootstrapError, String> {
        let mut c = Cursor { buf: p };
        let e = match c.u8()? {
            1 => {
                let rank = c.usize()?;
                let waited = Duration::from_nanos(c.u64()?);
                let what_s = c.string()?;
                let what = WHATS.iter().copied().find(|w| *w == what_s).unwrap_or("respond");
                BootstrapError::PeerTimeout { rank, waited, what }
            }
            2 => {
                let rank = c.usize()?;
                let detail = c.string()?;
                BootstrapError::PeerGone { rank, detail: format!("{detail} (reported by rank 0)") }
            }
            3 => BootstrapError::SequenceMismatch { rank: c.usize()?, expected: c.u64()?, got: c.u64()? },
            4 => BootstrapError::WorldSizeMismatch { rank: c.usize()?, ours: c.usize()?, theirs: c.usize()? },
            5 => BootstrapError::DuplicateRank { rank: c.usize()? },
            6 => BootstrapError::RankOutOfRange { rank: c.usize()?, world: c.usize()? },
            7 => BootstrapError::Protocol(format!("rank 0 reported: {}", c.string()?)),
            8 => {
                let n = c.usize()?;
                if n > p.len() / 8 {
                    return Err(format!("implausible rank count {n}"));
                }
                let ranks = (0..n).map(|_| c.usize()).collect::<Result<Vec<_>, _>>()?;
                BootstrapError::MissingRanks { ranks, waited: Duration::from_nanos(c.u64()?) }
            }
            code => return Err(format!("unknown error code {code}")),
        };
        c.finish()?;
        Ok(e)
    }
    inner(p).unwrap_or_else(|m| BootstrapError::Protocol(format!("rank 0 sent an undecodable error frame: {m}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_roundtrip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::Data, 7, b"hello").unwrap();
        let f = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(f.kind, Kind::Data);
        assert_eq!(f.seq, 7);
        assert_eq!(f.payload, b"hello");
    }

    #[test]
    fn bad_magic_is_malformed() {
        let buf = [0u8; HEADER_LEN];
        assert!(matches!(read_frame(&mut buf.as_slice()), Err(ReadError::Malformed(_))));
    }

    #[test]
    fn huge_length_prefixes_are_rejected_or_read_incrementally() {
        // Above the limit: rejected from the header alone.
        let mut buf = encode_frame(Kind::Data, 0, &[]);
        buf[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(read_frame(&mut buf.as_slice()), Err(ReadError::Malformed(_))));
        // At the limit but truncated: an EOF after the bytes that came (the buffer grew with
        // them; nothing of the claimed size was allocated up front).
        let mut buf = encode_frame(Kind::Data, 0, b"abc");
        buf[16..24].copy_from_slice(&(1u64 << 30).to_le_bytes());
        match read_frame(&mut buf.as_slice()) {
            Err(ReadError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
        // Hellos have one size.
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&encode_frame(Kind::Hello, PROTOCOL_VERSION, &[0; HELLO_PAYLOAD_LEN])[..HEADER_LEN]);
        assert!(check_hello_header(&h).is_ok());
        h[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(check_hello_header(&h).is_err());
        let old = encode_frame(Kind::Hello, 1, &[0; HELLO_PAYLOAD_LEN]);
        assert!(check_hello_header(old[..HEADER_LEN].try_into().unwrap()).is_err());
    }

    #[test]
    fn result_roundtrip() {
        let parts = vec![vec![], vec![1, 2, 3], vec![4]];
        assert_eq!(decode_result(&encode_result(&parts)).unwrap(), parts);
    }

    #[test]
    fn error_roundtrip() {
        let e = BootstrapError::PeerTimeout { rank: 3, waited: Duration::from_millis(500), what: WHAT_EXCHANGE };
        match decode_error(&encode_error(&e)) {
            BootstrapError::PeerTimeout { rank, waited, what } => {
                assert_eq!((rank, waited, what), (3, Duration::from_millis(500), WHAT_EXCHANGE));
            }
            other => panic!("{other}"),
        }
        let e = BootstrapError::MissingRanks { ranks: vec![1, 3, 6], waited: Duration::from_millis(1500) };
        match decode_error(&encode_error(&e)) {
            BootstrapError::MissingRanks { ranks, waited } => {
                assert_eq!((ranks, waited), (vec![1, 3, 6], Duration::from_millis(1500)));
            }
            other => panic!("{other}"),
        }
        let e = BootstrapError::SequenceMismatch { rank: 2, expected: 5, got: 4 };
        assert!(matches!(
            decode_error(&encode_error(&e)),
            BootstrapError::SequenceMismatch { rank: 2, expected: 5, got: 4 }
        ));
    }
}
