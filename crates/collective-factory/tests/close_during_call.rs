//! `close` from one thread while another thread's call on the same handle waits for its peer:
//! close waits for that call to end (its waits are bounded), and the calls after it are
//! `Closed`. Before, close returned at once, while the call still ran on the staging and the
//! peers' mappings that a rank with staging of its own frees at close (found by a probe
//! written as a user calls).
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, Error, Io, cpu};
use std::time::{Duration, Instant};

#[test]
fn close_waits_for_a_call_another_thread_has_in_flight() {
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 16).with_timeout(Duration::from_secs(20)))
        .expect("group");
    let (r0, r1) = (&ranks[0], &ranks[1]);
    let t0 = Instant::now();
    let late = Duration::from_millis(600);
    let (call_end, close_end) = std::thread::scope(|s| {
        // Rank 0, thread A: a call whose peer comes 600 ms later.
        let a = s.spawn(move || {
            let x = vec![1.0f32; 256];
            let mut y = vec![0f32; 256];
            let r = r0.all_reduce(Io::host(&x, &mut y), &());
            let end = t0.elapsed();
            if r.is_ok() {
                assert!(y.iter().all(|&v| v.to_bits() == 3.0f32.to_bits()), "the call in flight: {y:?}");
            }
            println!("rank 0 thread A: {r:?} at {end:?}");
            end
        });
        // Rank 0, thread B: close while A waits.
        let b = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let r = r0.close();
            let end = t0.elapsed();
            println!("rank 0 thread B: close {r:?} at {end:?}");
            let x = vec![1.0f32; 4];
            let mut y = vec![0f32; 4];
            match r0.all_reduce(Io::host(&x, &mut y), &()) {
                Err(Error::Closed) => {}
                other => panic!("a call after close: expected Closed, got {other:?}"),
            }
            end
        });
        // Rank 1: its call comes late.
        s.spawn(move || {
            std::thread::sleep(late);
            let x = vec![2.0f32; 256];
            let mut y = vec![0f32; 256];
            println!("rank 1: {:?}", r1.all_reduce(Io::host(&x, &mut y), &()));
        });
        (a.join().expect("thread A"), b.join().expect("thread B"))
    });
    // The call in flight cannot end before rank 1 starts its call (`late` after the start), and
    // close waits for it. (Comparing with `call_end` would race: thread A reads its clock only
    // after the call has released the handle to close.)
    assert!(
        close_end >= late,
        "close returned at {close_end:?}, before the call in flight could end (rank 1 called at {late:?}; \
         the call ended at {call_end:?})"
    );
}
