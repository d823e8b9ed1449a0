//! A handle used in a forked child (issue 25): the child's first call and `check` return
//! `ForkedHandle` before touching anything (its output untouched), dropping the handles in the
//! child acknowledges nothing to the peers, and the parent's handles go on working with exact
//! results. A real `fork`, alone in this test binary.
use collective_core::{Collective, Error, Io};
use shm_ipc::{ShmCollective, ShmConfig};

fn both_ranks_call(ranks: &[ShmCollective], calls: usize) {
    std::thread::scope(|s| {
        for c in ranks {
            s.spawn(move || {
                for k in 0..calls {
                    let x = vec![(c.rank() + 1) as f32 * (k + 1) as f32; 1024];
                    let mut y = vec![0f32; 1024];
                    c.all_reduce(Io::host(&x, &mut y), &()).expect("parent call");
                    let want = 3.0 * (k + 1) as f32;
                    assert!(y.iter().all(|v| v.to_bits() == want.to_bits()), "call {k}: {} != {want}", y[0]);
                }
            });
        }
    });
}

#[test]
fn a_forked_child_gets_forked_handle_and_the_parent_goes_on() {
    let ranks = ShmCollective::group(2, ShmConfig::new(4096)).unwrap();
    both_ranks_call(&ranks, 3);
    // SAFETY: the child only runs the checks below and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let x = [1.0f32; 64];
        let mut y = [0f32; 64];
        let code = match ranks[0].all_reduce(Io::host(&x, &mut y), &()) {
            Err(Error::ForkedHandle { .. }) if y.iter().all(|v| v.to_bits() == 0) => 0,
            Err(Error::ForkedHandle { .. }) => 3,
            Ok(()) => 1,
            Err(_) => 2,
        };
        let code = match (code, ranks[1].check(), ranks[0].close()) {
            (0, Err(Error::ForkedHandle { .. }), Err(Error::ForkedHandle { .. })) => 0,
            (0, ..) => 4,
            (c, ..) => c,
        };
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
    assert_eq!(code, 0, "child: 1 = a call succeeded, 2 = another error, 3 = output written, 4 = check/close");
    // The parent's ranks are untouched: no close acknowledged, generations in step.
    both_ranks_call(&ranks, 5);
    for c in &ranks {
        c.check().expect("parent healthy");
    }
}
