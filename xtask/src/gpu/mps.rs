//! NVIDIA MPS around the suites that run several processes per GPU: the policy (`--mps`), and
//! the control daemon this run starts (as root) and stops again, also on the way out (Drop).
use super::platform::GpuPlatform;
use crate::util::which;
use clap::ValueEnum;
use std::io::Write;
use std::process::{Command, Stdio};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MpsMode {
    /// Start MPS (as root, if not running) around suites that run several processes per GPU.
    Auto,
    /// Run every suite under MPS.
    On,
    /// Never start MPS.
    Off,
}

/// The MPS control daemon, when this run started it.
pub(super) struct Mps {
    pub(super) started: bool,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn mps_control(input: &str) -> bool {
    let Ok(mut child) = Command::new("nvidia-cuda-mps-control")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    child.wait().is_ok_and(|s| s.success())
}

/// Whether an MPS control daemon answers (started by anyone).
pub(super) fn mps_running() -> bool {
    which("nvidia-cuda-mps-control").is_some() && mps_control("get_server_list\n")
}

impl Mps {
    pub(super) fn start(&mut self) {
        if self.started {
            return;
        }
        if which("nvidia-cuda-mps-control").is_none() {
            eprintln!("[gpu] nvidia-cuda-mps-control not found: running without MPS");
            return;
        }
        if mps_running() {
            eprintln!("[gpu] MPS is already running; using it");
            return;
        }
        if !is_root() {
            eprintln!("[gpu] starting MPS needs root: running without MPS");
            return;
        }
        match Command::new("nvidia-cuda-mps-control").arg("-d").status() {
            Ok(s) if s.success() => {
                eprintln!("[gpu] started the MPS control daemon");
                self.started = true;
            }
            Ok(s) => eprintln!("[gpu] nvidia-cuda-mps-control -d failed ({s}): running without MPS"),
            Err(e) => eprintln!("[gpu] nvidia-cuda-mps-control -d: {e}: running without MPS"),
        }
    }
    pub(super) fn stop(&mut self) {
        if self.started {
            if mps_control("quit\n") {
                eprintln!("[gpu] stopped the MPS control daemon");
            } else {
                eprintln!("[gpu] warning: `echo quit | nvidia-cuda-mps-control` failed");
            }
            self.started = false;
        }
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a suite runs under MPS: `--mps on` / `off` as given; `auto` for suites running several
/// processes per GPU on NVIDIA (MPS is NVIDIA's; AMD GPUs run several processes without it).
pub fn wants_mps(mode: MpsMode, multiprocess: bool, platform: GpuPlatform) -> bool {
    match mode {
        MpsMode::On => true,
        MpsMode::Off => false,
        MpsMode::Auto => multiprocess && platform == GpuPlatform::Nvidia,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_is_nvidia_only_in_auto_mode() {
        use GpuPlatform::{Nvidia, Rocm};
        assert!(wants_mps(MpsMode::Auto, true, Nvidia));
        assert!(!wants_mps(MpsMode::Auto, false, Nvidia));
        assert!(!wants_mps(MpsMode::Auto, true, Rocm));
        assert!(wants_mps(MpsMode::On, false, Rocm));
        assert!(!wants_mps(MpsMode::Off, true, Nvidia));
    }
}
