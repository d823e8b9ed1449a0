//! HIP's part of the shared GPU suite (`gpu-conformance`): [`Hip`], how the tests discover and
//! open devices, make streams, copy and launch the fused tree on our HIP binding. Everything
//! else (rank environments, worlds, the cases) is the suite's, written once for CUDA and HIP.
//! Never executed on an AMD GPU (none was available).
#![allow(dead_code)]
use collective_core::Error;
use detcoll_protocol::IpcConfig;
use detcoll_protocol::params::TreeParams;
use gpu_conformance::{TestGpu, TreeLaunch};
use hip_ipc::{Arithmetic, FusedTree, HipDevice, Stream, runtime};
use ipc_engine::IpcDevice;

/// A rank of a HIP test world.
pub type HipRank = gpu_conformance::GpuRank<Hip>;

/// The HIP runtime (libamdhip64, loaded at run time), as the shared suite drives it.
#[derive(Debug)]
pub struct Hip;

impl TestGpu for Hip {
    type Device = HipDevice;
    type Stream = Stream;
    type Tree = FusedTree;

    const RUNTIME: &'static str = "HIP";
    /// The suite needs a few MiB per rank; the randomized run's arena most.
    const REGION_BYTES: usize = 256 << 20;
    const PROCESS_ENV: (&'static str, &'static str) = ("DETCOLL_HIP_PROCESS_TESTS", "ranks share HIP device 0");

    fn device_count() -> Result<usize, String> {
        match runtime::device_count().map_err(|e| e.to_string())? {
            0 => Err("the runtime reports 0 devices".into()),
            n => Ok(n),
        }
    }
    fn open(ordinal: usize) -> Result<HipDevice, String> {
        HipDevice::open(ordinal).map_err(|e| e.to_string())
    }
    fn new_stream(device: &HipDevice) -> Result<Stream, String> {
        Stream::new(device.ordinal()).map_err(|e| e.to_string())
    }
    fn synchronize(stream: &Stream) -> Result<(), String> {
        stream.synchronize().map_err(|e| e.to_string())
    }
    fn upload(_stream: &Stream, dst: u64, data: &[u8]) -> Result<(), String> {
        runtime::copy_to_device(data, dst).map_err(|e| format!("hipMemcpy (upload): {e}"))
    }
    fn download(_stream: &Stream, src: u64, dst: &mut [u8]) -> Result<(), String> {
        runtime::copy_to_host(src, dst).map_err(|e| format!("hipMemcpy (download): {e}"))
    }
    /// Every rank on device 0, as the threads are.
    fn process_ordinal(_rank: usize) -> Result<usize, String> {
        Ok(0)
    }
    /// All ranks share device 0 and the block count is split explicitly (equal on every rank)
    /// rather than left to the engine's identity check of the shared GPU.
    fn process_config(device: &HipDevice, world: usize, config: IpcConfig) -> Result<IpcConfig, String> {
        let cus = device.multiprocessors().map_err(|e| e.to_string())?;
        Ok(config.with_max_blocks((cus / world).max(1)))
    }
    fn tree(device: &HipDevice) -> Result<FusedTree, String> {
        device.fused_tree().map_err(|e| e.to_string())
    }
    unsafe fn launch_tree(tree: &FusedTree, l: &TreeLaunch<'_>, stream: &Stream) -> Result<(), Error> {
        let p = TreeParams::pack(l.inputs, l.out, l.count, l.dtype)?;
        let arithmetic = if l.soft { Arithmetic::Software } else { Arithmetic::Hardware };
        // SAFETY: forwarded from the caller; the stream is the tree's device's.
        unsafe { tree.launch_packed(&p, arithmetic, stream.raw()) }
    }
}
