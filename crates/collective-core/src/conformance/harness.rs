//! How the suite drives a backend.
use crate::{Collective, DType, RawMut, RawRef};

/// One rank's view of a backend during a case.
pub trait RankEnv {
    /// The collective under test.
    type Comm: Collective;
    /// An owned buffer of the backend's memory.
    type Buf;

    /// This rank's collective.
    fn comm(&self) -> &Self::Comm;
    /// The stream calls are enqueued on.
    fn stream(&self) -> &<Self::Comm as Collective>::Stream;
    /// A new buffer of `bytes` bytes (contents unspecified; the suite writes before reading).
    fn alloc(&mut self, bytes: usize) -> Self::Buf;
    /// Writes `data` to the start of `buf`, ordered before later calls on the stream.
    fn write(&mut self, buf: &mut Self::Buf, data: &[u8]);
    /// Reads the whole of `buf` after every call enqueued so far has completed.
    fn read(&mut self, buf: &Self::Buf) -> Vec<u8>;
    /// A view of `len` elements of `dtype` starting `byte_offset` bytes into `buf`.
    fn view<'b>(&self, buf: &'b Self::Buf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b>;
    /// A writable view of `len` elements of `dtype` starting `byte_offset` bytes into `buf`.
    fn view_mut<'b>(&self, buf: &'b mut Self::Buf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b>;
}

/// A backend the suite can run: builds worlds of ranks and runs a case on each rank.
pub trait TestBackend: Sync {
    /// One rank's environment.
    type Rank: RankEnv;
    /// Name in failure messages.
    fn name(&self) -> String;
    /// Runs `case` on every rank of a fresh world of `world` ranks with `capacity` bytes of
    /// staging, concurrently, and returns every failing rank's message, joined. `test` is the
    /// full libtest name of the running test (process backends re-run it in each child).
    fn run(
        &self,
        world: usize,
        capacity: usize,
        test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String>;
}

/// Host memory, 16-byte aligned, for host backends.
#[derive(Debug, Clone)]
pub struct HostBuf {
    words: Vec<u128>,
    bytes: usize,
}

impl HostBuf {
    /// A zeroed buffer of `bytes` bytes.
    pub fn new(bytes: usize) -> Self {
        HostBuf { words: vec![0; bytes.div_ceil(16)], bytes }
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }
    /// Start address, writable.
    pub fn addr_mut(&mut self) -> u64 {
        self.words.as_mut_ptr() as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `bytes` initialised bytes; u8 has no alignment needs.
        unsafe { core::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.bytes) }
    }
    /// A view of `len` elements of `dtype` starting `byte_offset` bytes in; panics when out of
    /// bounds (a harness bug, not a collective's).
    pub fn view(&self, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'_> {
        assert!(byte_offset + len * dtype.size() <= self.len(), "host view out of bounds");
        // SAFETY: in bounds of `self`, which the returned view borrows.
        unsafe { RawRef::from_raw(self.addr() + byte_offset as u64, len, dtype) }
    }
    /// A writable view, as [`HostBuf::view`].
    pub fn view_mut(&mut self, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'_> {
        assert!(byte_offset + len * dtype.size() <= self.len(), "host view out of bounds");
        // SAFETY: in bounds of `self`, which the returned view borrows uniquely.
        unsafe { RawMut::from_raw(self.addr_mut() + byte_offset as u64, len, dtype) }
    }
    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives unique access.
        unsafe { core::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.bytes) }
    }
}

/// A [`RankEnv`] for collectives over host memory (stream type `()`).
#[derive(Debug)]
pub struct HostRank<C> {
    pub comm: C,
}

impl<C: Collective<Stream = ()>> RankEnv for HostRank<C> {
    type Comm = C;
    type Buf = HostBuf;
    fn comm(&self) -> &C {
        &self.comm
    }
    fn stream(&self) -> &() {
        &()
    }
    fn alloc(&mut self, bytes: usize) -> HostBuf {
        HostBuf::new(bytes)
    }
    fn write(&mut self, buf: &mut HostBuf, data: &[u8]) {
        buf.as_bytes_mut()[..data.len()].copy_from_slice(data);
    }
    fn read(&mut self, buf: &HostBuf) -> Vec<u8> {
        buf.as_bytes().to_vec()
    }
    fn view<'b>(&self, buf: &'b HostBuf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        buf.view(byte_offset, len, dtype)
    }
    fn view_mut<'b>(&self, buf: &'b mut HostBuf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        buf.view_mut(byte_offset, len, dtype)
    }
}

/// Runs `f(rank)` on `world` threads and joins every rank's failure into one message.
pub fn run_threads<F>(world: usize, f: F) -> Result<(), String>
where
    F: Fn(usize) -> Result<(), String> + Sync,
{
    let errors: Vec<String> = std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..world).map(|r| (r, s.spawn(move || f(r)))).collect();
        handles
            .into_iter()
            .filter_map(|(r, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("rank {r}: {e}")),
                Err(p) => Some(format!(
                    "rank {r} panicked: {}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )),
            })
            .collect()
    });
    if errors.is_empty() { Ok(()) } else { Err(errors.join("\n")) }
}

/// Runs `case` on one thread per rank, each thread owning its rank (e.g. a collective built
/// for the whole world beforehand), then `finish` on it (e.g. close); joins every failure.
pub fn run_owned<R: Send>(
    ranks: Vec<R>,
    case: &(dyn Fn(&mut R) -> Result<(), String> + Sync),
    finish: impl Fn(R) -> Result<(), String> + Sync,
) -> Result<(), String> {
    let world = ranks.len();
    let slots = std::sync::Mutex::new(ranks.into_iter().map(Some).collect::<Vec<_>>());
    run_threads(world, |r| {
        let mut rank = slots.lock().map_err(|e| e.to_string())?[r].take().ok_or("rank taken twice")?;
        let result = case(&mut rank);
        let finished = finish(rank);
        result.and(finished)
    })
}

/// Reports a skipped GPU test where the test log shows it even when libtest captures output
/// (a direct write to the stderr handle is not captured): a test that cannot run must say so.
pub fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipped: {reason}");
}
