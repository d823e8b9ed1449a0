//! Programmatic dependent launch (PDL): a collective launch that may start its blocks while the
//! previous kernel on the stream is still running.
//!
//! A kernel boundary costs about a microsecond even in a CUDA graph (a launch's blocks are
//! scheduled only after the previous grid has ended). With the launch attribute
//! `PROGRAMMATIC_STREAM_SERIALIZATION`, the collective's blocks are scheduled as soon as the
//! previous grid triggers (`griddepcontrol.launch_dependents`, or its end), and each block
//! waits at `griddepcontrol.wait` — until that grid has completed and its memory is visible —
//! before touching memory (kernels/detcoll_protocol.h, `dc_collective`). So the input written by
//! the previous kernel and this rank's generation are read exactly as without the attribute:
//! only the launch is hidden. The collective's own trigger comes after it has seen every peer
//! in the call, so early dependents never hold multiprocessors a peer sharing the GPU needs.
//!
//! Used for every collective launch, whatever its grid. A rank's dependents are scheduled only
//! once every block of its launch has triggered (or ended), each after seeing its peers' flags
//! of the call, so every peer's blocks of that call are resident by then; and the grids stay
//! capped so that every rank's launch fits on the GPU at once (`Config::with_max_blocks`, the
//! multiprocessors split among the ranks sharing a GPU). Early blocks waiting at
//! `griddepcontrol.wait` thus never take the multiprocessors a call in flight still needs.
//! (Until 2026-12-07 only one-block launches and fused launches of up to 8 blocks were
//! programmatic, on the guess that larger grids' running time would hide their launch; on one
//! H100, graphs, every grid programmatic made the plain all_reduce 0.89-1.00x its time at 64
//! KiB - 4 MiB and the fused all_reduce + RMSNorm 0.82-0.98x at 16-512 rows:
//! benches/results/h100-2026-12-07-pdl-every-grid.md.) Only on streams the application created: the default streams keep their
//! implicit synchronisation exactly as a plain launch has it. A programmatic launch the driver
//! refuses falls back to a plain one. Taken when the device is sm_90 or newer, the driver is CUDA 12.4 or
//! newer (programmatic edges in captured graphs) and exports `cuLaunchKernelEx`, and
//! `DETCOLL_PDL` (a boolean, default on; read when a context's kernels are loaded, a value that
//! does not parse is `InvalidConfig`) does not turn it off; otherwise every launch is a plain
//! `cuLaunchKernel`. Ranks need not agree: the launch mode changes no bits and no protocol step.
//!
//! `cuLaunchKernelEx` is looked up in the already loaded driver here, with the C structs
//! below, rather than through cudarc's bindings: those exist only for the CUDA versions whose
//! feature the application picked, and a missing symbol must be a fallback, not a panic.
use crate::driver::check;
use collective_core::Error;
use cudarc::driver::sys;
use std::sync::OnceLock;

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` (cuda.h, CUDA 12.0 on).
const ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
/// The oldest driver whose stream capture keeps programmatic edges in the graph.
const MIN_DRIVER_VERSION: i32 = 12040;

/// `CUlaunchAttribute`: an id, padding, and a 64-byte value union (8-byte aligned).
#[repr(C, align(8))]
struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u8; 64],
}

/// `CUlaunchConfig`.
#[repr(C)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: sys::CUstream,
    attrs: *mut LaunchAttribute,
    num_attrs: u32,
}

type LaunchKernelEx = unsafe extern "C" fn(
    *const LaunchConfig,
    sys::CUfunction,
    *mut *mut core::ffi::c_void,
    *mut *mut core::ffi::c_void,
) -> sys::CUresult;

/// The driver's `cuLaunchKernelEx`, when this process may use programmatic launches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Programmatic {
    launch_ex: LaunchKernelEx,
}

/// The variable that turns programmatic launches off (`0`, `false`, `no`, `off`).
pub const PDL_ENV: &str = "DETCOLL_PDL";

/// Whether `DETCOLL_PDL` leaves programmatic launches on (unset: on).
fn allowed_by_env() -> Result<bool, Error> {
    allowed(collective_core::env::var(PDL_ENV)?.as_deref())
}

/// Whether a `DETCOLL_PDL` of `value` (`None`: unset) leaves programmatic launches on.
fn allowed(value: Option<&str>) -> Result<bool, Error> {
    value.map_or(Ok(true), |v| collective_core::env::parse_bool(PDL_ENV, v))
}

/// `cuLaunchKernelEx` of the loaded driver library (looked up once per process).
fn launch_kernel_ex() -> Option<LaunchKernelEx> {
    static FOUND: OnceLock<Option<(libloading::Library, LaunchKernelEx)>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            crate::driver::lib_candidates("cuda").into_iter().find_map(|name| {
                // SAFETY: opens the driver library, which the caller's context creation
                // already loaded (this only takes a reference; its initialisers have run).
                let lib = unsafe { libloading::Library::new(&name) }.ok()?;
                // SAFETY: `cuLaunchKernelEx` has this C signature in every driver exporting it
                // (CUDA 11.8 on); the library stays loaded as long as the pointer is used (it
                // lives in this static).
                let f = unsafe { lib.get::<LaunchKernelEx>(b"cuLaunchKernelEx\0") }.ok().map(|s| *s)?;
                Some((lib, f))
            })
        })
        .as_ref()
        .map(|(_, f)| *f)
}

impl Programmatic {
    /// Programmatic launches for a device of compute capability `major`.`_` under a driver of
    /// CUDA version `driver_version`, when the environment and the driver allow them;
    /// `InvalidConfig` when `DETCOLL_PDL` does not parse.
    pub(crate) fn probe(major: i32, driver_version: i32) -> Result<Option<Programmatic>, Error> {
        if !allowed_by_env()? || major < 9 || driver_version < MIN_DRIVER_VERSION {
            return Ok(None);
        }
        Ok(launch_kernel_ex().map(|launch_ex| Programmatic { launch_ex }))
    }

    /// Whether a launch on `stream` may be programmatic: not on the default streams (the
    /// legacy NULL stream, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`), whose implicit
    /// synchronisation with other streams is left exactly as a plain launch has it.
    pub(crate) fn suits(stream: sys::CUstream) -> bool {
        !matches!(stream as usize, 0..=2)
    }

    /// One launch of `f` with the programmatic stream serialization attribute.
    ///
    /// # Safety
    /// As `cuLaunchKernel` (crate::launch::launch): `f` takes exactly the parameters `args`
    /// points to, every address in them is valid for the kernel, `stream` belongs to the
    /// current context; and `f` must execute `griddepcontrol.wait` before its first memory
    /// access.
    pub(crate) unsafe fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        threads: u32,
        args: &mut [*mut core::ffi::c_void],
        stream: sys::CUstream,
    ) -> Result<(), Error> {
        let mut attr = LaunchAttribute { id: ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, pad: [0; 4], value: [0; 64] };
        // `programmaticStreamSerializationAllowed`: the union's first int.
        attr.value[..4].copy_from_slice(&1i32.to_ne_bytes());
        let config = LaunchConfig {
            grid: [grid, 1, 1],
            block: [threads, 1, 1],
            shared_mem_bytes: 0,
            stream,
            attrs: &mut attr,
            num_attrs: 1,
        };
        // SAFETY: forwarded from the caller; `config` and `attr` outlive the call, and the
        // driver copies the parameter bytes before returning.
        let r = unsafe { (self.launch_ex)(&config, f, args.as_mut_ptr(), core::ptr::null_mut()) };
        check(r, "cuLaunchKernelEx (programmatic dependent launch)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_structs_have_cuda_h_layout() {
        assert_eq!(core::mem::size_of::<LaunchAttribute>(), 72);
        assert_eq!(core::mem::offset_of!(LaunchAttribute, value), 8);
        assert_eq!(core::mem::size_of::<LaunchConfig>(), 56);
        assert_eq!(core::mem::offset_of!(LaunchConfig, stream), 32);
        assert_eq!(core::mem::offset_of!(LaunchConfig, num_attrs), 48);
        // The same as cudarc's bindings of the CUDA version this workspace builds with.
        assert_eq!(core::mem::size_of::<LaunchAttribute>(), core::mem::size_of::<sys::CUlaunchAttribute>());
        assert_eq!(core::mem::size_of::<LaunchConfig>(), core::mem::size_of::<sys::CUlaunchConfig>());
        assert_eq!(
            ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION as u32
        );
    }

    #[test]
    fn detcoll_pdl_is_a_boolean_that_defaults_to_on() {
        assert!(allowed(None).expect("unset"));
        assert!(!allowed(Some("0")).expect("0"));
        assert!(!allowed(Some("off")).expect("off"));
        assert!(allowed(Some("1")).expect("1"));
        for bad in ["", "2", "maybe"] {
            match allowed(Some(bad)) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(PDL_ENV), "{detail}"),
                other => panic!("DETCOLL_PDL={bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn default_streams_launch_plainly() {
        for handle in [0usize, 1, 2] {
            assert!(!Programmatic::suits(handle as sys::CUstream), "stream {handle:#x}");
        }
        assert!(Programmatic::suits(0x5555_0000usize as sys::CUstream));
    }

    #[test]
    fn old_devices_and_drivers_launch_plainly() {
        assert!(Programmatic::probe(8, 13000).expect("probe").is_none());
        assert!(Programmatic::probe(9, 12030).expect("probe").is_none());
    }
}
