/// Why a reference operation refused its arguments. The output is never written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The number of ranks is 0 or above [`crate::MAX_WORLD_SIZE`].
    UnsupportedWorldSize { world: usize },
    /// A slice has the wrong number of elements.
    LengthMismatch { argument: &'static str, expected: usize, got: usize },
    /// A length that must split evenly over the ranks does not.
    NotDivisible { argument: &'static str, len: usize, world: usize },
    /// A rank index outside the world.
    RankOutOfRange { rank: usize, world: usize },
    /// Cross-TP needs 8 leaves split over k ranks, k in {1, 2, 4, 8}.
    UnsupportedTpSplit { leaves: usize, ranks: usize },
    /// `rows * hidden` does not fit in `usize`.
    ShapeOverflow { rows: usize, hidden: usize },
    /// A row length the RMSNorm reference does not take: 0, or above
    /// [`crate::RMSNORM_MAX_HIDDEN`] (`2^24`, the largest `hidden` that converts to `f32` exactly
    /// for the mean).
    UnsupportedHidden { hidden: usize },
    /// An RMSNorm `eps` that is NaN, infinite or negative. The field is the bit pattern of the
    /// rejected `f32` (bits, so that `Error` stays `Eq`).
    InvalidEps { bits: u32 },
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::UnsupportedWorldSize { world } => {
                write!(f, "world size {world} is not supported: expected 1 to {} ranks", crate::MAX_WORLD_SIZE)
            }
            Error::LengthMismatch { argument, expected, got } => {
                write!(f, "`{argument}` has {got} elements, expected {expected}")
            }
            Error::NotDivisible { argument, len, world } => {
                write!(f, "`{argument}` has {len} elements, which does not divide into {world} equal shards")
            }
            Error::RankOutOfRange { rank, world } => {
                write!(f, "rank {rank} is outside a world of {world} ranks")
            }
            Error::UnsupportedTpSplit { leaves, ranks } => {
                write!(f, "cannot split {leaves} leaves over {ranks} ranks: expected 8 leaves and 1, 2, 4 or 8 ranks")
            }
            Error::ShapeOverflow { rows, hidden } => {
                write!(f, "{rows} rows of {hidden} elements overflow usize")
            }
            Error::UnsupportedHidden { hidden } => {
                write!(f, "hidden size {hidden} is not supported: expected 1 to {}", crate::RMSNORM_MAX_HIDDEN)
            }
            Error::InvalidEps { bits } => {
                write!(f, "eps {} is not a finite, non-negative f32", f32::from_bits(*bits))
            }
        }
    }
}

impl std::error::Error for Error {}
