//! Issue 12 on the CPU twin, ranks as threads: generation wrap-around, close diagnostics, a peer
//! that closed, and capacities no layout can hold.
use collective_core::Timeouts;
use collective_core::{Collective, Error, Io, Op, Route};
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(3);
/// Bits no correct call writes: a failed call must leave outputs holding exactly this.
const SENTINEL: u32 = 0x7fc0_dead;
/// all_reduce calls of at least this many bytes take RS+AG.
const THRESHOLD: usize = 4096;

fn config() -> ShmConfig {
    let mut c = ShmConfig::new(1 << 16).with_timeouts(Timeouts { peer: BOUND, close: Duration::from_millis(300) });
    c.routes = collective_core::RouteTable::ipc_default(THRESHOLD);
    c
}

/// Rank `r`'s input of call `call`: `n` values, distinct per rank and call.
fn input(r: usize, call: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + r * 131 + call * 17) % 1000) as f32 * 0.013 - 3.1).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `f(rank handle, rank)` on every rank, one thread each; results in rank order.
fn on_all<T: Send>(comms: &[ShmCollective], f: impl Fn(&ShmCollective, usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(c, r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One call of `op` with `n` elements per rank input on every rank, each rank's output checked
/// bit for bit against the fixed tree over all inputs.
fn checked_call(comms: &[ShmCollective], op: Op, n: usize, call: usize) {
    let world = comms.len();
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, call, n)).collect();
    let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let mut want = vec![0f32; n];
    fixed_tree::reduce(&views, &mut want).unwrap();
    let expect = |r: usize| -> Vec<f32> {
        match op {
            Op::AllReduce => want.clone(),
            Op::AllGather => inputs.concat(),
            _ => want[r * n / world..(r + 1) * n / world].to_vec(),
        }
    };
    let outs = on_all(comms, |c, r| {
        let len = match op {
            Op::AllReduce => n,
            Op::AllGather => n * world,
            _ => n / world,
        };
        let mut out = vec![f32::from_bits(SENTINEL); len];
        let io = Io::host(&inputs[r], &mut out);
        match op {
            Op::AllReduce => c.all_reduce(io, &()),
            Op::AllGather => c.all_gather(io, &()),
            _ => c.reduce_scatter(io, &()),
        }
        .map(|()| out)
    });
    for (r, out) in outs.into_iter().enumerate() {
        let out = out.unwrap_or_else(|e| panic!("call {call} ({op}, {n}) on rank {r}: {e}"));
        assert_eq!(bits(&out), bits(&expect(r)), "call {call} ({op}, {n}) rank {r}");
    }
}

/// Element counts taking the one-shot and the RS+AG all_reduce routes.
const ONE_SHOT: usize = 64;
const RS_AG: usize = 2048;

#[test]
fn first_rs_ag_call_after_2_pow_31_one_shot_calls_is_not_corrupt() {
    let comms = ShmCollective::group_at_generation(2, config(), (1 << 31) + 5).unwrap();
    assert_eq!(comms[0].route(Op::AllReduce, ONE_SHOT * 4), Route::IpcOneShot);
    assert_eq!(comms[0].route(Op::AllReduce, RS_AG * 4), Route::IpcReduceScatterAllGather);
    let t = Instant::now();
    checked_call(&comms, Op::AllReduce, ONE_SHOT, 0);
    checked_call(&comms, Op::AllReduce, RS_AG, 1);
    assert!(t.elapsed() < BOUND, "{:?}", t.elapsed());
}

#[test]
fn mixed_calls_across_the_generation_wrap() {
    for world in [2, 4] {
        let comms = ShmCollective::group_at_generation(world, config(), u32::MAX - 3).unwrap();
        let calls = [
            (Op::AllReduce, ONE_SHOT),
            (Op::AllReduce, RS_AG),
            (Op::AllGather, 96),
            (Op::ReduceScatter, 256),
            (Op::AllReduce, RS_AG),
            (Op::AllReduce, ONE_SHOT),
            (Op::ReduceScatter, 512),
            (Op::AllGather, 8),
        ];
        for (i, (op, n)) in calls.into_iter().enumerate() {
            checked_call(&comms, op, n, i);
        }
    }
}

/// Two ranks of the process-mode twin (staging in `/dev/shm`, close waits for every peer's
/// acknowledgement) built by two threads of this process. (Thread groups share their staging
/// reference-counted, so their close never waits.)
fn process_mode_pair() -> Vec<ShmCollective> {
    let boots = collective_core::bootstrap::LocalBootstrap::group(2);
    std::thread::scope(|s| {
        let hs: Vec<_> = boots.iter().map(|b| s.spawn(move || ShmCollective::new(b, config()).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_second_close_after_a_failed_one_reports_the_failure() {
    let comms = process_mode_pair();
    // Rank 1 never closes: rank 0's close times out waiting for its acknowledgement.
    let t = Instant::now();
    let first = comms[0].close().expect_err("close without the peer's acknowledgement");
    assert!(matches!(first, Error::PeerTimeout { peer: 1, .. }), "{first}");
    assert!(t.elapsed() < Duration::from_millis(300) + Duration::from_secs(1), "{:?}", t.elapsed());
    let t = Instant::now();
    match comms[0].close() {
        Err(Error::CloseFailed { cause }) => assert!(cause.contains(&first.to_string()), "{cause}"),
        other => panic!("second close: {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_millis(100), "the second close waited again");
}

/// A sentinel-filled output, a call on it, and the checks that it failed at once with
/// `PeerClosed` naming rank 1 and wrote nothing.
fn expect_peer_closed(c: &ShmCollective, started: Instant) {
    let input = input(0, 0, ONE_SHOT);
    let mut out = vec![f32::from_bits(SENTINEL); ONE_SHOT];
    let err = c.all_reduce(Io::host(&input, &mut out), &()).expect_err("a call with a closed peer");
    assert!(matches!(err, Error::PeerClosed { peer: 1, .. }), "{err}");
    assert!(started.elapsed() < BOUND / 2, "noticed only after {:?}", started.elapsed());
    assert!(out.iter().all(|x| x.to_bits() == SENTINEL), "a failed call wrote its output");
    let again = c.all_reduce(Io::host(&input, &mut out), &()).expect_err("poisoned");
    assert!(matches!(again, Error::Poisoned { .. }), "{again}");
}

#[test]
fn a_call_after_the_peer_closed_fails_at_once() {
    let mut comms = ShmCollective::group(2, config()).unwrap();
    checked_call(&comms, Op::AllReduce, ONE_SHOT, 0);
    drop(comms.pop()); // rank 1 acknowledges close without waiting
    expect_peer_closed(&comms[0], Instant::now());
}

#[test]
fn a_peer_closing_while_this_rank_waits_fails_the_wait_at_once() {
    let mut comms = ShmCollective::group(2, config()).unwrap();
    let last = comms.pop().unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            drop(last);
        });
        expect_peer_closed(&comms[0], t);
    });
    assert!(t.elapsed() >= Duration::from_millis(200));
}

#[test]
fn a_peer_closing_right_after_the_last_call_does_not_fail_it() {
    for round in 0..200 {
        let n = if round % 2 == 0 { ONE_SHOT } else { RS_AG };
        let mut comms = ShmCollective::group(2, config()).unwrap();
        let last = comms.pop().unwrap();
        let inputs = [input(0, round, n), input(1, round, n)];
        let mut want = vec![0f32; n];
        fixed_tree::reduce(&[&inputs[0][..], &inputs[1][..]], &mut want).unwrap();
        let outs = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut out = vec![0f32; n];
                let r = last.all_reduce(Io::host(&inputs[1], &mut out), &());
                drop(last); // acknowledges close while rank 0 may still be reading
                r.map(|()| out)
            });
            let mut out = vec![0f32; n];
            if round % 3 == 0 {
                std::thread::yield_now();
            }
            let r0 = comms[0].all_reduce(Io::host(&inputs[0], &mut out), &()).map(|()| out);
            [r0, h.join().unwrap()]
        });
        for (r, o) in outs.into_iter().enumerate() {
            let o = o.unwrap_or_else(|e| panic!("round {round} rank {r}: {e}"));
            assert_eq!(bits(&o), bits(&want), "round {round} rank {r}");
        }
    }
}

#[test]
fn capacities_no_layout_can_hold_are_invalid_config() {
    for capacity in [1usize << 63, usize::MAX] {
        let t = Instant::now();
        match ShmCollective::group(2, ShmConfig::new(capacity)) {
            Err(Error::InvalidConfig { .. }) => {}
            other => panic!("capacity {capacity}: {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}

#[test]
fn ranks_built_with_different_capacities_fail_every_rank_naming_the_field() {
    let boots = collective_core::bootstrap::LocalBootstrap::group(2);
    let results: Vec<Result<ShmCollective, Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .iter()
            .enumerate()
            .map(|(r, b)| {
                s.spawn(move || {
                    let mut c = config();
                    c.capacity <<= r;
                    ShmCollective::new(b, c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.iter().enumerate() {
        match res {
            Err(Error::ConfigMismatch { detail }) => assert!(detail.contains("capacity"), "rank {r}: {detail}"),
            other => panic!("rank {r}: expected ConfigMismatch, got {other:?}"),
        }
    }
}
