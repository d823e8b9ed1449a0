//! The reference collectives: the tree shape, bit for bit, and argument checking.
use fixed_tree::{
    Element, Error, MAX_WORLD_SIZE, SUPPORTED_WORLD_SIZES, all_gather, cross_tp_leaves, reduce, reduce_scatter,
    reduce_scatter_many, tree_sum,
};
use half::{bf16, f16};

/// A tiny deterministic xorshift64 generator.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Bit patterns of `T` (its width), half of them arbitrary (specials included), half of them
/// moderate values of mixed sign and nearby exponents, so that the adds really round and cancel.
fn values<T: Element>(rng: &mut XorShift, n: usize) -> Vec<T> {
    (0..n)
        .map(|i| {
            let r = rng.next();
            if i % 2 == 0 {
                T::from_bits_u32(r as u32)
            } else {
                // A value in [-8, 8) of full precision, built from an f32, then rounded to T by
                // the type's own conversion (exactness of that conversion does not matter here).
                let x = (r as u32 >> 8) as f32 / (1u32 << 24) as f32 * 16.0 - 8.0;
                from_f32::<T>(x)
            }
        })
        .collect()
}

fn from_f32<T: Element>(x: f32) -> T {
    match T::NAME {
        "f32" => T::from_bits_u32(x.to_bits()),
        "f16" => T::from_bits_u32(u32::from(f16::from_f32(x).to_bits())),
        "bf16" => T::from_bits_u32(u32::from(bf16::from_f32(x).to_bits())),
        other => unreachable!("{other}"),
    }
}

/// Bitwise equality, except that any two NaNs are equal (payloads are not part of the contract).
fn same<T: Element>(a: T, b: T) -> bool {
    a.to_bits_u32() == b.to_bits_u32() || (a.is_nan() && b.is_nan())
}

#[track_caller]
fn assert_same<T: Element>(got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(same(*g, *w), "{} element {i}: got {:#x}, want {:#x}", T::NAME, g.to_bits_u32(), w.to_bits_u32());
    }
}

fn refs<T>(v: &[Vec<T>]) -> Vec<&[T]> {
    v.iter().map(Vec::as_slice).collect()
}

// ---------------------------------------------------------------------------------------------
// The tree shape.

/// `reduce` equals the hand-written tree for every world size, element by element.
fn hand_written_trees<T: Element>(seed: u64) {
    let mut rng = XorShift(seed);
    let n = 1000;
    let r: Vec<Vec<T>> = (0..8).map(|_| values(&mut rng, n)).collect();
    let add = T::add;
    for world in SUPPORTED_WORLD_SIZES {
        let ranks = refs(&r[..world]);
        let mut out = vec![from_f32::<T>(0.0); n];
        reduce(&ranks, &mut out).unwrap();
        let want: Vec<T> = (0..n)
            .map(|i| {
                let v = |k: usize| r[k][i];
                match world {
                    1 => v(0),
                    2 => add(v(0), v(1)),
                    4 => add(add(v(0), v(1)), add(v(2), v(3))),
                    8 => add(add(add(v(0), v(1)), add(v(2), v(3))), add(add(v(4), v(5)), add(v(6), v(7)))),
                    _ => unreachable!(),
                }
            })
            .collect();
        assert_same(&out, &want);
        // tree_sum is the same tree on one element's leaves.
        for i in 0..n {
            let leaves: Vec<T> = (0..world).map(|k| r[k][i]).collect();
            assert!(same(tree_sum(&leaves).unwrap(), want[i]));
        }
    }
}

#[test]
fn reduce_is_the_hand_written_tree_f32() {
    hand_written_trees::<f32>(1);
}

#[test]
fn reduce_is_the_hand_written_tree_f16() {
    hand_written_trees::<f16>(2);
}

#[test]
fn reduce_is_the_hand_written_tree_bf16() {
    hand_written_trees::<bf16>(3);
}

#[test]
fn f32_tree_uses_plain_f32_adds() {
    // For f32 the element add is the native one: the tree is the plain f32 expression.
    let mut rng = XorShift(4);
    let r: Vec<Vec<f32>> = (0..8).map(|_| values(&mut rng, 256)).collect();
    let mut out = vec![0.0f32; 256];
    reduce(&refs(&r), &mut out).unwrap();
    for (i, o) in out.iter().enumerate() {
        let v = |k: usize| r[k][i];
        let want = ((v(0) + v(1)) + (v(2) + v(3))) + ((v(4) + v(5)) + (v(6) + v(7)));
        assert!(same(*o, want));
    }
}

#[test]
fn balanced_tree_differs_from_left_fold() {
    // f32: balanced (1e20 + 1) + (-1e20 + 1) = 1e20 + -1e20 = 0; left fold ((1e20 + 1) - 1e20) + 1 = 1.
    let leaves = [1e20f32, 1.0, -1e20, 1.0];
    let ranks: Vec<&[f32]> = leaves.iter().map(std::slice::from_ref).collect();
    let mut out = [f32::NAN];
    reduce(&ranks, &mut out).unwrap();
    assert_eq!(out[0].to_bits(), 0.0f32.to_bits());
    let fold = leaves.iter().copied().reduce(|a, b| a + b).unwrap();
    assert_eq!(fold, 1.0);

    // f16: balanced (2048 + 1) + (1 + 1) = 2048 + 2 = 2050 (2049 is a tie to even 2048);
    // left fold ((2048 + 1) + 1) + 1 = 2048.
    let leaves = [2048.0f32, 1.0, 1.0, 1.0].map(f16::from_f32);
    let ranks: Vec<&[f16]> = leaves.iter().map(std::slice::from_ref).collect();
    let mut out = [f16::ZERO];
    reduce(&ranks, &mut out).unwrap();
    assert_eq!(out[0], f16::from_f32(2050.0));
    let fold = leaves.iter().copied().reduce(Element::add).unwrap();
    assert_eq!(fold, f16::from_f32(2048.0));

    // bf16 (ulp 2 at 256), 8 ranks, 256 and seven ones. Balanced:
    // ((256 + 1) + (1 + 1)) + ((1 + 1) + (1 + 1)) = (256 + 2) + 4 = 262 (257 ties to even 256);
    // the left fold ties back to 256 at every step.
    let leaves = [256.0f32, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0].map(bf16::from_f32);
    let ranks: Vec<&[bf16]> = leaves.iter().map(std::slice::from_ref).collect();
    let mut out = [bf16::ZERO];
    reduce(&ranks, &mut out).unwrap();
    assert_eq!(out[0], bf16::from_f32(262.0));
    let fold = leaves.iter().copied().reduce(Element::add).unwrap();
    assert_eq!(fold, bf16::from_f32(256.0));
}

#[test]
fn signed_zeros_and_specials_through_the_tree() {
    let nz = -0.0f32;
    let r0 = [nz, 0.0, f32::INFINITY, 1.0];
    let r1 = [nz, nz, f32::NEG_INFINITY, f32::NAN];
    let ranks: [&[f32]; 2] = [&r0, &r1];
    let mut out = [1.0f32; 4];
    reduce(&ranks, &mut out).unwrap();
    assert_eq!(out[0].to_bits(), nz.to_bits());
    assert_eq!(out[1].to_bits(), 0.0f32.to_bits());
    assert!(out[2].is_nan());
    assert!(out[3].is_nan());
}

#[test]
fn tree_sum_other_lengths() {
    // Every length from 1 to MAX_WORLD_SIZE has a tree (any_world.rs checks its shape); 0 and
    // anything above have none.
    for n in [0, MAX_WORLD_SIZE + 1, 2 * MAX_WORLD_SIZE] {
        assert_eq!(tree_sum(&vec![1.0f32; n]), None, "length {n}");
    }
    for n in [3, 5, 6, 7, 9, 16, MAX_WORLD_SIZE] {
        assert_eq!(tree_sum(&vec![1.0f32; n]), Some(n as f32), "length {n}");
    }
}

// ---------------------------------------------------------------------------------------------
// Argument errors leave the output untouched.

const SENTINEL: f32 = f32::from_bits(0x7fc0_dead);

fn untouched(out: &[f32]) -> bool {
    out.iter().all(|x| x.to_bits() == SENTINEL.to_bits())
}

#[test]
fn reduce_unsupported_world_sizes() {
    for world in [0, MAX_WORLD_SIZE + 1] {
        let data = vec![vec![1.0f32; 4]; world];
        let mut out = [SENTINEL; 4];
        assert_eq!(reduce(&refs(&data), &mut out), Err(Error::UnsupportedWorldSize { world }));
        assert!(untouched(&out), "world {world}");
    }
}

#[test]
fn reduce_length_mismatch() {
    // A rank shorter than rank 0.
    let data = vec![vec![1.0f32; 4], vec![1.0; 4], vec![1.0; 3], vec![1.0; 4]];
    let mut out = [SENTINEL; 4];
    assert!(matches!(reduce(&refs(&data), &mut out), Err(Error::LengthMismatch { expected: 4, got: 3, .. })));
    assert!(untouched(&out));
    // out of the wrong length, either way.
    let data = vec![vec![1.0f32; 4]; 2];
    for len in [3, 5] {
        let mut out = vec![SENTINEL; len];
        assert!(matches!(reduce(&refs(&data), &mut out), Err(Error::LengthMismatch { expected: 4, .. })));
        assert!(untouched(&out));
    }
}

#[test]
fn reduce_empty() {
    let data: Vec<Vec<f32>> = vec![vec![]; 8];
    let mut out: [f32; 0] = [];
    assert_eq!(reduce(&refs(&data), &mut out), Ok(()));
}

// ---------------------------------------------------------------------------------------------
// all_gather.

#[test]
fn all_gather_concatenates_in_rank_order() {
    for world in SUPPORTED_WORLD_SIZES {
        // Any Copy type: bytes here.
        let data: Vec<Vec<u8>> = (0..world).map(|r| (0..5).map(|i| (r * 10 + i) as u8).collect()).collect();
        let mut out = vec![0xffu8; 5 * world];
        all_gather(&refs(&data), &mut out).unwrap();
        let want: Vec<u8> = data.concat();
        assert_eq!(out, want);
    }
    // Floats move as bits, NaN payloads and -0 included.
    let data = vec![vec![f32::from_bits(0x7f80_0001), -0.0], vec![f32::from_bits(0xffc0_1234), 1.5]];
    let mut out = [0.0f32; 4];
    all_gather(&refs(&data), &mut out).unwrap();
    let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
    assert_eq!(bits, [0x7f80_0001, 0x8000_0000, 0xffc0_1234, 0x3fc0_0000]);
}

#[test]
fn all_gather_errors() {
    let data: Vec<Vec<f32>> = vec![];
    let mut out = [SENTINEL; 6];
    assert_eq!(all_gather(&refs(&data), &mut out), Err(Error::UnsupportedWorldSize { world: 0 }));
    assert!(untouched(&out));
    let data = vec![vec![1.0f32; 0]; MAX_WORLD_SIZE + 1];
    assert_eq!(all_gather(&refs(&data), &mut out), Err(Error::UnsupportedWorldSize { world: MAX_WORLD_SIZE + 1 }));
    assert!(untouched(&out));

    let data = vec![vec![1.0f32; 2], vec![1.0; 3]];
    let mut out = [SENTINEL; 4];
    assert!(matches!(all_gather(&refs(&data), &mut out), Err(Error::LengthMismatch { .. })));
    assert!(untouched(&out));

    let data = vec![vec![1.0f32; 2]; 2];
    let mut out = [SENTINEL; 5];
    assert!(matches!(all_gather(&refs(&data), &mut out), Err(Error::LengthMismatch { expected: 4, got: 5, .. })));
    assert!(untouched(&out));
}

// ---------------------------------------------------------------------------------------------
// reduce_scatter.

fn reduce_scatter_is_a_shard_of_reduce<T: Element>(seed: u64) {
    let mut rng = XorShift(seed);
    for world in SUPPORTED_WORLD_SIZES {
        let n = 24 * world;
        let data: Vec<Vec<T>> = (0..world).map(|_| values(&mut rng, n)).collect();
        let mut full = vec![from_f32::<T>(0.0); n];
        reduce(&refs(&data), &mut full).unwrap();
        for rank in 0..world {
            let mut shard = vec![from_f32::<T>(0.0); n / world];
            reduce_scatter(&refs(&data), rank, &mut shard).unwrap();
            assert_same(&shard, &full[rank * n / world..(rank + 1) * n / world]);
        }
    }
}

#[test]
fn reduce_scatter_shards() {
    reduce_scatter_is_a_shard_of_reduce::<f32>(10);
    reduce_scatter_is_a_shard_of_reduce::<f16>(11);
    reduce_scatter_is_a_shard_of_reduce::<bf16>(12);
}

#[test]
fn reduce_scatter_errors() {
    let data = vec![vec![1.0f32; 8]; 4];
    // Not divisible.
    let data6 = vec![vec![1.0f32; 6]; 4];
    let mut out = [SENTINEL; 2];
    assert_eq!(
        reduce_scatter(&refs(&data6), 0, &mut out),
        Err(Error::NotDivisible { argument: "ranks[r]", len: 6, world: 4 })
    );
    assert!(untouched(&out));
    // Rank out of range.
    for rank in [4, 5, usize::MAX] {
        let mut out = [SENTINEL; 2];
        assert_eq!(reduce_scatter(&refs(&data), rank, &mut out), Err(Error::RankOutOfRange { rank, world: 4 }));
        assert!(untouched(&out));
    }
    // Wrong shard length.
    let mut out = [SENTINEL; 3];
    assert!(matches!(
        reduce_scatter(&refs(&data), 1, &mut out),
        Err(Error::LengthMismatch { expected: 2, got: 3, .. })
    ));
    assert!(untouched(&out));
    // Unsupported worlds.
    for world in [0, MAX_WORLD_SIZE + 1] {
        let data = vec![vec![1.0f32; 0]; world];
        let mut out = [SENTINEL; 2];
        assert_eq!(reduce_scatter(&refs(&data), 0, &mut out), Err(Error::UnsupportedWorldSize { world }));
        assert!(untouched(&out));
    }
}

// ---------------------------------------------------------------------------------------------
// reduce_scatter_many.

#[test]
fn reduce_scatter_many_lanes_never_mix() {
    let mut rng = XorShift(20);
    let world = 4;
    // Lanes of different lengths and contents.
    let lanes: Vec<Vec<Vec<f32>>> =
        [8usize, 0, 4, 40].iter().map(|&n| (0..world).map(|_| values(&mut rng, n)).collect()).collect();
    let lane_refs: Vec<Vec<&[f32]>> = lanes.iter().map(|l| refs(l)).collect();
    let lane_refs: Vec<&[&[f32]]> = lane_refs.iter().map(Vec::as_slice).collect();
    for rank in 0..world {
        let mut outs: Vec<Vec<f32>> = lanes.iter().map(|l| vec![SENTINEL; l[0].len() / world]).collect();
        let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        reduce_scatter_many(&lane_refs, rank, &mut out_refs).unwrap();
        for (lane, out) in lane_refs.iter().zip(&outs) {
            let mut want = vec![0.0f32; out.len()];
            reduce_scatter(lane, rank, &mut want).unwrap();
            assert_same(out, &want);
        }
    }
}

#[test]
fn reduce_scatter_many_half_types() {
    fn run<T: Element>(seed: u64) {
        let mut rng = XorShift(seed);
        let world = 8;
        let lanes: Vec<Vec<Vec<T>>> =
            [16usize, 64].iter().map(|&n| (0..world).map(|_| values(&mut rng, n)).collect()).collect();
        let lane_refs: Vec<Vec<&[T]>> = lanes.iter().map(|l| refs(l)).collect();
        let lane_refs: Vec<&[&[T]]> = lane_refs.iter().map(Vec::as_slice).collect();
        for rank in 0..world {
            let mut outs: Vec<Vec<T>> = lanes.iter().map(|l| vec![from_f32::<T>(0.0); l[0].len() / world]).collect();
            let mut out_refs: Vec<&mut [T]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            reduce_scatter_many(&lane_refs, rank, &mut out_refs).unwrap();
            for (lane, out) in lane_refs.iter().zip(&outs) {
                let mut want = vec![from_f32::<T>(0.0); out.len()];
                reduce_scatter(lane, rank, &mut want).unwrap();
                assert_same(out, &want);
            }
        }
    }
    run::<f16>(21);
    run::<bf16>(22);
}

/// Runs reduce_scatter_many over `lanes` with outputs of `out_lens`, checks the error, and that
/// no output was written.
#[track_caller]
fn many_fails(lanes: &[Vec<Vec<f32>>], rank: usize, out_lens: &[usize], want: &dyn Fn(&Error) -> bool) {
    let lane_refs: Vec<Vec<&[f32]>> = lanes.iter().map(|l| refs(l)).collect();
    let lane_refs: Vec<&[&[f32]]> = lane_refs.iter().map(Vec::as_slice).collect();
    let mut outs: Vec<Vec<f32>> = out_lens.iter().map(|&n| vec![SENTINEL; n]).collect();
    let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
    let err = reduce_scatter_many(&lane_refs, rank, &mut out_refs).unwrap_err();
    assert!(want(&err), "unexpected error {err:?}");
    for (l, out) in outs.iter().enumerate() {
        assert!(untouched(out), "lane {l} was written");
    }
}

#[test]
fn reduce_scatter_many_errors_write_nothing() {
    let good = || vec![vec![1.0f32; 8]; 4];
    // A lane that does not divide, last.
    many_fails(&[good(), good(), vec![vec![1.0; 6]; 4]], 0, &[2, 2, 1], &|e| {
        matches!(e, Error::NotDivisible { len: 6, world: 4, .. })
    });
    // A lane with a rank of the wrong length, in the middle.
    let mut ragged = good();
    ragged[3].pop();
    many_fails(&[good(), ragged, good()], 1, &[2, 2, 2], &|e| matches!(e, Error::LengthMismatch { .. }));
    // A lane with another world size (still a supported one).
    many_fails(&[good(), vec![vec![1.0; 8]; 2]], 0, &[2, 4], &|e| matches!(e, Error::LengthMismatch { .. }));
    // A lane with another world size that is not a power of two.
    many_fails(&[good(), vec![vec![1.0; 9]; 3]], 0, &[2, 3], &|e| matches!(e, Error::LengthMismatch { .. }));
    // A lane with an unsupported world size.
    many_fails(&[good(), vec![]], 0, &[2, 0], &|e| matches!(e, Error::UnsupportedWorldSize { world: 0 }));
    many_fails(&[vec![], good()], 0, &[0, 2], &|e| matches!(e, Error::UnsupportedWorldSize { world: 0 }));
    // A wrong output length, last.
    many_fails(&[good(), good()], 2, &[2, 3], &|e| matches!(e, Error::LengthMismatch { expected: 2, got: 3, .. }));
    // Rank out of range.
    many_fails(&[good(), good()], 4, &[2, 2], &|e| *e == Error::RankOutOfRange { rank: 4, world: 4 });
    // Fewer outputs than lanes, and more.
    many_fails(&[good(), good()], 0, &[2], &|e| matches!(e, Error::LengthMismatch { expected: 2, got: 1, .. }));
    many_fails(&[good()], 0, &[2, 2], &|e| matches!(e, Error::LengthMismatch { expected: 1, got: 2, .. }));
}

#[test]
fn reduce_scatter_many_no_lanes() {
    let lanes: [&[&[f32]]; 0] = [];
    let mut outs: [&mut [f32]; 0] = [];
    assert_eq!(reduce_scatter_many(&lanes, 0, &mut outs), Ok(()));
}

// ---------------------------------------------------------------------------------------------
// cross_tp_leaves argument checks (the invariant itself is in cross_tp.rs).

#[test]
fn cross_tp_leaves_errors() {
    let leaves = vec![vec![1.0f32; 4]; 8];
    for ranks in [0, 3, 5, 16] {
        assert_eq!(cross_tp_leaves(&refs(&leaves), ranks), Err(Error::UnsupportedTpSplit { leaves: 8, ranks }));
    }
    let four = vec![vec![1.0f32; 4]; 4];
    assert_eq!(cross_tp_leaves(&refs(&four), 2), Err(Error::UnsupportedTpSplit { leaves: 4, ranks: 2 }));
    let mut ragged = leaves.clone();
    ragged[5].push(1.0);
    assert!(matches!(cross_tp_leaves(&refs(&ragged), 4), Err(Error::LengthMismatch { .. })));
}

#[test]
fn cross_tp_leaves_shape() {
    let leaves: Vec<Vec<f32>> = (0..8).map(|k| vec![(1u32 << k) as f32; 3]).collect();
    for ranks in SUPPORTED_WORLD_SIZES {
        let split = cross_tp_leaves(&refs(&leaves), ranks).unwrap();
        assert_eq!(split.len(), ranks);
        for (j, s) in split.iter().enumerate() {
            // Rank j holds the sum of leaves [j*8/ranks, (j+1)*8/ranks): powers of two, exact.
            let want: f32 = (j * 8 / ranks..(j + 1) * 8 / ranks).map(|k| (1u32 << k) as f32).sum();
            assert_eq!(s, &vec![want; 3]);
        }
    }
}

#[test]
fn errors_display() {
    let msgs = [
        Error::UnsupportedWorldSize { world: 3 }.to_string(),
        Error::LengthMismatch { argument: "out", expected: 4, got: 3 }.to_string(),
        Error::NotDivisible { argument: "ranks[r]", len: 6, world: 4 }.to_string(),
        Error::RankOutOfRange { rank: 4, world: 4 }.to_string(),
        Error::UnsupportedTpSplit { leaves: 4, ranks: 2 }.to_string(),
    ];
    for m in &msgs {
        assert!(!m.is_empty());
    }
    assert!(msgs[0].contains('3'));
    assert!(msgs[0].contains(&MAX_WORLD_SIZE.to_string()));
    assert!(msgs[1].contains("out"));
}
