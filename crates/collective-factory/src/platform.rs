//! Which platform this process runs on.

/// A platform: which device runtime the backends use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    Nvidia,
    Rocm,
    Cpu,
}

impl Platform {
    /// Lower-case name, as in routing tables and facts.
    pub const fn name(self) -> &'static str {
        match self {
            Platform::Nvidia => "nvidia",
            Platform::Rocm => "rocm",
            Platform::Cpu => "cpu",
        }
    }

    /// Parses [`Platform::name`].
    pub fn parse(s: &str) -> Option<Platform> {
        [Platform::Nvidia, Platform::Rocm, Platform::Cpu].into_iter().find(|p| p.name() == s)
    }

    /// `$DETCOLL_PLATFORM`, when set to a platform name.
    pub fn from_env() -> Option<Platform> {
        std::env::var("DETCOLL_PLATFORM").ok().as_deref().and_then(Platform::parse)
    }

    /// The platform this build can drive here: a GPU runtime compiled in (feature) and loadable
    /// at run time, else the CPU. `DETCOLL_PLATFORM` overrides detection (e.g. `cpu` on a GPU
    /// host); a value this build cannot drive is still reported, and agreement then fails
    /// clearly instead of guessing.
    pub fn detect() -> Platform {
        if let Some(p) = Platform::from_env() {
            return p;
        }
        #[cfg(feature = "cuda")]
        if crate::nvidia::present() {
            return Platform::Nvidia;
        }
        #[cfg(feature = "rocm")]
        if crate::rocm::present() {
            return Platform::Rocm;
        }
        Platform::Cpu
    }
}
