//! A `fork` while another thread of the parent is inside a call on the handle: the child's
//! call on that handle returns `ForkedHandle` at once, before the call lock — which the child
//! inherits as the parent held it, locked for good (the thread holding it does not exist in the
//! child). Before, the child's call waited on that lock forever (found by a probe written as a
//! user calls, through Python). The parent's call completes with the exact sum. A real `fork`,
//! alone in this test binary.
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, Error, Io, cpu};
use std::time::Duration;

#[test]
fn a_child_forked_while_a_parent_thread_is_in_a_call_gets_forked_handle() {
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(4096).with_timeout(Duration::from_secs(20)))
        .expect("thread group");
    let (r0, r1) = (&ranks[0], &ranks[1]);
    std::thread::scope(|s| {
        // Rank 0: a call that waits for rank 1 across the fork.
        s.spawn(move || {
            let x = vec![1.0f32; 64];
            let mut y = vec![0f32; 64];
            r0.all_reduce(Io::host(&x, &mut y), &()).expect("the parent's call in flight");
            assert!(y.iter().all(|v| v.to_bits() == 3.0f32.to_bits()), "{y:?}");
        });
        std::thread::sleep(Duration::from_millis(300));
        // Allocated before the fork: the child allocates nothing (another thread may hold the
        // allocator's lock at the fork).
        let x = vec![1.0f32; 64];
        let mut y = vec![0f32; 64];
        // SAFETY: the child makes one call, checks it and leaves with `_exit`; a hang is cut
        // by `alarm`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: async-signal-safe; SIGALRM's default action ends the child.
            unsafe { libc::alarm(20) };
            let code = match r0.all_reduce(Io::host(&x, &mut y), &()) {
                Err(Error::ForkedHandle { .. }) if y.iter().all(|v| v.to_bits() == 0) => 0,
                Err(Error::ForkedHandle { .. }) => 3,
                Ok(()) => 1,
                Err(_) => 2,
            };
            // SAFETY: leaves the child without the test harness's exit path.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        assert!(libc::WIFEXITED(status), "child did not exit (a hang ends it by SIGALRM): {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child: 1 = Ok, 2 = another error, 3 = y written");
        // Rank 1 comes: the parent's call in flight completes.
        let x = vec![2.0f32; 64];
        let mut y = vec![0f32; 64];
        r1.all_reduce(Io::host(&x, &mut y), &()).expect("rank 1");
    });
}
