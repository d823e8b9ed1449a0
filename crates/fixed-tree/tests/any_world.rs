//! The canonical tree at every world size: the reference functions against an independent
//! recursive evaluation of the definition, bit for bit, on adversarial values; the written-out
//! balanced formula at 1/2/4/8 ranks; and the exact shape `tree_expression` renders.
//!
//! The definition, as this file implements it on its own: one rank is the leaf; otherwise the
//! first `m` ranks (`m` the largest power of two strictly below `W`) are the left subtree, the
//! rest the right one, and the node is `left + right`, one add in the element's dtype.
//!
//! Results are compared by `to_bits`; where the expected value is a NaN, only "is NaN" is
//! checked, as everywhere in this crate (NaN payloads are not part of the contract, and Rust
//! does not promise the payload of a NaN an add returns).
use fixed_tree::{
    Element, Error, MAX_WORLD_SIZE, all_gather, reduce, reduce_scatter, reduce_scatter_many, tree_expression, tree_sum,
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
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

// ---------------------------------------------------------------------------------------------
// The definition, written independently of the crate.

/// Where the tree of `n >= 2` ranks splits: the largest power of two strictly below `n`.
fn canonical_split(n: usize) -> usize {
    let mut m = 1;
    while 2 * m < n {
        m *= 2;
    }
    m
}

/// The tree over `v` that splits `n` leaves at `split(n)`, evaluated recursively.
fn eval_split<T: Element>(v: &[T], split: &dyn Fn(usize) -> usize) -> T {
    if v.len() == 1 {
        return v[0];
    }
    let m = split(v.len());
    eval_split(&v[..m], split).add(eval_split(&v[m..], split))
}

/// The canonical tree, straight from the definition.
fn naive<T: Element>(v: &[T]) -> T {
    eval_split(v, &canonical_split)
}

/// The tree of ranks `lo..hi` that splits at `split`, written as `tree_expression` writes it.
fn render_split(lo: usize, hi: usize, outer: bool, split: &dyn Fn(usize) -> usize) -> String {
    if hi - lo == 1 {
        return format!("r{lo}");
    }
    let mid = lo + split(hi - lo);
    let body = format!("{}+{}", render_split(lo, mid, false, split), render_split(mid, hi, false, split));
    if outer { body } else { format!("({body})") }
}

/// Evaluates an expression as `tree_expression` writes it over `leaves`: `a+b` at the top,
/// every inner add in parentheses, leaves `r<k>`.
fn eval_expression<T: Element>(expr: &str, leaves: &[T]) -> T {
    fn operand<T: Element>(s: &[u8], at: &mut usize, leaves: &[T]) -> T {
        match s[*at] {
            b'(' => {
                *at += 1;
                let v = sum(s, at, leaves);
                assert_eq!(s[*at], b')');
                *at += 1;
                v
            }
            b'r' => {
                *at += 1;
                let start = *at;
                while *at < s.len() && s[*at].is_ascii_digit() {
                    *at += 1;
                }
                let k: usize = std::str::from_utf8(&s[start..*at]).unwrap().parse().unwrap();
                leaves[k]
            }
            c => panic!("unexpected {:?} at {at}", c as char),
        }
    }
    fn sum<T: Element>(s: &[u8], at: &mut usize, leaves: &[T]) -> T {
        let a = operand(s, at, leaves);
        if *at < s.len() && s[*at] == b'+' {
            *at += 1;
            let b = operand(s, at, leaves);
            a.add(b)
        } else {
            a
        }
    }
    let s = expr.as_bytes();
    let mut at = 0;
    let v = sum(s, &mut at, leaves);
    assert_eq!(at, s.len(), "trailing input in {expr}");
    v
}

// ---------------------------------------------------------------------------------------------
// Adversarial values.

/// The bit layout of `T`.
#[derive(Clone, Copy)]
struct Layout {
    width: u32,
    man: u32,
}

impl Layout {
    fn of<T: Element>() -> Layout {
        match T::NAME {
            "f32" => Layout { width: 32, man: 23 },
            "f16" => Layout { width: 16, man: 10 },
            "bf16" => Layout { width: 16, man: 7 },
            other => unreachable!("{other}"),
        }
    }
    fn exp_bits(self) -> u32 {
        self.width - 1 - self.man
    }
    fn sign(self) -> u32 {
        1 << (self.width - 1)
    }
    fn mask(self) -> u32 {
        if self.width == 32 { u32::MAX } else { (1 << self.width) - 1 }
    }
    fn man_mask(self) -> u32 {
        (1 << self.man) - 1
    }
    fn e_all_ones(self) -> u32 {
        (1 << self.exp_bits()) - 1
    }
    fn bias(self) -> u32 {
        (1 << (self.exp_bits() - 1)) - 1
    }
    fn bits(self, neg: bool, e_field: u32, man: u32) -> u32 {
        (if neg { self.sign() } else { 0 }) | (e_field << self.man) | (man & self.man_mask())
    }
    fn inf(self, neg: bool) -> u32 {
        self.bits(neg, self.e_all_ones(), 0)
    }
    /// A finite value of magnitude 2^e (e unbiased, in the normal range).
    fn pow2(self, neg: bool, e: i32) -> u32 {
        self.bits(neg, (self.bias() as i32 + e) as u32, 0)
    }
    /// Special and boundary values.
    fn specials(self) -> Vec<u32> {
        let top = self.e_all_ones();
        let mut v = Vec::new();
        for neg in [false, true] {
            v.extend([
                self.bits(neg, 0, 0),                     // ±0
                self.inf(neg),                            // ±inf
                self.bits(neg, top, 1 << (self.man - 1)), // quiet NaN
                self.bits(neg, top, 1),                   // signalling NaN
                self.bits(neg, top - 1, self.man_mask()), // ±MAX
                self.bits(neg, top - 1, 0),               // top binade
                self.bits(neg, 0, 1),                     // smallest subnormal
                self.bits(neg, 0, self.man_mask()),       // largest subnormal
                self.bits(neg, 1, 0),                     // smallest normal
                self.pow2(neg, 0),                        // ±1
                self.pow2(neg, self.man as i32 + 1),      // where the ulp is 2: ±1 ties
            ]);
        }
        v
    }
}

/// Number of value regimes; column `i` uses regime `i % REGIMES`.
const REGIMES: usize = 8;

/// One column (one element position, one value per rank) of regime `regime`.
fn column(l: Layout, rng: &mut XorShift, regime: usize, world: usize) -> Vec<u32> {
    let specials = l.specials();
    let moderate = |rng: &mut XorShift| {
        // Mixed signs over a few binades around 1: every add rounds, many cancel.
        let e = l.bias() - 2 + rng.below(5) as u32;
        l.bits(rng.coin(), e, rng.next() as u32)
    };
    let mut col: Vec<u32> = (0..world)
        .map(|_| match regime {
            // Arbitrary bit patterns.
            0 => rng.next() as u32 & l.mask(),
            1 => moderate(rng),
            // The top binades, mixed signs: whether a partial sum overflows depends on grouping.
            2 => l.bits(rng.coin(), l.e_all_ones() - 1 - rng.below(2) as u32, rng.next() as u32),
            // Subnormals and the smallest normals, mixed signs: exact sums across the boundary,
            // exact cancellation to ±0.
            3 => l.bits(rng.coin(), rng.below(2) as u32, rng.next() as u32),
            // Signed zeros, now and then a smallest subnormal.
            4 => {
                if rng.below(8) == 0 {
                    l.bits(rng.coin(), 0, 1)
                } else {
                    l.bits(rng.coin(), 0, 0)
                }
            }
            // Huge against tiny, mixed signs: absorption and catastrophic cancellation.
            5 => match rng.below(4) {
                0 => l.pow2(rng.coin(), l.man as i32 + 1),
                1 => l.bits(rng.coin(), l.e_all_ones() - 1, rng.next() as u32),
                2 => l.pow2(rng.coin(), 0),
                _ => l.bits(rng.coin(), 0, rng.next() as u32),
            },
            // From the specials and boundaries.
            6 => specials[rng.below(specials.len() as u64) as usize],
            // A big value, ones that tie against it, and its negation somewhere later.
            _ => l.pow2(rng.below(4) == 0, 0),
        })
        .collect();
    match regime {
        1 | 3 if rng.below(4) == 0 => {
            // One special at a random rank in otherwise finite data.
            let k = rng.below(world as u64) as usize;
            col[k] = specials[rng.below(specials.len() as u64) as usize];
        }
        7 => {
            let big = l.pow2(false, l.man as i32 + 1);
            col[rng.below(world as u64) as usize] = big;
            col[rng.below(world as u64) as usize] = big | l.sign();
        }
        _ => {}
    }
    col
}

/// `world` ranks of `n` elements each, as `T`.
fn ranks<T: Element>(seed: u64, world: usize, n: usize) -> Vec<Vec<T>> {
    let l = Layout::of::<T>();
    let mut rng = XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let cols: Vec<Vec<u32>> = (0..n).map(|i| column(l, &mut rng, i % REGIMES, world)).collect();
    (0..world).map(|r| cols.iter().map(|c| T::from_bits_u32(c[r])).collect()).collect()
}

fn refs<T>(v: &[Vec<T>]) -> Vec<&[T]> {
    v.iter().map(Vec::as_slice).collect()
}

fn leaves_of<T: Element>(data: &[Vec<T>], i: usize) -> Vec<T> {
    data.iter().map(|r| r[i]).collect()
}

fn same<T: Element>(a: T, b: T) -> bool {
    if b.is_nan() { a.is_nan() } else { a.to_bits_u32() == b.to_bits_u32() }
}

#[track_caller]
fn assert_same<T: Element>(got: T, want: T, what: &dyn Fn() -> String) {
    assert!(same(got, want), "{} {}: got {:#x}, want {:#x}", T::NAME, what(), got.to_bits_u32(), want.to_bits_u32());
}

/// The world sizes checked against the definition: every one up to 33, and a few large ones.
fn worlds() -> impl Iterator<Item = usize> {
    (1..=33).chain([48, 64, 100])
}

/// Columns per world: more than the reference's internal chunk (256), and not a multiple of it.
const N: usize = 40 * REGIMES;

// ---------------------------------------------------------------------------------------------
// Against the definition.

fn matches_definition<T: Element>(seed: u64) {
    let mut non_nan = 0usize;
    let mut total = 0usize;
    for world in worlds() {
        let data = ranks::<T>(seed + world as u64, world, N);
        let mut out = vec![T::from_bits_u32(0x1234); N];
        reduce(&refs(&data), &mut out).unwrap();
        for (i, &got) in out.iter().enumerate() {
            let leaves = leaves_of(&data, i);
            let want = naive(&leaves);
            assert_same(got, want, &|| format!("reduce world {world} element {i} (regime {})", i % REGIMES));
            assert_same(tree_sum(&leaves).unwrap(), want, &|| format!("tree_sum world {world} element {i}"));
            non_nan += usize::from(!want.is_nan());
            total += 1;
        }
    }
    // The data is not all NaN: most results are compared bit for bit.
    assert!(non_nan * 2 > total, "{}: only {non_nan} of {total} results are not NaN", T::NAME);
}

#[test]
fn reduce_is_the_definition_f32() {
    matches_definition::<f32>(100);
}

#[test]
fn reduce_is_the_definition_f16() {
    matches_definition::<f16>(200);
}

#[test]
fn reduce_is_the_definition_bf16() {
    matches_definition::<bf16>(300);
}

/// The largest world, over more columns than one internal chunk.
fn max_world<T: Element>(seed: u64) {
    let world = MAX_WORLD_SIZE;
    let n = 2 * REGIMES * 20;
    let data = ranks::<T>(seed, world, n);
    let mut out = vec![T::from_bits_u32(0); n];
    reduce(&refs(&data), &mut out).unwrap();
    for (i, &got) in out.iter().enumerate() {
        assert_same(got, naive(&leaves_of(&data, i)), &|| format!("world {world} element {i}"));
    }
}

#[test]
fn reduce_at_the_largest_world() {
    max_world::<f32>(400);
    max_world::<f16>(401);
    max_world::<bf16>(402);
}

/// The data above tells trees apart: for every world of 3 ranks or more, each other way to
/// split (halves rounded up or down, left fold, right fold) gives a tree that differs from the
/// reference on some element, whenever that tree is not the canonical one. So a reference that
/// evaluated the wrong tree could not pass `reduce_is_the_definition_*`.
fn other_trees_are_told_apart<T: Element>(seed: u64) {
    let others: [(&str, &dyn Fn(usize) -> usize); 4] = [
        ("ceil half", &|n| n.div_ceil(2)),
        ("floor half", &|n| n / 2),
        ("left fold", &|n| n - 1),
        ("right fold", &|_| 1),
    ];
    for world in worlds().filter(|&w| w >= 3) {
        let data = ranks::<T>(seed + world as u64, world, N);
        let mut out = vec![T::from_bits_u32(0); N];
        reduce(&refs(&data), &mut out).unwrap();
        let canonical = render_split(0, world, true, &canonical_split);
        for (name, split) in &others {
            if render_split(0, world, true, split) == canonical {
                continue;
            }
            let differs = (0..N).any(|i| !same(out[i], eval_split(&leaves_of(&data, i), split)));
            assert!(differs, "{} world {world}: the {name} tree is not told apart from the canonical one", T::NAME);
        }
    }
}

#[test]
fn other_trees_are_told_apart_f32() {
    other_trees_are_told_apart::<f32>(100);
}

#[test]
fn other_trees_are_told_apart_f16() {
    other_trees_are_told_apart::<f16>(200);
}

#[test]
fn other_trees_are_told_apart_bf16() {
    other_trees_are_told_apart::<bf16>(300);
}

/// 1, 2, 4 and 8 ranks (and 16) are the written-out balanced formula, on the adversarial data.
fn balanced_formula<T: Element>(seed: u64) {
    let add = T::add;
    for world in [1, 2, 4, 8, 16] {
        let data = ranks::<T>(seed + world as u64, world, N);
        let mut out = vec![T::from_bits_u32(0); N];
        reduce(&refs(&data), &mut out).unwrap();
        for (i, &got) in out.iter().enumerate() {
            let v = |k: usize| data[k][i];
            let b4 = |k: usize| add(add(v(k), v(k + 1)), add(v(k + 2), v(k + 3)));
            let want = match world {
                1 => v(0),
                2 => add(v(0), v(1)),
                4 => b4(0),
                8 => add(b4(0), b4(4)),
                _ => add(add(b4(0), b4(4)), add(b4(8), b4(12))),
            };
            assert_same(got, want, &|| format!("world {world} element {i}"));
        }
    }
}

#[test]
fn powers_of_two_are_the_balanced_formula() {
    balanced_formula::<f32>(500);
    balanced_formula::<f16>(501);
    balanced_formula::<bf16>(502);
}

// ---------------------------------------------------------------------------------------------
// The shape.

#[test]
fn tree_expression_small_worlds() {
    let want = [
        "r0",
        "r0+r1",
        "(r0+r1)+r2",
        "(r0+r1)+(r2+r3)",
        "((r0+r1)+(r2+r3))+r4",
        "((r0+r1)+(r2+r3))+(r4+r5)",
        "((r0+r1)+(r2+r3))+((r4+r5)+r6)",
        "((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))",
        "(((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)))+r8",
    ];
    for (w, want) in want.iter().enumerate() {
        assert_eq!(tree_expression(w + 1).unwrap(), *want, "world {}", w + 1);
    }
}

#[test]
fn tree_expression_6_12_24() {
    assert_eq!(tree_expression(6).unwrap(), "((r0+r1)+(r2+r3))+(r4+r5)");
    assert_eq!(tree_expression(12).unwrap(), "(((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)))+((r8+r9)+(r10+r11))");
    assert_eq!(
        tree_expression(24).unwrap(),
        "((((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)))+(((r8+r9)+(r10+r11))+((r12+r13)+(r14+r15))))\
         +(((r16+r17)+(r18+r19))+((r20+r21)+(r22+r23)))"
    );
}

#[test]
fn tree_expression_is_the_definition() {
    for world in worlds().chain([MAX_WORLD_SIZE]) {
        assert_eq!(tree_expression(world).unwrap(), render_split(0, world, true, &canonical_split), "world {world}");
    }
}

#[test]
fn tree_expression_errors() {
    for world in [0, MAX_WORLD_SIZE + 1, usize::MAX] {
        assert_eq!(tree_expression(world), Err(Error::UnsupportedWorldSize { world }));
    }
}

/// The rendered expression, evaluated as written, is what `reduce` computes.
fn expression_is_what_reduce_evaluates<T: Element>(seed: u64) {
    for world in worlds() {
        let expr = tree_expression(world).unwrap();
        let data = ranks::<T>(seed + world as u64, world, N);
        let mut out = vec![T::from_bits_u32(0); N];
        reduce(&refs(&data), &mut out).unwrap();
        for (i, &got) in out.iter().enumerate() {
            let want = eval_expression(&expr, &leaves_of(&data, i));
            assert_same(got, want, &|| format!("world {world} element {i}: {expr}"));
        }
    }
}

#[test]
fn tree_expression_is_what_reduce_evaluates() {
    expression_is_what_reduce_evaluates::<f32>(600);
    expression_is_what_reduce_evaluates::<f16>(601);
    expression_is_what_reduce_evaluates::<bf16>(602);
}

// ---------------------------------------------------------------------------------------------
// The other reference functions at worlds that are not powers of two.

fn scatter_at_any_world<T: Element>(seed: u64) {
    for world in [3, 5, 6, 7, 12, 24, 33] {
        // A shard longer than the internal chunk for the small worlds.
        let n = world * 300;
        let data = ranks::<T>(seed + world as u64, world, n);
        let mut full = vec![T::from_bits_u32(0); n];
        reduce(&refs(&data), &mut full).unwrap();
        let shard = n / world;
        for rank in 0..world {
            let mut out = vec![T::from_bits_u32(0); shard];
            reduce_scatter(&refs(&data), rank, &mut out).unwrap();
            for (i, &got) in out.iter().enumerate() {
                assert_same(got, full[rank * shard + i], &|| format!("world {world} rank {rank} element {i}"));
            }
        }
        // Two lanes of different lengths, each its own reduce_scatter.
        let other = ranks::<T>(seed + 1000 + world as u64, world, world * 3);
        let lanes = [refs(&data), refs(&other)];
        let lanes: Vec<&[&[T]]> = lanes.iter().map(Vec::as_slice).collect();
        let rank = world - 1;
        let mut outs = [vec![T::from_bits_u32(0); shard], vec![T::from_bits_u32(0); 3]];
        let mut out_refs: Vec<&mut [T]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        reduce_scatter_many(&lanes, rank, &mut out_refs).unwrap();
        for (lane, out) in lanes.iter().zip(&outs) {
            let mut want = vec![T::from_bits_u32(0); out.len()];
            reduce_scatter(lane, rank, &mut want).unwrap();
            for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                assert_same(g, w, &|| format!("many world {world} element {i}"));
            }
        }
    }
}

#[test]
fn reduce_scatter_at_any_world() {
    scatter_at_any_world::<f32>(700);
    scatter_at_any_world::<f16>(701);
    scatter_at_any_world::<bf16>(702);
}

#[test]
fn all_gather_at_any_world() {
    for world in [3, 6, 100, MAX_WORLD_SIZE] {
        let data: Vec<Vec<u32>> = (0..world).map(|r| (0..3).map(|i| (r * 3 + i) as u32).collect()).collect();
        let mut out = vec![u32::MAX; 3 * world];
        all_gather(&refs(&data), &mut out).unwrap();
        assert_eq!(out, (0..3 * world as u32).collect::<Vec<_>>());
    }
}
