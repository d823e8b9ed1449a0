//! Views whose byte length or end address does not fit are a typed `SizeOverflow` at the front
//! door (lanes whose bytes overflow only summed: the typed error validation finds), in a test
//! build too (overflow checks on), and the handle stays usable: the route lookup sizes a call
//! before validation refuses it, and the fused call's overlap tests ran before any span check
//! of the residual, `h` and the weight. Before, each of these panicked
//! with "attempt to multiply (add) with overflow" in a debug build — and a panic inside a call
//! poisons the handle — while a release build returned the typed error.
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, CpuCollective, DType, Error, Io, RawMut, RawRef, RmsNorm, cpu};

/// A view of `len` elements at `addr`, never read: validation refuses it first.
fn view(addr: u64, len: usize, dtype: DType) -> RawRef<'static> {
    // SAFETY: the calls below refuse these views (their bytes or end address overflow) before
    // touching any memory; nothing reads them.
    unsafe { RawRef::from_raw(addr, len, dtype) }
}

fn view_mut(addr: u64, len: usize, dtype: DType) -> RawMut<'static> {
    // SAFETY: as `view`.
    unsafe { RawMut::from_raw(addr, len, dtype) }
}

/// One rank's bad calls (both ranks make the same ones: each is refused before any
/// communication), each `SizeOverflow`, then a valid all_reduce that must succeed.
fn bad_calls(comm: &CpuCollective) {
    let huge_f32 = usize::MAX / 4 + 1;
    let x = vec![1.0f32; 8];
    let mut y = vec![0f32; 8];
    let (xa, ya) = (x.as_ptr() as u64, y.as_mut_ptr() as u64);
    let expect = |what: &str, got: Result<(), Error>| match got {
        Err(Error::SizeOverflow { .. }) => {}
        other => panic!("{what}: expected SizeOverflow, got {other:?}"),
    };
    let oop = |len| Io::OutOfPlace { input: view(xa, len, DType::F32), output: view_mut(ya, len, DType::F32) };
    expect("all_reduce", comm.all_reduce(oop(huge_f32), &()));
    expect("all_reduce in place", comm.all_reduce(Io::InPlace(view_mut(ya, huge_f32, DType::F32)), &()));
    expect("reduce_scatter", comm.reduce_scatter(oop(huge_f32), &()));
    expect(
        "all_gather",
        comm.all_gather(
            Io::OutOfPlace { input: view(xa, huge_f32, DType::F32), output: view_mut(ya, 8, DType::F32) },
            &(),
        ),
    );
    // Four lanes of 2^62 bytes each, whose bytes overflow only summed (the route lookup's sum):
    // validation names what is wrong with them (spans this long overlap).
    let lane = |i: u64| Io::OutOfPlace {
        input: view(xa + i * 4096, 1 << 61, DType::BF16),
        output: view_mut(ya + i * 4096, 1 << 60, DType::BF16),
    };
    match comm.reduce_scatter_many(&[lane(0), lane(1), lane(2), lane(3)], &()) {
        Err(Error::Overlap { .. } | Error::LanesOverlap { .. }) => {}
        other => panic!("reduce_scatter_many: expected an overlap refused, got {other:?}"),
    }
    // The fused call: the residual, h or the weight ending past the address space.
    let end = u64::MAX - 15;
    let (hidden, n) = (8usize, 8usize);
    let mut r = vec![0f32; n];
    let mut h = vec![0f32; n];
    let w = vec![1f32; hidden];
    let (ra, ha, wa) = (r.as_mut_ptr() as u64, h.as_mut_ptr() as u64, w.as_ptr() as u64);
    for (what, res, hh, wt) in [("residual", end, ha, wa), ("h", ra, end, wa), ("weight", ra, ha, end)] {
        let norm = RmsNorm {
            residual: Io::OutOfPlace { input: view(res, n, DType::F32), output: view_mut(hh, n, DType::F32) },
            weight: view(wt, hidden, DType::F32),
            hidden,
            eps: 1e-6,
        };
        let x = Io::OutOfPlace { input: view(xa, n, DType::F32), output: view_mut(ya, n, DType::F32) };
        expect(
            &format!("fused, {what} at the end of the address space"),
            comm.all_reduce_residual_rmsnorm(x, norm, &()),
        );
    }
    assert!(y.iter().all(|&v| v == 0.0), "a refused call wrote y");
    assert!(h.iter().chain(&r).all(|&v| v == 0.0), "a refused call wrote h or the residual");
    // Still usable: nothing panicked inside a call.
    comm.all_reduce(Io::host(&x, &mut y), &()).expect("a valid call after the refused ones");
    assert!(y.iter().all(|&v| v.to_bits() == (2.0f32).to_bits()), "{y:?}");
}

#[test]
fn views_whose_bytes_overflow_are_size_overflow_and_the_handle_stays_usable() {
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 16)).expect("thread group");
    std::thread::scope(|s| {
        for comm in &ranks {
            s.spawn(move || bad_calls(comm));
        }
    });
}
