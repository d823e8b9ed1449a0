//! The published flag word: `generation << 32 | signature digest`.
//!
//! One 64-bit release store publishes both, so one acquire load tells a waiter whether the
//! peer reached this generation and whether it is making the same call.
use collective_core::Signature;

/// A flag word as stored in a control block line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagWord(pub u64);

/// What a waiter concludes from one observation of a peer's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagState {
    /// The peer has not reached this generation yet: keep waiting (bounded).
    Behind,
    /// The peer published this generation with the same signature digest.
    Ready,
    /// The peer already published the next generation (so it matched this one): proceed.
    Passed,
    /// The peer published this generation with a different signature.
    Mismatch,
    /// The flag holds a generation no correct peer can be at.
    Corrupt,
}

impl FlagWord {
    /// The word a rank publishes for generation `generation` of a call with `sig`.
    pub const fn publish(generation: u32, sig: &Signature) -> FlagWord {
        FlagWord((generation as u64) << 32 | sig.digest() as u64)
    }
    /// The word for generation `generation` of a call whose signature digest is `digest`.
    pub const fn of(generation: u32, digest: u32) -> FlagWord {
        FlagWord((generation as u64) << 32 | digest as u64)
    }
    /// Generation part.
    pub const fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// Signature digest part.
    pub const fn digest(self) -> u32 {
        self.0 as u32
    }
    /// Classifies this observation for a waiter at `generation` expecting `digest`.
    ///
    /// Generations wrap; a correct peer is at most one generation ahead of a waiter.
    pub const fn check(self, generation: u32, digest: u32) -> FlagState {
        let delta = self.generation().wrapping_sub(generation) as i32;
        if delta == 0 {
            if self.digest() == digest { FlagState::Ready } else { FlagState::Mismatch }
        } else if delta == 1 {
            FlagState::Passed
        } else if delta < 0 {
            FlagState::Behind
        } else {
            FlagState::Corrupt
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::{DType, Op};

    #[test]
    fn flag_states() {
        let a = Signature {
            op: Op::AllReduce,
            dtype: DType::F16,
            count: 10,
            lanes: 1,
            split: 0,
            route: collective_core::Route::IpcOneShot,
        };
        let b = Signature { count: 11, ..a };
        let f = FlagWord::publish(7, &a);
        assert_eq!(f.check(7, a.digest()), FlagState::Ready);
        assert_eq!(f.check(7, b.digest()), FlagState::Mismatch);
        assert_eq!(f.check(8, a.digest()), FlagState::Behind);
        assert_eq!(f.check(6, a.digest()), FlagState::Passed);
        assert_eq!(f.check(2, a.digest()), FlagState::Corrupt);
        assert_eq!(FlagWord(0).check(1, a.digest()), FlagState::Behind);
        // Wrapping generations.
        assert_eq!(FlagWord::publish(0, &a).check(u32::MAX, 0), FlagState::Passed);
        assert_eq!(FlagWord::publish(u32::MAX, &a).check(0, a.digest()), FlagState::Behind);
    }
}
