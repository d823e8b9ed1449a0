//! Which platform this process runs on.
use collective_core::Error;

/// `DETCOLL_PLATFORM`: overrides platform detection.
pub const PLATFORM_ENV: &str = "DETCOLL_PLATFORM";

/// A platform: which device runtime the backends use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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

    /// `$DETCOLL_PLATFORM` (`nvidia`, `rocm` or `cpu`), `None` when unset; any other value is
    /// [`Error::InvalidConfig`] naming the variable.
    pub fn from_env() -> Result<Option<Platform>, Error> {
        const NAMES: [&str; 3] = ["nvidia", "rocm", "cpu"];
        collective_core::env::read(PLATFORM_ENV, |var, v| {
            collective_core::env::parse_choice(var, v, &NAMES).map(|i| Platform::parse(NAMES[i]).expect("a name"))
        })
    }

    /// The platform this build can drive here: a GPU runtime compiled in (feature) and loadable
    /// at run time, else the CPU. `DETCOLL_PLATFORM` overrides detection (e.g. `cpu` on a GPU
    /// host); a value this build cannot drive is still reported, and agreement then fails
    /// clearly instead of guessing.
    pub fn detect() -> Result<Platform, Error> {
        if let Some(p) = Platform::from_env()? {
            return Ok(p);
        }
        #[cfg(feature = "cuda")]
        if crate::nvidia::present() {
            return Ok(Platform::Nvidia);
        }
        #[cfg(feature = "rocm")]
        if crate::rocm::present() {
            return Ok(Platform::Rocm);
        }
        Ok(Platform::Cpu)
    }
}
