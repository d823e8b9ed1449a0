//! The engine's own fused entries (`IpcCollective::enqueue_all_reduce_norm`, what raw callers
//! and the front door reach, and `enqueue_all_reduce_for_norm`, the all_reduce of a fused call
//! whose norm the caller launches) refuse, with a typed error and nothing written, the
//! arguments the front door refuses and the forms no fused launch takes (a norm reading
//! anything but the all_reduce's output, `y` apart from it); the handle then still makes a
//! correct call.
use collective_core::fixed_tree::{RmsNormShape, residual_rmsnorm};
use collective_core::{Collective, DType, Error, Io, IpcRoute};
use detcoll_protocol::{Device, NormArgs};
use shm_ipc::{ShmCollective, ShmConfig};

const ROWS: usize = 4;
const HIDDEN: usize = 16;
const N: usize = ROWS * HIDDEN;
const SENTINEL: f32 = -7.0;

/// The buffers of one rank's call, each a sentinel or its inputs' values.
struct Buffers {
    x: Vec<f32>,
    y: Vec<f32>,
    residual: Vec<f32>,
    h: Vec<f32>,
    weight: Vec<f32>,
    other: Vec<f32>,
}

impl Buffers {
    fn new(rank: usize) -> Self {
        let v =
            |n: usize, s: usize| (0..n).map(|i| ((i * 37 + s * 101) % 97) as f32 * 0.03 - 1.2).collect::<Vec<f32>>();
        Buffers {
            x: v(2 * N, rank),
            y: vec![SENTINEL; N],
            residual: v(N, 100),
            h: vec![SENTINEL; N],
            weight: v(HIDDEN, 101),
            other: vec![SENTINEL; N],
        }
    }
    fn bits(&self) -> Vec<u32> {
        [&self.x, &self.y, &self.residual, &self.h, &self.weight, &self.other]
            .into_iter()
            .flat_map(|v| v.iter().map(|e| e.to_bits()))
            .collect()
    }
}

fn addr(v: &mut [f32]) -> u64 {
    v.as_mut_ptr() as u64
}

/// One call of `rank` by `route` with the arguments `change` makes of the right ones, through
/// `enqueue_all_reduce_norm` (`fused`) or `enqueue_all_reduce_for_norm`.
fn call(
    c: &ShmCollective,
    b: &mut Buffers,
    route: IpcRoute,
    fused: bool,
    change: impl Fn(&mut NormArgs, &mut Buffers),
) -> Result<bool, Error> {
    let mut args = NormArgs {
        sum: addr(&mut b.y),
        residual: addr(&mut b.residual),
        weight: addr(&mut b.weight),
        h: addr(&mut b.h),
        y: addr(&mut b.y),
        rows: ROWS,
        hidden: HIDDEN,
        eps: 1e-6,
        dtype: DType::F32,
    };
    change(&mut args, b);
    let engine = c.engine();
    let stream = engine.device().raw_stream(&()).expect("host stream");
    let io = Io::host(&b.x[..N], &mut b.y);
    // SAFETY: every address `args` names is one of `b`'s live host buffers (or inside one),
    // alive until the call returns (a host stream completes it before returning).
    unsafe {
        if fused {
            engine.enqueue_all_reduce_norm(io, Some(route), &args, stream)
        } else {
            engine.enqueue_all_reduce_for_norm(io, Some(route), &args, stream).map(|()| false)
        }
    }
}

#[test]
fn refused_arguments_write_nothing_and_the_next_call_is_right() {
    let comms = ShmCollective::group(2, ShmConfig::new(1 << 16)).expect("group");
    type Change = fn(&mut NormArgs, &mut Buffers);
    type Expected = fn(&Error) -> bool;
    let cases: [(&str, Change, Expected); 8] = [
        (
            "the sum apart from the output",
            |a, b| a.sum = addr(&mut b.other),
            |e| matches!(e, Error::InvalidArgument { argument: "sum", .. }),
        ),
        (
            "y apart from the output",
            |a, b| a.y = addr(&mut b.other),
            |e| matches!(e, Error::InvalidArgument { argument: "y", .. }),
        ),
        (
            "the residual is the output",
            |a, b| a.residual = addr(&mut b.y),
            |e| matches!(e, Error::ArgumentsOverlap { first: "y", second: "residual", .. }),
        ),
        (
            "h is the output",
            |a, b| a.h = addr(&mut b.y),
            |e| matches!(e, Error::ArgumentsOverlap { first: "y", second: "h", .. }),
        ),
        (
            "h over x",
            |a, b| a.h = addr(&mut b.x[3..]),
            |e| matches!(e, Error::ArgumentsOverlap { first: "x", second: "h", .. }),
        ),
        ("rows not the all_reduce's", |a, _| a.rows = ROWS - 1, |e| matches!(e, Error::LengthMismatch { .. })),
        ("another dtype", |a, _| a.dtype = DType::BF16, |e| matches!(e, Error::DtypeMismatch { .. })),
        ("eps NaN", |a, _| a.eps = f32::NAN, |e| matches!(e, Error::InvalidArgument { argument: "eps", .. })),
    ];
    for route in [IpcRoute::PushLl, IpcRoute::OneShot, IpcRoute::Push, IpcRoute::ReduceScatterAllGather] {
        for (what, change, expected) in cases {
            for fused in [true, false] {
                // Refused by the rank's own checks before any collective work: one rank alone.
                let mut b = Buffers::new(0);
                let before = b.bits();
                let e = call(&comms[0], &mut b, route, fused, change).expect_err(what);
                assert!(expected(&e), "{route:?}, {what}, fused {fused}: {e}");
                assert_eq!(b.bits(), before, "{route:?}, {what}, fused {fused}: a buffer was written");
            }
        }
        // Both ranks, the right arguments: the reference's bits.
        let got: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    s.spawn(move || {
                        let mut b = Buffers::new(r);
                        assert!(
                            call(c, &mut b, route, true, |_, _| ()).expect("the right call"),
                            "the engine took the norm"
                        );
                        (b.h, b.y)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        let xs: Vec<Vec<f32>> = (0..2).map(|r| Buffers::new(r).x[..N].to_vec()).collect();
        let refs: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
        let b = Buffers::new(0);
        let (mut h, mut y) = (vec![0.0f32; N], vec![0.0f32; N]);
        let shape = RmsNormShape { rows: ROWS, hidden: HIDDEN };
        residual_rmsnorm(&refs, &b.residual, &b.weight, 1e-6, shape, &mut h, &mut y).expect("reference");
        for (r, (gh, gy)) in got.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(gh), bits(&h), "{route:?} rank {r}: h");
            assert_eq!(bits(gy), bits(&y), "{route:?} rank {r}: y");
        }
    }
    for c in comms {
        c.close().expect("close");
    }
}
