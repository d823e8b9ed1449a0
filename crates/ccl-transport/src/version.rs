//! The library version, decoded from `ncclGetVersion`'s code.
use core::fmt;

/// An NCCL/RCCL version (RCCL reports the NCCL version it tracks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// Decodes `NCCL_VERSION_CODE`: `X*1000 + Y*100 + Z` up to 2.8, `X*10000 + Y*100 + Z` since
    /// 2.9 (the `NCCL_VERSION` macro of `nccl.h`).
    pub const fn from_code(code: i32) -> Version {
        let c = if code < 0 { 0 } else { code as u32 };
        if c >= 10000 {
            Version { major: c / 10000, minor: (c % 10000) / 100, patch: c % 100 }
        } else {
            Version { major: c / 1000, minor: (c % 1000) / 100, patch: c % 100 }
        }
    }

    /// The code `nccl.h`'s `NCCL_VERSION(major, minor, patch)` gives.
    pub const fn code(self) -> i32 {
        if self.major <= 2 && self.minor <= 8 {
            (self.major * 1000 + self.minor * 100 + self.patch) as i32
        } else {
            (self.major * 10000 + self.minor * 100 + self.patch) as i32
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_encodings() {
        let v = Version::from_code(22803);
        assert_eq!(v, Version { major: 2, minor: 28, patch: 3 });
        assert_eq!(v.to_string(), "2.28.3");
        assert_eq!(v.code(), 22803);
        let old = Version::from_code(2708);
        assert_eq!(old, Version { major: 2, minor: 7, patch: 8 });
        assert_eq!(old.code(), 2708);
        assert!(Version::from_code(21400) < v);
    }
}
