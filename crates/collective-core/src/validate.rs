//! Fail-closed validation, done before any device work.
//!
//! [`validate`] turns a call's [`Io`] into a [`Call`] — addresses and element counts the
//! protocol needs — or an [`Error`] naming the offending argument. Nothing is written on error.
use crate::{DType, Error, Io, MAX_LANES, Op, Route, Signature};

/// A validated single-lane call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub op: Op,
    pub dtype: DType,
    /// Address this rank's contribution is read from.
    pub src: u64,
    /// Address of the whole output (for `reduce_scatter`, of this rank's shard).
    pub dst: u64,
    /// Elements this rank contributes (its staging payload).
    pub count_in: usize,
    /// Elements written to `dst`.
    pub count_out: usize,
    /// Whether `src` aliases the output buffer (in place).
    pub in_place: bool,
}

impl Call {
    /// Bytes this rank stages.
    pub const fn bytes_in(&self) -> usize {
        self.count_in * self.dtype.size()
    }
    /// Bytes written to the output.
    pub const fn bytes_out(&self) -> usize {
        self.count_out * self.dtype.size()
    }
}

/// A validated lane of `reduce_scatter_many`: its call and where it sits in staging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCall {
    pub call: Call,
    /// Element offset of this lane's payload in the rank's staging frame.
    pub staging_offset: usize,
}

fn check_aligned(op: Op, argument: &'static str, addr: u64, dtype: DType) -> Result<(), Error> {
    let align = dtype.size();
    if addr.is_multiple_of(align as u64) { Ok(()) } else { Err(Error::Misaligned { op, argument, addr, align }) }
}

/// Checks that `len` elements of `size` bytes at `addr` have a byte length and an end address
/// that fit (checked arithmetic: later byte and address computations cannot wrap).
pub(crate) fn check_span(op: Op, argument: &'static str, addr: u64, len: usize, size: usize) -> Result<(), Error> {
    len.checked_mul(size)
        .and_then(|bytes| u64::try_from(bytes).ok())
        .and_then(|bytes| addr.checked_add(bytes))
        .map(|_| ())
        .ok_or_else(|| Error::SizeOverflow { op, argument, len })
}

/// Whether `a_bytes` at `a` and `b_bytes` at `b` share a byte. Ends saturate at `u64::MAX`:
/// a span that wraps is refused by [`check_span`], and this test must not overflow (a panic in
/// a build with overflow checks) on one that reached it unchecked.
pub(crate) fn overlaps(a: u64, a_bytes: usize, b: u64, b_bytes: usize) -> bool {
    a_bytes > 0 && b_bytes > 0 && a < b.saturating_add(b_bytes as u64) && b < a.saturating_add(a_bytes as u64)
}

/// Validates one call of `op` by `rank` of `world` against `capacity` staging bytes.
///
/// `capacity` is the most bytes one rank may contribute (`CapacityExceeded` above it). The IPC
/// backends pass `usize::MAX`: they run a larger call in chunks of their staging
/// (`detcoll_protocol::Chunks`), so their staging capacity bounds no call; a backend with a hard
/// limit (the transport, the conformance memory backend) passes its own.
pub fn validate(op: Op, io: &Io<'_>, rank: usize, world: usize, capacity: usize) -> Result<Call, Error> {
    crate::check_world_size(world)?;
    let (in_addr, in_len, in_dtype, out_addr, out_len, out_dtype, in_place) = match io {
        Io::InPlace(b) => (b.addr(), b.len(), b.dtype(), b.addr(), b.len(), b.dtype(), true),
        Io::OutOfPlace { input, output } => {
            (input.addr(), input.len(), input.dtype(), output.addr(), output.len(), output.dtype(), false)
        }
    };
    let dtype = in_dtype;
    if op.reduces() && !dtype.is_reducible() {
        return Err(Error::UnsupportedDtype { op, dtype });
    }
    if out_dtype != in_dtype {
        return Err(Error::DtypeMismatch {
            op,
            argument: "output",
            got: out_dtype,
            reference: "input",
            expected: in_dtype,
        });
    }
    let size = dtype.size();
    if in_place {
        // One buffer, named as the caller passed it (`Io::InPlace`).
        check_aligned(op, "buffer", out_addr, dtype)?;
        check_span(op, "buffer", out_addr, out_len, size)?;
    } else {
        check_aligned(op, "input", in_addr, dtype)?;
        check_aligned(op, "output", out_addr, dtype)?;
        check_span(op, "input", in_addr, in_len, size)?;
        check_span(op, "output", out_addr, out_len, size)?;
    }
    let call = match (op, in_place) {
        (Op::AllReduce, _) => {
            if out_len != in_len {
                return Err(Error::LengthMismatch {
                    op,
                    argument: "output",
                    expected: in_len,
                    got: out_len,
                    why: "all_reduce output is as long as its input",
                });
            }
            Call { op, dtype, src: in_addr, dst: out_addr, count_in: in_len, count_out: in_len, in_place }
        }
        (Op::AllGather, false) => {
            let Some(expected) = in_len.checked_mul(world) else {
                return Err(Error::SizeOverflow { op, argument: "input", len: in_len });
            };
            if out_len != expected {
                return Err(Error::LengthMismatch {
                    op,
                    argument: "output",
                    expected,
                    got: out_len,
                    why: "all_gather output holds world_size inputs",
                });
            }
            Call { op, dtype, src: in_addr, dst: out_addr, count_in: in_len, count_out: out_len, in_place }
        }
        (Op::AllGather, true) => {
            if out_len % world != 0 {
                return Err(Error::NotDivisible { op, argument: "buffer", len: out_len, world });
            }
            let n = out_len / world;
            let src = out_addr + (rank * n * size) as u64;
            Call { op, dtype, src, dst: out_addr, count_in: n, count_out: out_len, in_place }
        }
        (Op::ReduceScatter | Op::ReduceScatterMany, _) => {
            let argument = if in_place { "buffer" } else { "input" };
            if in_len % world != 0 {
                return Err(Error::NotDivisible { op, argument, len: in_len, world });
            }
            let shard = in_len / world;
            let dst = if in_place {
                out_addr + (rank * shard * size) as u64
            } else {
                if out_len != shard {
                    return Err(Error::LengthMismatch {
                        op,
                        argument: "output",
                        expected: shard,
                        got: out_len,
                        why: "reduce_scatter output is one shard of the input",
                    });
                }
                out_addr
            };
            Call { op, dtype, src: in_addr, dst, count_in: in_len, count_out: shard, in_place }
        }
    };
    if !in_place && overlaps(call.src, call.bytes_in(), call.dst, call.bytes_out()) {
        return Err(Error::Overlap { op });
    }
    if call.bytes_in() > capacity {
        return Err(Error::CapacityExceeded { op, needed: call.bytes_in(), capacity });
    }
    Ok(call)
}

/// How errors name lane `i` (`argument` is a `&'static str`; at most [`MAX_LANES`] lanes).
const LANE_NAMES: [&str; MAX_LANES] = [
    "lanes[0]",
    "lanes[1]",
    "lanes[2]",
    "lanes[3]",
    "lanes[4]",
    "lanes[5]",
    "lanes[6]",
    "lanes[7]",
    "lanes[8]",
    "lanes[9]",
    "lanes[10]",
    "lanes[11]",
    "lanes[12]",
    "lanes[13]",
    "lanes[14]",
    "lanes[15]",
];

/// How errors name lane `i` of a `reduce_scatter_many` call (`lanes[i]`, a `&'static str` as
/// the errors' `argument` is; a call has at most [`MAX_LANES`] lanes, past which `TooManyLanes`
/// is the error and this says only that the lane is past them).
pub fn lane_name(i: usize) -> &'static str {
    LANE_NAMES.get(i).copied().unwrap_or("a lane past MAX_LANES")
}

/// The validated lanes of one `reduce_scatter_many` call: a fixed-capacity list (no heap
/// allocation on the per-call path), used as a slice.
#[derive(Debug, Clone, Copy)]
pub struct LaneCalls {
    items: [LaneCall; MAX_LANES],
    len: usize,
}

impl LaneCalls {
    const EMPTY: LaneCall = LaneCall {
        call: Call {
            op: Op::ReduceScatterMany,
            dtype: DType::F32,
            src: 0,
            dst: 0,
            count_in: 0,
            count_out: 0,
            in_place: false,
        },
        staging_offset: 0,
    };
    fn push(&mut self, l: LaneCall) {
        self.items[self.len] = l;
        self.len += 1;
    }
}

impl<'a> IntoIterator for &'a LaneCalls {
    type Item = &'a LaneCall;
    type IntoIter = core::slice::Iter<'a, LaneCall>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl core::ops::Deref for LaneCalls {
    type Target = [LaneCall];
    fn deref(&self) -> &[LaneCall] {
        &self.items[..self.len]
    }
}

/// Validates a `reduce_scatter_many` call: every lane as a reduce_scatter, one dtype for all,
/// and the lanes' payloads together within `capacity` (`usize::MAX`: no limit, see [`validate`]). Returns the lanes with their staging
/// offsets (disjoint ranges of one frame) and the call's signature.
pub fn validate_many(
    lanes: &[Io<'_>],
    rank: usize,
    world: usize,
    capacity: usize,
) -> Result<(LaneCalls, Signature), Error> {
    let op = Op::ReduceScatterMany;
    if lanes.len() > MAX_LANES {
        return Err(Error::TooManyLanes { lanes: lanes.len(), max: MAX_LANES });
    }
    let mut out = LaneCalls { items: [LaneCalls::EMPTY; MAX_LANES], len: 0 };
    let mut offset = 0usize;
    let mut dtype = DType::F32;
    for (i, io) in lanes.iter().enumerate() {
        let call = validate(op, io, rank, world, usize::MAX)?;
        if i == 0 {
            dtype = call.dtype;
        } else if call.dtype != dtype {
            return Err(Error::DtypeMismatch {
                op,
                argument: lane_name(i),
                got: call.dtype,
                reference: lane_name(0),
                expected: dtype,
            });
        }
        out.push(LaneCall { call, staging_offset: offset });
        offset = offset.checked_add(call.count_in).ok_or_else(|| Error::SizeOverflow {
            op,
            argument: "lanes",
            len: call.count_in,
        })?;
    }
    for (i, a) in out.iter().enumerate() {
        for (j, b) in out[..i].iter().enumerate() {
            let (a, b) = (a.call, b.call);
            if overlaps(a.dst, a.bytes_out(), b.dst, b.bytes_out())
                || overlaps(a.dst, a.bytes_out(), b.src, b.bytes_in())
                || overlaps(b.dst, b.bytes_out(), a.src, a.bytes_in())
            {
                // Not `Overlap` ("use the in-place form"): the lanes may be in place already.
                return Err(Error::LanesOverlap { op, lane: i, other: j });
            }
        }
    }
    let needed =
        offset.checked_mul(dtype.size()).ok_or_else(|| Error::SizeOverflow { op, argument: "lanes", len: offset })?;
    if needed > capacity {
        return Err(Error::CapacityExceeded { op, needed, capacity });
    }
    let split = Signature::lane_split(out.iter().map(|l| l.call.count_in as u64));
    let sig = Signature { op, dtype, count: offset as u64, lanes: lanes.len() as u16, split, route: Route::IpcOneShot };
    Ok((out, sig))
}

impl Call {
    /// The signature every rank publishes for this call.
    pub const fn signature(&self) -> Signature {
        Signature {
            op: self.op,
            dtype: self.dtype,
            count: self.count_in as u64,
            lanes: 1,
            split: 0,
            route: Route::IpcOneShot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RawMut, RawRef};

    // SAFETY (every view below): never dereferenced; validation only reads addresses and
    // lengths, and must refuse these before anything could touch them.
    fn raw(addr: u64, len: usize, dtype: DType) -> (RawRef<'static>, RawMut<'static>) {
        // SAFETY: as above.
        unsafe { (RawRef::from_raw(addr, len, dtype), RawMut::from_raw(addr.wrapping_add(1 << 40), len, dtype)) }
    }

    #[test]
    fn lengths_whose_bytes_or_end_overflow_are_refused() {
        for (len, addr) in [(usize::MAX, 0x1000u64), (usize::MAX / 4 + 1, 0x1000), (16, u64::MAX - 15)] {
            for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
                let (input, output) = raw(addr, len, DType::F32);
                let r = validate(op, &Io::OutOfPlace { input, output }, 0, 2, usize::MAX);
                assert!(matches!(r, Err(Error::SizeOverflow { .. })), "{op} len {len} at {addr:#x}: {r:?}");
            }
        }
        // all_gather: the output length `world * input` must not wrap either.
        let (input, _) = raw(0x1000, usize::MAX / 8 + 1, DType::U8);
        // SAFETY: as above.
        let output = unsafe { RawMut::from_raw(0x2000, 8, DType::U8) };
        let r = validate(Op::AllGather, &Io::OutOfPlace { input, output }, 0, 8, usize::MAX);
        assert!(matches!(r, Err(Error::SizeOverflow { argument: "input", .. })), "{r:?}");
    }

    #[test]
    fn a_misaligned_in_place_buffer_is_named_buffer() {
        for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::ReduceScatterMany] {
            // SAFETY: as above.
            let io = unsafe { Io::InPlace(RawMut::from_raw(0x10002, 16, DType::F32)) };
            let r = validate(op, &io, 0, 2, usize::MAX);
            assert!(matches!(r, Err(Error::Misaligned { argument: "buffer", addr: 0x10002, .. })), "{op}: {r:?}");
            let msg = r.unwrap_err().to_string();
            assert!(msg.contains("`buffer`") && !msg.contains("input"), "{msg}");
        }
        // SAFETY: as above.
        let io = unsafe { Io::InPlace(RawMut::from_raw(u64::MAX - 15, 16, DType::F32)) };
        let r = validate(Op::AllReduce, &io, 0, 2, usize::MAX);
        assert!(matches!(r, Err(Error::SizeOverflow { argument: "buffer", .. })), "{r:?}");
        // Out of place, each view keeps its own name.
        let (input, output) = raw(0x10002, 16, DType::F32);
        let r = validate(Op::AllReduce, &Io::OutOfPlace { input, output }, 0, 2, usize::MAX);
        assert!(matches!(r, Err(Error::Misaligned { argument: "input", .. })), "{r:?}");
    }

    #[test]
    fn a_lane_of_another_dtype_is_named_by_its_index() {
        // SAFETY: as above.
        let lane = |addr: u64, dtype| unsafe { Io::InPlace(RawMut::from_raw(addr, 16, dtype)) };
        for bad in [1usize, 5, MAX_LANES - 1] {
            let lanes: Vec<Io<'_>> = (0..=bad)
                .map(|i| lane(0x10000 * (i as u64 + 1), if i == bad { DType::BF16 } else { DType::F32 }))
                .collect();
            let r = validate_many(&lanes, 0, 2, usize::MAX).map(|_| ());
            let msg = r.unwrap_err().to_string();
            assert!(msg.contains(&format!("`lanes[{bad}]` is bf16")) && msg.contains("`lanes[0]`"), "{msg}");
        }
    }

    #[test]
    fn overlapping_in_place_lanes_are_not_told_to_use_the_in_place_form() {
        // SAFETY: as above.
        let lane = |addr: u64, n: usize| unsafe { Io::InPlace(RawMut::from_raw(addr, n, DType::F32)) };
        // Lane 2 shares lane 0's buffer.
        let lanes = [lane(0x10000, 16), lane(0x20000, 16), lane(0x10020, 16)];
        let r = validate_many(&lanes, 0, 2, usize::MAX).map(|_| ());
        assert!(matches!(r, Err(Error::LanesOverlap { lane: 2, other: 0, .. })), "{r:?}");
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains("lanes[2]") && msg.contains("lanes[0]") && !msg.contains("in-place form"), "{msg}");
        // An out-of-place lane whose own input and output overlap is still told.
        let (input, _) = raw(0x10000, 16, DType::F32);
        // SAFETY: as above.
        let output = unsafe { RawMut::from_raw(0x10004, 8, DType::F32) };
        let r = validate_many(&[Io::OutOfPlace { input, output }], 0, 2, usize::MAX).map(|_| ());
        assert!(matches!(r, Err(Error::Overlap { .. })), "{r:?}");
        // Lanes may read the same input.
        let (input, _) = raw(0x10000, 16, DType::F32);
        // SAFETY: as above.
        let (o1, o2) = unsafe { (RawMut::from_raw(0x30000, 8, DType::F32), RawMut::from_raw(0x40000, 8, DType::F32)) };
        let lanes = [Io::OutOfPlace { input, output: o1 }, Io::OutOfPlace { input, output: o2 }];
        assert!(validate_many(&lanes, 0, 2, usize::MAX).is_ok());
    }

    #[test]
    fn lane_splits_change_the_signature() {
        // SAFETY: as above.
        let lane = |addr: u64, n: usize| unsafe { Io::InPlace(RawMut::from_raw(addr, n, DType::F32)) };
        let (_, s1) = validate_many(&[lane(0x10000, 8), lane(0x20000, 16)], 0, 2, 1 << 20).unwrap();
        let (_, s2) = validate_many(&[lane(0x10000, 16), lane(0x20000, 8)], 0, 2, 1 << 20).unwrap();
        assert_eq!((s1.count, s1.lanes), (s2.count, s2.lanes));
        assert_ne!(s1.split, s2.split);
        assert_ne!(s1.pack(), s2.pack());
        assert_ne!(s1.digest(), s2.digest());
        assert_eq!(Signature::unpack(s1.pack()), Some(s1));
        assert_eq!(Signature::unpack(s2.pack()), Some(s2));
        let c = validate(Op::AllReduce, &lane(0x10000, 8), 0, 2, 1 << 20).unwrap().signature();
        assert_eq!((c.split, Signature::unpack(c.pack())), (0, Some(c)));
    }
}
