//! The cases. Each runs the same calls on every rank and checks this rank's output.
use super::SUITE_CAPACITY;
use super::data::{Rng, compare, cross_tp_inputs, finite_values, reference_reduce, special_values};
use super::harness::{RankEnv, TestBackend};
use crate::{Collective, DType, Error, Io, Op, RawMut, RawRef};

/// Bytes around every output view that must stay untouched.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;
const JUNK_BYTE: u8 = 0x5A;

/// Runs case `case` of the suite on a fresh world of `world` ranks of `backend`; panics with
/// every failing rank's message.
pub fn run_case<B: TestBackend>(backend: &B, case: &str, world: usize, test: &str) {
    let f: fn(&mut B::Rank) -> Result<(), String> = match case {
        "all_reduce" => all_reduce::<B::Rank>,
        "all_gather" => all_gather::<B::Rank>,
        "reduce_scatter" => reduce_scatter::<B::Rank>,
        "reduce_scatter_many" => reduce_scatter_many::<B::Rank>,
        "unaligned_views" => unaligned_views::<B::Rank>,
        "empty_and_tiny" => empty_and_tiny::<B::Rank>,
        "special_values" => special::<B::Rank>,
        "cross_tp" => cross_tp::<B::Rank>,
        "repeats" => repeats::<B::Rank>,
        "randomized_sequence" => randomized_sequence::<B::Rank>,
        "validation" => validation::<B::Rank>,
        "above_capacity" => above_capacity::<B::Rank>,
        other => panic!("unknown conformance case {other}"),
    };
    if let Err(e) = backend.run(world, SUITE_CAPACITY, test, &f) {
        panic!("conformance case `{case}` failed on {} with world {world}:\n{e}", backend.name());
    }
}

/// Collects check failures so a rank keeps making the calls its peers expect.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, what: impl FnOnce() -> String, r: Result<(), String>) {
        if let Err(e) = r
            && self.0.len() < 8
        {
            self.0.push(format!("{}: {e}", what()));
        }
    }
    fn finish(self) -> Result<(), String> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0.join("\n")) }
    }
}

/// One call of a single-lane op, its inputs on every rank given, checked against the reference.
#[derive(Debug, Clone, Copy)]
struct Spec {
    op: Op,
    dtype: DType,
    in_place: bool,
    /// Element offsets of the input and output views from an aligned base.
    in_off: usize,
    out_off: usize,
}

pub(crate) fn expected(op: Op, inputs: &[Vec<u8>], dtype: DType, rank: usize) -> Vec<u8> {
    let world = inputs.len();
    match op {
        Op::AllReduce => reference_reduce(inputs, dtype),
        Op::AllGather => inputs.concat(),
        Op::ReduceScatter | Op::ReduceScatterMany => {
            let full = reference_reduce(inputs, dtype);
            let shard = full.len() / world;
            full[rank * shard..(rank + 1) * shard].to_vec()
        }
    }
}

pub(crate) fn call<C: Collective>(c: &C, op: Op, io: Io<'_>, stream: &C::Stream) -> Result<(), Error> {
    match op {
        Op::AllReduce => c.all_reduce(io, stream),
        Op::AllGather => c.all_gather(io, stream),
        Op::ReduceScatter => c.reduce_scatter(io, stream),
        Op::ReduceScatterMany => c.reduce_scatter_many(&[io], stream),
    }
}

fn check_guards(buf: &[u8], lo: usize, hi: usize) -> Result<(), String> {
    if let Some(i) = buf[..lo].iter().chain(&buf[hi..]).position(|&b| b != GUARD_BYTE) {
        return Err(format!("wrote outside the output view (guard byte {i} changed)"));
    }
    Ok(())
}

/// Runs `spec` with every rank's input in `inputs`; checks output and guards into `fails`.
/// A collective error is returned (the rank cannot go on); a wrong result is recorded.
fn run_op<R: RankEnv>(env: &mut R, spec: Spec, inputs: &[Vec<u8>], fails: &mut Failures) -> Result<(), String> {
    let rank = env.comm().rank();
    let world = inputs.len();
    let size = spec.dtype.size();
    let mine = &inputs[rank];
    let n = mine.len() / size;
    let want = expected(spec.op, inputs, spec.dtype, rank);
    let out_bytes = want.len();
    let label = || format!("{:?} rank {rank} n {n}", spec);
    let result = if spec.in_place {
        // The buffer holds the op's in-place layout; the result lands at the NCCL position.
        let (buf_len, init, res_at) = match spec.op {
            Op::AllReduce => (n, mine.clone(), 0),
            Op::AllGather => {
                let mut b = vec![JUNK_BYTE; n * world * size];
                b[rank * n * size..(rank + 1) * n * size].copy_from_slice(mine);
                (n * world, b, 0)
            }
            _ => (n, mine.clone(), rank * (n / world) * size),
        };
        let lo = GUARD + spec.out_off * size;
        let mut buf = env.alloc(lo + buf_len * size + GUARD);
        let mut img = vec![GUARD_BYTE; lo + buf_len * size + GUARD];
        img[lo..lo + buf_len * size].copy_from_slice(&init);
        env.write(&mut buf, &img);
        let io = Io::InPlace(env.view_mut(&mut buf, lo, buf_len, spec.dtype));
        call(env.comm(), spec.op, io, env.stream()).map_err(|e| format!("{}: {e}", label()))?;
        let got = env.read(&buf);
        fails.check(label, check_guards(&got, lo, lo + buf_len * size));
        // Other shards of an in-place reduce_scatter buffer are unspecified; only ours is checked.
        compare(&got[lo + res_at..lo + res_at + out_bytes], &want, spec.dtype)
    } else {
        let in_lo = spec.in_off * size;
        let mut input = env.alloc(in_lo + mine.len());
        let mut img = vec![JUNK_BYTE; in_lo];
        img.extend_from_slice(mine);
        env.write(&mut input, &img);
        let lo = GUARD + spec.out_off * size;
        let mut output = env.alloc(lo + out_bytes + GUARD);
        env.write(&mut output, &vec![GUARD_BYTE; lo + out_bytes + GUARD]);
        let io = Io::OutOfPlace {
            input: env.view(&input, in_lo, n, spec.dtype),
            output: env.view_mut(&mut output, lo, out_bytes / size, spec.dtype),
        };
        call(env.comm(), spec.op, io, env.stream()).map_err(|e| format!("{}: {e}", label()))?;
        let got = env.read(&output);
        fails.check(label, check_guards(&got, lo, lo + out_bytes));
        let after = env.read(&input);
        fails.check(label, if after == img { Ok(()) } else { Err("modified its input".into()) });
        compare(&got[lo..lo + out_bytes], &want, spec.dtype)
    };
    fails.check(label, result);
    Ok(())
}

fn random_inputs(dtype: DType, n: usize, world: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..world).map(|r| finite_values(dtype, n, seed ^ (r as u64) << 32)).collect()
}

/// Element counts up to capacity, multiples of `world` when the op scatters.
fn sizes(op: Op, dtype: DType, world: usize) -> Vec<usize> {
    let max = SUITE_CAPACITY / dtype.size();
    let mut v = vec![1, 3, 17, 256, 1000, 4099, max / 3, max - 1, max];
    if matches!(op, Op::ReduceScatter | Op::ReduceScatterMany) {
        v = v.into_iter().map(|n| (n / world).max(1) * world).collect();
    }
    v
}

fn all_ops_case<R: RankEnv>(env: &mut R, op: Op, dtypes: &[DType]) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    for &dtype in dtypes {
        for (k, n) in sizes(op, dtype, world).into_iter().enumerate() {
            for in_place in [false, true] {
                let inputs = random_inputs(dtype, n, world, (k as u64) << 8 | dtype as u64);
                run_op(env, Spec { op, dtype, in_place, in_off: 0, out_off: 0 }, &inputs, &mut fails)?;
            }
        }
    }
    fails.finish()
}

fn all_reduce<R: RankEnv>(env: &mut R) -> Result<(), String> {
    all_ops_case(env, Op::AllReduce, &DType::REDUCIBLE)
}

fn all_gather<R: RankEnv>(env: &mut R) -> Result<(), String> {
    all_ops_case(env, Op::AllGather, &[DType::F32, DType::F16, DType::BF16, DType::U8, DType::I64, DType::F64])
}

fn reduce_scatter<R: RankEnv>(env: &mut R) -> Result<(), String> {
    all_ops_case(env, Op::ReduceScatter, &DType::REDUCIBLE)
}

fn reduce_scatter_many<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    for dtype in DType::REDUCIBLE {
        for (k, lane_sizes) in
            [vec![world], vec![16 * world, 3 * world], vec![world, 1000 * world, 7 * world]].into_iter().enumerate()
        {
            run_many(env, dtype, &lane_sizes, (k * 16) as u64 ^ 0xABC, &mut fails)?;
        }
        // No lanes at all is a valid, empty call.
        env.comm()
            .reduce_scatter_many(&[], env.stream())
            .map_err(|e| format!("reduce_scatter_many of no lanes: {e}"))?;
    }
    fails.finish()
}

/// One `reduce_scatter_many` of lanes of `lane_sizes` elements (lane 0 in place when there are
/// several lanes, the rest out of place), every lane's shard checked into `fails`.
fn run_many<R: RankEnv>(
    env: &mut R,
    dtype: DType,
    lane_sizes: &[usize],
    seed: u64,
    fails: &mut Failures,
) -> Result<(), String> {
    let rank = env.comm().rank();
    let world = env.comm().world_size();
    let size = dtype.size();
    let lanes_in: Vec<Vec<Vec<u8>>> =
        lane_sizes.iter().enumerate().map(|(l, &n)| random_inputs(dtype, n, world, l as u64 + seed)).collect();
    let mut bufs = Vec::new();
    for (l, lane) in lanes_in.iter().enumerate() {
        let n = lane[rank].len() / size;
        let in_place = l == 0 && lane_sizes.len() > 1;
        let mut input = env.alloc(lane[rank].len());
        env.write(&mut input, &lane[rank]);
        let out_len = if in_place { 0 } else { GUARD * 2 + n / world * size };
        let mut output = env.alloc(out_len);
        env.write(&mut output, &vec![GUARD_BYTE; out_len]);
        bufs.push((input, output, in_place, n));
    }
    let mut ios = Vec::new();
    for (input, output, in_place, n) in bufs.iter_mut() {
        ios.push(if *in_place {
            Io::InPlace(env.view_mut(input, 0, *n, dtype))
        } else {
            Io::OutOfPlace {
                input: env.view(input, 0, *n, dtype),
                output: env.view_mut(output, GUARD, *n / world, dtype),
            }
        });
    }
    env.comm()
        .reduce_scatter_many(&ios, env.stream())
        .map_err(|e| format!("reduce_scatter_many {lane_sizes:?}: {e}"))?;
    drop(ios);
    for (l, (input, output, in_place, n)) in bufs.iter().enumerate() {
        let want = expected(Op::ReduceScatter, &lanes_in[l], dtype, rank);
        let label = || format!("reduce_scatter_many {dtype} lanes {lane_sizes:?} lane {l}");
        let shard = n / world * size;
        let got = if *in_place {
            env.read(input)[rank * shard..(rank + 1) * shard].to_vec()
        } else {
            let all = env.read(output);
            fails.check(label, check_guards(&all, GUARD, GUARD + shard));
            all[GUARD..GUARD + shard].to_vec()
        };
        fails.check(label, compare(&got, &want, dtype));
    }
    Ok(())
}

fn unaligned_views<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
        for dtype in DType::REDUCIBLE {
            for (in_off, out_off) in [(1, 0), (0, 1), (3, 5), (1, 1)] {
                for n in [world, 7 * world, 1001 * world] {
                    for in_place in [false, true] {
                        let inputs = random_inputs(dtype, n, world, (n + in_off * 7 + out_off) as u64);
                        let spec = Spec { op, dtype, in_place, in_off, out_off };
                        run_op(env, spec, &inputs, &mut fails)?;
                    }
                }
            }
        }
    }
    fails.finish()
}

fn empty_and_tiny<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    for dtype in DType::REDUCIBLE {
        for in_place in [false, true] {
            let spec = Spec { op: Op::AllGather, dtype, in_place, in_off: 0, out_off: 0 };
            run_op(env, spec, &vec![Vec::new(); world], &mut fails)?;
            let spec = Spec { op: Op::AllReduce, ..spec };
            run_op(env, spec, &vec![Vec::new(); world], &mut fails)?;
            run_op(env, spec, &random_inputs(dtype, 1, world, 5), &mut fails)?;
            let spec = Spec { op: Op::ReduceScatter, ..spec };
            run_op(env, spec, &vec![Vec::new(); world], &mut fails)?;
            run_op(env, spec, &random_inputs(dtype, world, world, 6), &mut fails)?;
        }
    }
    fails.finish()
}

fn special<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    for dtype in DType::REDUCIBLE {
        let n = 16 * 16 * 16 * world;
        let inputs: Vec<Vec<u8>> = (0..world).map(|r| special_values(dtype, n, r)).collect();
        for op in [Op::AllReduce, Op::ReduceScatter] {
            for in_place in [false, true] {
                run_op(env, Spec { op, dtype, in_place, in_off: 0, out_off: 0 }, &inputs, &mut fails)?;
            }
        }
    }
    fails.finish()
}

fn cross_tp<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let rank = env.comm().rank();
    if !crate::SUPPORTED_WORLD_SIZES.contains(&world) {
        // Eight leaves split evenly only over power-of-two TP sizes (docs/contract.md): the
        // canonical tree of this world is what the other cases check.
        if rank == 0 {
            super::skip(&format!("cross_tp at world {world}: cross-TP invariance is a power-of-two property"));
        }
        return Ok(());
    }
    let mut fails = Failures::default();
    for dtype in DType::REDUCIBLE {
        for n in [8, 4096] {
            let leaves = random_inputs(dtype, n, 8, 0xC7 + n as u64);
            let tp8 = reference_reduce(&leaves, dtype);
            let inputs = cross_tp_inputs(&leaves, world, dtype);
            for op in [Op::AllReduce, Op::ReduceScatter] {
                let spec = Spec { op, dtype, in_place: false, in_off: 0, out_off: 0 };
                // The TP=world result must equal the TP=8 tree of the leaves.
                let shard = tp8.len() / if op == Op::AllReduce { 1 } else { world };
                let want = &tp8[rank * shard * usize::from(op != Op::AllReduce)..][..shard];
                fails.check(
                    || format!("cross-TP reference {dtype}"),
                    compare(&expected(op, &inputs, dtype, rank), want, dtype),
                );
                run_op(env, spec, &inputs, &mut fails)?;
            }
        }
    }
    fails.finish()
}

fn repeats<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    let dtype = DType::BF16;
    let n = 4096 * world;
    let inputs = random_inputs(dtype, n, world, 99);
    for _ in 0..25 {
        for op in [Op::AllReduce, Op::ReduceScatter, Op::AllGather] {
            run_op(env, Spec { op, dtype, in_place: false, in_off: 0, out_off: 0 }, &inputs, &mut fails)?;
        }
    }
    fails.finish()
}

fn randomized_sequence<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    let mut rng = Rng::new(0x5EED);
    for i in 0..60 {
        let op = [Op::AllReduce, Op::AllGather, Op::ReduceScatter][rng.below(3)];
        let dtype = DType::REDUCIBLE[rng.below(3)];
        let max = SUITE_CAPACITY / dtype.size() / world;
        let n = (1 + rng.below(max)) * if op == Op::ReduceScatter { world } else { 1 };
        let in_place = rng.below(2) == 0;
        let inputs = random_inputs(dtype, n, world, i);
        run_op(env, Spec { op, dtype, in_place, in_off: rng.below(3), out_off: rng.below(3) }, &inputs, &mut fails)?;
    }
    fails.finish()
}

/// Every invalid call fails with its typed error before any work and writes nothing; the
/// collective keeps working afterwards.
fn validation<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let mut fails = Failures::default();
    let cap = SUITE_CAPACITY;
    let mut a = env.alloc(cap + 64);
    let mut b = env.alloc(cap * 8 + 64);
    env.write(&mut a, &vec![GUARD_BYTE; cap + 64]);
    env.write(&mut b, &vec![GUARD_BYTE; cap * 8 + 64]);
    let f32_ = DType::F32;
    type Check = fn(&Error) -> bool;
    type Case = (&'static str, Op, usize, usize, DType, DType, usize, Check);
    let cases: Vec<Case> = vec![
        // (label, op, input elements, output elements, input dtype, output dtype, output byte offset, expected)
        ("wrong output length", Op::AllReduce, 10, 11, f32_, f32_, 0, |e| {
            matches!(e, Error::LengthMismatch { argument: "output", .. })
        }),
        ("reduce of u8", Op::AllReduce, 10, 10, DType::U8, DType::U8, 0, |e| {
            matches!(e, Error::UnsupportedDtype { .. })
        }),
        ("dtype mismatch", Op::AllReduce, 10, 10, f32_, DType::F16, 0, |e| matches!(e, Error::DtypeMismatch { .. })),
        ("gather output length", Op::AllGather, 10, 10 * world + 1, f32_, f32_, 0, |e| {
            matches!(e, Error::LengthMismatch { .. })
        }),
        ("scatter not divisible", Op::ReduceScatter, 8 * world + 1, 8, f32_, f32_, 0, |e| {
            matches!(e, Error::NotDivisible { .. })
        }),
        ("scatter output length", Op::ReduceScatter, 8 * world, 9, f32_, f32_, 0, |e| {
            matches!(e, Error::LengthMismatch { .. })
        }),
        ("misaligned output", Op::AllReduce, 10, 10, f32_, f32_, 2, |e| {
            matches!(e, Error::Misaligned { argument: "output", .. })
        }),
    ];
    for (label, op, n_in, n_out, din, dout, off, ok) in cases {
        if world == 1 && label == "scatter not divisible" {
            continue;
        }
        let io = Io::OutOfPlace { input: env.view(&a, 0, n_in, din), output: env.view_mut(&mut b, off, n_out, dout) };
        let r = call(env.comm(), op, io, env.stream());
        fails.check(
            || label.to_string(),
            match r {
                Err(e) if ok(&e) => Ok(()),
                Err(e) => Err(format!("wrong error: {e}")),
                Ok(()) => Err("accepted".into()),
            },
        );
    }
    over_capacity(env, &mut fails)?;
    // Overlapping input and output.
    let base = env.view_mut(&mut b, 0, 128, f32_).addr();
    // SAFETY: both views lie inside `b`, which outlives the call; the call must reject them.
    let io = unsafe {
        Io::OutOfPlace { input: RawRef::from_raw(base, 64, f32_), output: RawMut::from_raw(base + 128, 64, f32_) }
    };
    fails.check(
        || "overlap".into(),
        match env.comm().all_reduce(io, env.stream()) {
            Err(Error::Overlap { .. }) => Ok(()),
            other => Err(format!("expected Overlap, got {other:?}")),
        },
    );
    // Lanes of different dtypes.
    let mut c = env.alloc(4096);
    let mut d = env.alloc(4096);
    env.write(&mut c, &[GUARD_BYTE; 4096]);
    env.write(&mut d, &[GUARD_BYTE; 4096]);
    let lanes = [
        Io::OutOfPlace { input: env.view(&a, 0, 8 * world, f32_), output: env.view_mut(&mut c, 0, 8, f32_) },
        Io::OutOfPlace {
            input: env.view(&a, 64, 8 * world, DType::F16),
            output: env.view_mut(&mut d, 0, 8, DType::F16),
        },
    ];
    fails.check(
        || "lanes of two dtypes".into(),
        match env.comm().reduce_scatter_many(&lanes, env.stream()) {
            Err(Error::DtypeMismatch { .. }) => Ok(()),
            other => Err(format!("expected DtypeMismatch, got {other:?}")),
        },
    );
    let untouched = env.read(&c).iter().chain(env.read(&d).iter()).all(|&x| x == GUARD_BYTE);
    fails.check(|| "lanes untouched".into(), if untouched { Ok(()) } else { Err("a rejected lane call wrote".into()) });
    let got = env.read(&b);
    fails.check(
        || "output untouched after rejected calls".into(),
        if got.iter().all(|&x| x == GUARD_BYTE) { Ok(()) } else { Err("an invalid call wrote its output".into()) },
    );
    // The collective still works.
    let inputs = random_inputs(f32_, 64 * world, world, 3);
    run_op(env, Spec { op: Op::AllReduce, dtype: f32_, in_place: false, in_off: 0, out_off: 0 }, &inputs, &mut fails)?;
    fails.finish()
}

/// A call just above capacity on a backend that does not promise it
/// ([`crate::Capabilities::max_call_bytes`]): refused with `CapacityExceeded` and nothing
/// written, or (a backend may accept more than it promises) the right bits. Backends that
/// promise it are checked by `above_capacity`.
fn over_capacity<R: RankEnv>(env: &mut R, fails: &mut Failures) -> Result<(), String> {
    let (rank, world) = (env.comm().rank(), env.comm().world_size());
    let (dtype, n) = (DType::F32, SUITE_CAPACITY / 4 + 1);
    if env.comm().capabilities().max_call_bytes >= n * 4 {
        return Ok(());
    }
    let inputs = random_inputs(dtype, n, world, 0x0C);
    let mut input = env.alloc(n * 4);
    env.write(&mut input, &inputs[rank]);
    let mut output = env.alloc(n * 4);
    env.write(&mut output, &vec![GUARD_BYTE; n * 4]);
    let io = Io::OutOfPlace { input: env.view(&input, 0, n, dtype), output: env.view_mut(&mut output, 0, n, dtype) };
    let r = env.comm().all_reduce(io, env.stream());
    let got = env.read(&output);
    let label = || "over capacity".to_string();
    match r {
        Err(Error::CapacityExceeded { .. }) => fails.check(
            label,
            if got.iter().all(|&x| x == GUARD_BYTE) { Ok(()) } else { Err("a refused call wrote".into()) },
        ),
        Err(e) => fails.check(label, Err(format!("wrong error: {e}"))),
        Ok(()) => fails.check(label, compare(&got, &expected(Op::AllReduce, &inputs, dtype, rank), dtype)),
    }
    Ok(())
}

/// Calls above the suite's staging capacity (just above, and 3.25x with an unaligned tail and
/// unaligned views), and `reduce_scatter_many` with a lane above capacity and with lanes that
/// fit only one by one: the bits of one call. Only sizes the backend promises
/// ([`crate::Capabilities::max_call_bytes`]) are made; the IPC backends promise every size and
/// run these in chunks of their staging.
fn above_capacity<R: RankEnv>(env: &mut R) -> Result<(), String> {
    let world = env.comm().world_size();
    let max = env.comm().capabilities().max_call_bytes;
    let mut fails = Failures::default();
    let cases: [(Op, &[DType]); 3] = [
        (Op::AllReduce, &DType::REDUCIBLE),
        (Op::AllGather, &[DType::F32, DType::U8, DType::F64]),
        (Op::ReduceScatter, &DType::REDUCIBLE),
    ];
    for (op, dtypes) in cases {
        for &dtype in dtypes {
            let size = dtype.size();
            for (k, n) in [SUITE_CAPACITY / size + 1, SUITE_CAPACITY * 13 / 4 / size + 7].into_iter().enumerate() {
                let n = if op == Op::ReduceScatter { n.div_ceil(world) * world } else { n };
                if n * size > max {
                    continue;
                }
                for in_place in [false, true] {
                    let inputs = random_inputs(dtype, n, world, (k as u64) << 12 | dtype as u64 | (op as u64) << 8);
                    let spec = Spec { op, dtype, in_place, in_off: k, out_off: 3 * k };
                    run_op(env, spec, &inputs, &mut fails)?;
                }
            }
        }
    }
    for dtype in DType::REDUCIBLE {
        let per_frame = SUITE_CAPACITY / dtype.size() / world;
        for (k, lane_sizes) in [
            vec![16 * world, (per_frame + 3) * world, 5 * world],
            vec![per_frame / 2 * world, (per_frame * 2 / 3) * world, per_frame / 2 * world],
        ]
        .into_iter()
        .enumerate()
        {
            if lane_sizes.iter().sum::<usize>() * dtype.size() > max {
                continue;
            }
            run_many(env, dtype, &lane_sizes, (k * 16) as u64 ^ 0xCAB, &mut fails)?;
        }
    }
    fails.finish()
}
