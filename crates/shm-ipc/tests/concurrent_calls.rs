//! Several threads calling one handle (issue 25): whole calls are atomic per handle — every
//! chunk of a call above the capacity belongs to that call — and serialised in one order per
//! handle, so every output is one call's result and both ranks agree on which calls met.
//!
//! Rank 0 is driven by two threads (inputs 1 and 2, 20 calls each), rank 1 by one thread (40
//! calls, inputs 10 and 20 alternating); 16 KiB calls on a 4 KiB capacity run in chunks. Each
//! output must be a constant `x0 + x1` with `x0` the calling thread's input, and rank 1 must
//! have met each of rank 0's threads exactly 20 times.
use collective_core::{Collective, Io};
use shm_ipc::{ShmCollective, ShmConfig};

/// One collective call of `x` into `y` on `comm` (same length, all_reduce semantics).
type CallFn = dyn Fn(&dyn CallOn, &[f32], &mut [f32]) + Sync;

/// `call(comm, x, y)` from several threads of every rank.
fn drive(ranks: &[impl Collective<Stream = ()>], call: &CallFn) {
    let n = 4096;
    std::thread::scope(|s| {
        let mut zero = Vec::new();
        for t in 0..2usize {
            let c = &ranks[0];
            zero.push(s.spawn(move || {
                for k in 0..20 {
                    let x = vec![1.0f32 + t as f32; n];
                    let mut y = vec![0f32; n];
                    call(&On(c), &x, &mut y);
                    assert!(
                        y.iter().all(|&v| v.to_bits() == y[0].to_bits()),
                        "thread {t} call {k}: chunks of different calls mixed"
                    );
                    let x1 = y[0] - x[0];
                    assert!(x1 == 10.0 || x1 == 20.0, "thread {t} call {k}: {} is no x0 + x1", y[0]);
                }
            }));
        }
        let c = &ranks[1];
        let one = s.spawn(move || {
            let mut met = [0usize; 2];
            for k in 0..40 {
                let x = vec![10.0f32 * (1 + k % 2) as f32; n];
                let mut y = vec![0f32; n];
                call(&On(c), &x, &mut y);
                assert!(y.iter().all(|&v| v.to_bits() == y[0].to_bits()), "rank 1 call {k}: chunks mixed");
                let x0 = y[0] - x[0];
                assert!(x0 == 1.0 || x0 == 2.0, "rank 1 call {k}: {} is no x0 + x1", y[0]);
                met[x0 as usize - 1] += 1;
            }
            assert_eq!(met, [20, 20], "rank 1 met rank 0's threads unevenly");
        });
        for h in zero {
            h.join().unwrap();
        }
        one.join().unwrap();
    });
}

/// A call on any host collective, object-safe for `drive`'s closure.
trait CallOn {
    fn all_reduce(&self, x: &[f32], y: &mut [f32]);
    fn reduce_scatter_many_as_all_reduce(&self, x: &[f32], y: &mut [f32]);
}
struct On<'a, C>(&'a C);
impl<C: Collective<Stream = ()>> CallOn for On<'_, C> {
    fn all_reduce(&self, x: &[f32], y: &mut [f32]) {
        self.0.all_reduce(Io::host(x, y), &()).expect("all_reduce");
    }
    /// Two lanes of a reduce_scatter_many whose shards, gathered back by an all_gather call
    /// of the same handle, would interleave with other threads' calls; instead each lane's
    /// shard is checked in place: `y` gets this rank's shard of both lanes, repeated.
    fn reduce_scatter_many_as_all_reduce(&self, x: &[f32], y: &mut [f32]) {
        let world = self.0.world_size();
        let half = x.len() / 2;
        let (xa, xb) = x.split_at(half);
        let mut ya = vec![0f32; half / world];
        let mut yb = vec![0f32; half / world];
        self.0.reduce_scatter_many(&[Io::host(xa, &mut ya), Io::host(xb, &mut yb)], &()).expect("reduce_scatter_many");
        for (i, v) in y.iter_mut().enumerate() {
            *v = if i % 2 == 0 { ya[i % ya.len()] } else { yb[i % yb.len()] };
        }
    }
}

#[test]
fn chunked_calls_from_two_threads_on_one_handle_are_atomic() {
    let ranks = ShmCollective::group(2, ShmConfig::new(4096)).unwrap();
    drive(&ranks, &|c, x, y| c.all_reduce(x, y));
}

#[test]
fn chunked_reduce_scatter_many_from_two_threads_on_one_handle_is_atomic() {
    let ranks = ShmCollective::group(2, ShmConfig::new(4096)).unwrap();
    drive(&ranks, &|c, x, y| c.reduce_scatter_many_as_all_reduce(x, y));
}
