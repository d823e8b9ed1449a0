//! Causal context-parallel attention with output bits that do not depend on CP.
//!
//! Tokens are sharded in contiguous blocks: rank `r` of a CP=c group holds tokens
//! `r·S/c .. (r+1)·S/c` of `q`, `k`, `v` (`tokens × heads × head_dim`, row-major) and their
//! positions. The ranks all_gather `k`, `v` and the positions (in rank order, which is token
//! order), then every rank computes attention for its own queries over all keys and keeps its
//! output and log-sum-exp: the outputs never leave their rank, which is the scatter. `q` is not
//! gathered, as each rank needs only its own queries.
//!
//! The mask is causal on positions: query `i` sees key `j` exactly when
//! `positions[j] <= positions[i]` (itself included).
//!
//! Ranks that disagree on the token count fail with `SignatureMismatch` (the gathers' sizes
//! differ); ranks that disagree only on how a token's `heads × head_dim` elements split
//! (1 × 4 against 2 × 2) are not detected: the collectives see element counts only.
//!
//! # The fixed order, and why the bits are the same at CP = 1, 2, 4 and 8
//!
//! For each query `i` and head `h`, in f32 with separate multiplies and adds (no FMA, no fast
//! math), with the visible keys visited in global key order `j = 0, 1, …, S-1`:
//!
//! 1. `s_j = (Σ_d q[i,h,d]·k[j,h,d]) · (1/√head_dim)`, the dot product left to right over `d`;
//! 2. `m = max_j s_j` (exact, so its order does not matter);
//! 3. `l = Σ_j e^(s_j − m)` and `o[d] = Σ_j e^(s_j − m)·v[j,h,d]`, both left to right over `j`;
//! 4. `out[i,h,d] = T(o[d] / l)` (the one rounding to the element type) and
//!    `lse[i,h] = m + ln l` (f32). A query that sees no key gets `out = 0` and `lse = −∞`; one
//!    that sees keys gets these formulas whatever the values, so a NaN or infinite score (a
//!    NaN or infinity in `q` or `k`) makes its output and `lse` NaN, IEEE-wise.
//!
//! This is the plain two-pass softmax over keys in order: no online rescaling and no key blocks,
//! so nothing in it depends on how the keys were split. After the all_gather every rank holds
//! the same `k`, `v` and positions in the same (global) order at every CP size, and query `i`'s
//! result is a function of `q[i]`, `positions[i]` and those alone, so it has the same bits on
//! whichever rank of whichever CP size owns token `i`. [`reference()`] computes all tokens in one
//! process. (A blocked GPU kernel is CP-invariant in the same way when its key blocks are a
//! fixed size walked in global order, but it is a different order from this one.)
use crate::Scalar;
use crate::error::{Error, product, require};
use collective_core::{Collective, Io};
use fixed_tree::SUPPORTED_WORLD_SIZES;

/// The global sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Tokens over all ranks (`S`); each rank holds `S / cp` of them.
    pub tokens: usize,
    /// Attention heads (the same number for queries, keys and values).
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl AttentionShape {
    /// Elements of one token's `q`, `k` or `v` (`heads × head_dim`), saturating at `usize::MAX`
    /// (the layer refuses such a shape with a typed error).
    pub fn token_len(&self) -> usize {
        self.heads.saturating_mul(self.head_dim)
    }

    pub(crate) fn check(&self, cp: usize) -> Result<(), Error> {
        require(SUPPORTED_WORLD_SIZES.contains(&cp), || format!("CP size {cp} is not 1, 2, 4 or 8"))?;
        require(self.tokens.is_multiple_of(cp), || format!("{} tokens do not split over {cp} ranks", self.tokens))?;
        // The scores are scaled by 1/√head_dim: a head of width 0 would scale by ∞ (0 · ∞ is
        // NaN for every score), so heads have at least one element.
        require(self.heads == 0 || self.head_dim > 0, || format!("{} heads of width 0", self.heads))?;
        product("tokens x heads x head_dim", &[self.tokens, self.heads, self.head_dim])?;
        // Also without tokens: a token's length sizes every block (check_block).
        product("heads x head_dim", &[self.heads, self.head_dim])?;
        Ok(())
    }
}

/// One rank's token block: `q`, `k`, `v` are `n × heads × head_dim` and `positions` has `n`
/// entries (`n = tokens / cp`; all tokens for [`reference()`]).
#[derive(Debug, Clone, Copy)]
pub struct AttentionInput<'a, T> {
    /// Queries.
    pub q: &'a [T],
    /// Keys.
    pub k: &'a [T],
    /// Values.
    pub v: &'a [T],
    /// Each token's position (the causal mask compares them).
    pub positions: &'a [u32],
}

/// Where one rank's results go: `out` is `n × heads × head_dim`, `lse` is `n × heads`.
#[derive(Debug)]
pub struct AttentionOutput<'a, T> {
    /// The attention output of this rank's tokens.
    pub out: &'a mut [T],
    /// `m + ln l` per token and head (the log-sum-exp of the scaled scores), for a backward pass
    /// or for merging with other keys.
    pub lse: &'a mut [f32],
}

/// The CP-invariant attention of this rank's tokens. Collective: every rank of `comm` calls it
/// with its own block, `comm.world_size()` being the CP size.
pub fn forward<C, T>(
    comm: &C,
    shape: AttentionShape,
    local: AttentionInput<'_, T>,
    output: AttentionOutput<'_, T>,
) -> Result<(), Error>
where
    C: Collective<Stream = ()>,
    T: Scalar,
{
    let cp = comm.world_size();
    // Three collective calls follow: refused here, they count as refused on `comm`.
    crate::error::before_calls(comm, 3, || {
        shape.check(cp)?;
        check_block(shape, shape.tokens / cp, &local, &output)
    })?;
    let mut k = vec![T::from_f32(0.0); shape.tokens * shape.token_len()];
    let mut v = k.clone();
    let mut positions = vec![0u32; shape.tokens];
    comm.all_gather(Io::host(local.k, &mut k), &())?;
    comm.all_gather(Io::host(local.v, &mut v), &())?;
    comm.all_gather(Io::host(local.positions, &mut positions), &())?;
    let keys = AttentionInput { q: local.q, k: &k, v: &v, positions: &positions };
    attend(shape, local.q, local.positions, keys, output);
    Ok(())
}

/// The attention of all tokens in one process (`all` holds every token), the bits
/// [`forward`] gives at every CP size.
pub fn reference<T: Scalar>(
    shape: AttentionShape,
    all: AttentionInput<'_, T>,
    output: AttentionOutput<'_, T>,
) -> Result<(), Error> {
    shape.check(1)?;
    check_block(shape, shape.tokens, &all, &output)?;
    attend(shape, all.q, all.positions, all, output);
    Ok(())
}

fn check_block<T>(
    shape: AttentionShape,
    n: usize,
    input: &AttentionInput<'_, T>,
    output: &AttentionOutput<'_, T>,
) -> Result<(), Error> {
    let e = product("tokens x heads x head_dim", &[n, shape.heads, shape.head_dim])?;
    let lse = product("tokens x heads", &[n, shape.heads])?;
    for (what, len, want) in [
        ("q", input.q.len(), e),
        ("k", input.k.len(), e),
        ("v", input.v.len(), e),
        ("positions", input.positions.len(), n),
        ("out", output.out.len(), e),
        ("lse", output.lse.len(), lse),
    ] {
        require(len == want, || format!("`{what}` has {len} elements, expected {want} for {n} tokens"))?;
    }
    Ok(())
}

/// The queries `q` (at `q_positions`) over every key of `keys` (its `q` is not read), in the
/// order of the module docs. Shapes are checked by the callers.
fn attend<T: Scalar>(
    shape: AttentionShape,
    q: &[T],
    q_positions: &[u32],
    keys: AttentionInput<'_, T>,
    output: AttentionOutput<'_, T>,
) {
    let (heads, d) = (shape.heads, shape.head_dim);
    if heads == 0 || q_positions.is_empty() {
        // No output (`out` and `lse` are empty): `acc` (2^40 elements for a head_dim of 2^40
        // and no heads) is not allocated.
        return;
    }
    let row = shape.token_len();
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores = vec![0f32; keys.positions.len()];
    let mut acc = vec![0f32; d];
    for (i, &pos) in q_positions.iter().enumerate() {
        for h in 0..heads {
            let qh: Vec<f32> = q[i * row + h * d..i * row + (h + 1) * d].iter().map(|x| x.to_f32()).collect();
            let visible = |j: usize| keys.positions[j] <= pos;
            let (mut m, mut seen) = (f32::NEG_INFINITY, false);
            for (j, s) in scores.iter_mut().enumerate().filter(|(j, _)| visible(*j)) {
                seen = true;
                let kh = &keys.k[j * row + h * d..j * row + (h + 1) * d];
                let mut dot = 0f32;
                for (a, b) in qh.iter().zip(kh) {
                    dot += a * b.to_f32();
                }
                *s = dot * scale;
                m = m.max(*s);
            }
            let mut l = 0f32;
            acc.fill(0.0);
            for (j, &s) in scores.iter().enumerate().filter(|(j, _)| visible(*j)) {
                let p = (s - m).exp();
                l += p;
                for (a, b) in acc.iter_mut().zip(&keys.v[j * row + h * d..j * row + (h + 1) * d]) {
                    *a += p * b.to_f32();
                }
            }
            let out = &mut output.out[i * row + h * d..i * row + (h + 1) * d];
            // A visible key, not `l > 0`: a NaN or infinite score makes `l` NaN, and the output
            // and log-sum-exp NaN, never the no-key result (which would hide a poisoned q or k).
            if seen {
                for (o, &a) in out.iter_mut().zip(&acc) {
                    *o = T::from_f32(a / l);
                }
                output.lse[i * heads + h] = m + l.ln();
            } else {
                // No visible key: a zero output and an empty sum's log-sum-exp.
                out.fill(T::from_f32(0.0));
                output.lse[i * heads + h] = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_visible_key_copies_its_value_and_the_mask_is_causal() {
        // Two tokens, one head of width 2: token 0 sees only itself, so its output is v[0].
        let shape = AttentionShape { tokens: 2, heads: 1, head_dim: 2 };
        let q = [1.0f32, 0.0, 0.0, 1.0];
        let k = [1.0f32, 0.0, 0.0, 1.0];
        let v = [3.0f32, 4.0, 5.0, 6.0];
        let (mut out, mut lse) = ([0f32; 4], [0f32; 2]);
        let input = AttentionInput { q: &q, k: &k, v: &v, positions: &[0, 1] };
        reference(shape, input, AttentionOutput { out: &mut out, lse: &mut lse }).unwrap();
        assert_eq!(&out[..2], &[3.0, 4.0]);
        assert_eq!(lse[0], 1.0 / 2f32.sqrt());
        // Token 1 sees both keys with scores 0 and 1/sqrt(2): a convex mix of v[0] and v[1].
        assert!(out[2] > 3.0 && out[2] < 5.0 && out[3] > 4.0 && out[3] < 6.0);
    }
}
