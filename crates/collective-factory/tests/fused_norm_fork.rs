//! A fused all_reduce + residual + RMSNorm on a handle used in a forked child (issue 25), at
//! the CPU twin's front door: the child's fused calls — one kernel (16 rows) and the norm a
//! launch of its own (80 rows) — return `ForkedHandle` before touching anything (`y` and the
//! residual untouched), and the parent's handles go on with exact results. A real `fork`, alone
//! in this test binary.
#![cfg(feature = "cpu")]
mod norm_data;

use collective_factory::{Collective, Config, CpuCollective, Error, Io, RawRef, RmsNorm, cpu};

const HIDDEN: usize = 256;

/// `(h, y)` of a call, or its error with what `h` and `y` hold after it.
type Outcome = Result<(Vec<f32>, Vec<f32>), (Error, Vec<f32>, Vec<f32>)>;

/// One fused call of the constant input `x` and residual `residual`.
fn fused(comm: &CpuCollective, rows: usize, x: f32, residual: f32, weight: &[f32]) -> Outcome {
    let n = rows * HIDDEN;
    let xs = vec![x; n];
    let mut y = vec![0f32; n];
    let mut h = vec![residual; n];
    let norm = RmsNorm { residual: Io::host_in_place(&mut h), weight: RawRef::host(weight), hidden: HIDDEN, eps: 1e-6 };
    match comm.all_reduce_residual_rmsnorm(Io::host(&xs, &mut y), norm, &()) {
        Ok(()) => Ok((h, y)),
        Err(e) => Err((e, h, y)),
    }
}

/// Both ranks' fused calls of `rows` rows, each checked: `h` = residual + x0 + x1, `y` its norm.
fn both_ranks_call(ranks: &[CpuCollective], rows: usize, weight: &[f32]) {
    std::thread::scope(|s| {
        for c in ranks {
            s.spawn(move || {
                for k in 0..3 {
                    let x = (c.rank() + 1) as f32 * (k + 1) as f32;
                    let (h, y) = fused(c, rows, x, 0.5, weight).expect("parent call");
                    let what = format!("rank {} call {k}", c.rank());
                    let sum = norm_data::one_call_of_constants(&h, &y, weight, 1e-6, &what);
                    assert_eq!(sum.to_bits(), (0.5 + 3.0 * (k + 1) as f32).to_bits(), "{what}: h");
                }
            });
        }
    });
}

#[test]
fn a_forked_childs_fused_calls_get_forked_handle_and_the_parent_goes_on() {
    let weight: Vec<f32> = (0..HIDDEN).map(|j| 0.25 + j as f32 / 128.0).collect();
    let config = Config::new().with_capacity(4096);
    let ranks = cpu::thread_group(2, &config).expect("thread group");
    both_ranks_call(&ranks, 16, &weight);
    // SAFETY: the child only runs the checks below and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut code = 0;
        for (rows, fail) in [(16, 10), (80, 20)] {
            code = match (code, fused(&ranks[0], rows, 1.0, 0.5, &weight)) {
                (0, Err((Error::ForkedHandle { .. }, h, y)))
                    if h.iter().all(|v| v.to_bits() == 0.5f32.to_bits()) && y.iter().all(|v| v.to_bits() == 0) =>
                {
                    0
                }
                (0, Err((Error::ForkedHandle { .. }, ..))) => fail + 3,
                (0, Ok(_)) => fail + 1,
                (0, Err(_)) => fail + 2,
                (c, _) => c,
            };
        }
        drop(ranks); // must acknowledge nothing to the parent's peers
        // SAFETY: leaves the child without running the test harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    assert!(libc::WIFEXITED(status), "child did not exit normally: {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_eq!(
        code, 0,
        "child (10: 16 rows, 20: 80 rows): +1 = a call succeeded, +2 = another error, +3 = an output written"
    );
    // The parent's ranks are untouched: no close acknowledged, generations in step.
    both_ranks_call(&ranks, 16, &weight);
    both_ranks_call(&ranks, 80, &weight);
    for c in &ranks {
        c.check().expect("parent healthy");
    }
}
