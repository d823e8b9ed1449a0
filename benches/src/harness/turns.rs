//! The global enqueue order of thread ranks that share a GPU: call k of ranks 0..world, then
//! call k+1, as one host thread driving every rank would (see `super::cuda`'s module doc for
//! why such ranks need it). A thin per-rank handle over the conformance suite's [`Order`], so
//! the bench enqueues exactly as the GPU suites that proved the order do.
use anyhow::Context;
use collective_core::conformance::sequence::Order;
use std::cell::Cell;
use std::sync::Arc;

/// One rank's place in a shared [`Order`].
#[derive(Debug)]
pub struct RankTurns {
    order: Arc<Order>,
    rank: usize,
    world: usize,
    /// Calls this rank enqueued so far.
    calls: Cell<usize>,
}

impl RankTurns {
    /// One handle per rank of a world of `world` ranks, all over one order.
    pub fn group(world: usize) -> Vec<RankTurns> {
        let order = Arc::new(Order::default());
        (0..world).map(|rank| RankTurns { order: order.clone(), rank, world, calls: Cell::new(0) }).collect()
    }

    /// Runs `enqueue` (this rank's next collective call) in its turn. A rank whose wait or call
    /// fails breaks the order, so its peers fail at once instead of waiting for its turns; a
    /// rank that stops calling leaves them waiting for at most the order's bound.
    pub fn run(&self, enqueue: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<()> {
        let k = self.calls.get();
        self.calls.set(k + 1);
        let mine = k.checked_mul(self.world).and_then(|t| t.checked_add(self.rank)).context("enqueue turn overflow")?;
        let member = self.order.member();
        let turn = self.order.wait(mine).map_err(anyhow::Error::msg)?;
        let result = enqueue();
        drop(turn);
        if result.is_ok() {
            member.finished();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    #[test]
    fn calls_enqueue_in_the_global_call_order() {
        let (world, calls) = (4, 50);
        let log = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for turns in RankTurns::group(world) {
                let log = &log;
                s.spawn(move || {
                    for k in 0..calls {
                        let mut enqueue = || {
                            log.lock().unwrap().push((k, turns.rank));
                            Ok(())
                        };
                        turns.run(&mut enqueue).unwrap();
                    }
                });
            }
        });
        let want: Vec<_> = (0..calls).flat_map(|k| (0..world).map(move |r| (k, r))).collect();
        assert_eq!(*log.lock().unwrap(), want);
    }

    #[test]
    fn a_failing_call_fails_its_peers_at_once() {
        let world = 3;
        let t = Instant::now();
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = RankTurns::group(world)
                .into_iter()
                .map(|turns| {
                    s.spawn(move || {
                        for _ in 0..10 {
                            turns.run(&mut || if turns.rank == 1 { anyhow::bail!("injected") } else { Ok(()) })?;
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
        assert_eq!(results[1].as_ref().unwrap_err().to_string(), "injected");
        for r in [0, 2] {
            let e = results[r].as_ref().expect_err("a peer of the failed rank must fail").to_string();
            assert!(e.contains("another rank failed"), "rank {r}: {e}");
        }
    }
}
