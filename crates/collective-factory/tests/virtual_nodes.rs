//! Beyond one node, on one machine: ranks as threads on simulated hosts
//! (`cpu::virtual_nodes`). Every world from 9 to 16 and 24, 32, 64 gives `fixed-tree`'s bits
//! for every op, in place and out of place, f32/bf16/f16 — by the hierarchical route where the
//! layout allows (node-major, 2/4/8 ranks per node: the CPU twin inside each node, the host
//! transport across) and by the flat transport route otherwise — and the hierarchical route
//! equals the flat one bit for bit on the same inputs.
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::{Collective, DType, Io, Op, RawMut, RawRef, Route};
use collective_factory::{Config, CpuCollective, Routing, cpu};

const FLAT: &str = r#"{
  "platform": "cpu",
  "source": "test: the flat transport route for every op and size",
  "rules": [
    { "op": "all_reduce", "min_bytes": 0, "max_bytes": null, "route": "transport" },
    { "op": "all_gather", "min_bytes": 0, "max_bytes": null, "route": "transport" },
    { "op": "reduce_scatter", "min_bytes": 0, "max_bytes": null, "route": "transport" },
    { "op": "reduce_scatter_many", "min_bytes": 0, "max_bytes": null, "route": "transport" }
  ]
}"#;

/// Host memory of `len` elements of `dtype`, 8-byte aligned.
struct Buf {
    words: Vec<u64>,
    len: usize,
    dtype: DType,
}

impl Buf {
    fn from_bytes(bytes: &[u8], dtype: DType) -> Buf {
        let mut words = vec![0u64; bytes.len().div_ceil(8).max(1)];
        for (i, b) in bytes.iter().enumerate() {
            words[i / 8] |= u64::from(*b) << (8 * (i % 8));
        }
        Buf { words, len: bytes.len() / dtype.size(), dtype }
    }
    fn poison(len: usize, dtype: DType) -> Buf {
        Buf::from_bytes(&vec![0xA5; len * dtype.size()], dtype)
    }
    fn bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).take(self.len * self.dtype.size()).collect()
    }
    fn view(&mut self) -> RawMut<'_> {
        // SAFETY: this buffer's own memory, borrowed mutably for the view's life.
        unsafe { RawMut::from_raw(self.words.as_mut_ptr() as u64, self.len, self.dtype) }
    }
    fn view_ref(&self) -> RawRef<'_> {
        // SAFETY: as above, shared.
        unsafe { RawRef::from_raw(self.words.as_ptr() as u64, self.len, self.dtype) }
    }
}

fn input(rank: usize, n: usize, dtype: DType, seed: u64) -> Vec<u8> {
    finite_values(dtype, n, seed.wrapping_mul(1000).wrapping_add(rank as u64))
}

/// Every op on every rank of `comms` (threads), in place and out of place: each rank's outputs,
/// checked against `fixed-tree` here, returned for comparison with another route.
fn run_ops(comms: &[CpuCollective], dtype: DType, seed: u64) -> Vec<Vec<Vec<u8>>> {
    let world = comms.len();
    let size = dtype.size();
    // all_reduce: a length that leaves a tail past the last whole multiple of 8.
    let n = 8 * 37 + 5;
    let k = 13;
    let ins: Vec<Vec<u8>> = (0..world).map(|r| input(r, n, dtype, seed)).collect();
    let want_ar = reference_reduce(&ins, dtype);
    let rs_ins: Vec<Vec<u8>> = (0..world).map(|r| input(r, world * k, dtype, seed + 7)).collect();
    let want_rs = reference_reduce(&rs_ins, dtype);
    let ag_ins: Vec<Vec<u8>> = (0..world).map(|r| input(r, k, dtype, seed + 9)).collect();
    let want_ag: Vec<u8> = ag_ins.concat();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let (ins, rs_ins, ag_ins) = (&ins, &rs_ins, &ag_ins);
                s.spawn(move || {
                    let r = comm.rank();
                    let mut outs = Vec::new();
                    // all_reduce out of place, then in place.
                    let src = Buf::from_bytes(&ins[r], dtype);
                    let mut out = Buf::poison(n, dtype);
                    comm.all_reduce(Io::OutOfPlace { input: src.view_ref(), output: out.view() }, &())
                        .expect("all_reduce");
                    outs.push(out.bytes());
                    let mut buf = Buf::from_bytes(&ins[r], dtype);
                    comm.all_reduce(Io::InPlace(buf.view()), &()).expect("all_reduce in place");
                    outs.push(buf.bytes());
                    // reduce_scatter out of place and in place (the shard lands at `r`).
                    let src = Buf::from_bytes(&rs_ins[r], dtype);
                    let mut out = Buf::poison(k, dtype);
                    let io = Io::OutOfPlace { input: src.view_ref(), output: out.view() };
                    comm.reduce_scatter(io, &()).expect("reduce_scatter");
                    outs.push(out.bytes());
                    let mut buf = Buf::from_bytes(&rs_ins[r], dtype);
                    comm.reduce_scatter(Io::InPlace(buf.view()), &()).expect("reduce_scatter in place");
                    outs.push(buf.bytes()[r * k * size..(r + 1) * k * size].to_vec());
                    // reduce_scatter_many: two lanes, the second the first's input reversed.
                    let a = Buf::from_bytes(&rs_ins[r], dtype);
                    let rev: Vec<u8> = rs_ins[r].chunks(size).rev().flatten().copied().collect();
                    let b = Buf::from_bytes(&rev, dtype);
                    let (mut oa, mut ob) = (Buf::poison(k, dtype), Buf::poison(k, dtype));
                    let lanes = [
                        Io::OutOfPlace { input: a.view_ref(), output: oa.view() },
                        Io::OutOfPlace { input: b.view_ref(), output: ob.view() },
                    ];
                    comm.reduce_scatter_many(&lanes, &()).expect("reduce_scatter_many");
                    outs.push(oa.bytes());
                    outs.push(ob.bytes());
                    // all_gather out of place, then in place.
                    let src = Buf::from_bytes(&ag_ins[r], dtype);
                    let mut out = Buf::poison(world * k, dtype);
                    comm.all_gather(Io::OutOfPlace { input: src.view_ref(), output: out.view() }, &())
                        .expect("all_gather");
                    outs.push(out.bytes());
                    let mut whole = vec![0xA5u8; world * k * size];
                    whole[r * k * size..(r + 1) * k * size].copy_from_slice(&ag_ins[r]);
                    let mut buf = Buf::from_bytes(&whole, dtype);
                    comm.all_gather(Io::InPlace(buf.view()), &()).expect("all_gather in place");
                    outs.push(buf.bytes());
                    outs
                })
            })
            .collect();
        let all: Vec<Vec<Vec<u8>>> = handles.into_iter().map(|h| h.join().expect("rank thread")).collect();
        let rev_ins: Vec<Vec<u8>> = rs_ins.iter().map(|x| x.chunks(size).rev().flatten().copied().collect()).collect();
        let want_rev = reference_reduce(&rev_ins, dtype);
        for (r, outs) in all.iter().enumerate() {
            let shard = |v: &[u8]| v[r * k * size..(r + 1) * k * size].to_vec();
            let want = [
                want_ar.clone(),
                want_ar.clone(),
                shard(&want_rs),
                shard(&want_rs),
                shard(&want_rs),
                shard(&want_rev),
                want_ag.clone(),
                want_ag.clone(),
            ];
            let names = [
                "all_reduce",
                "all_reduce in place",
                "reduce_scatter",
                "reduce_scatter in place",
                "rsm lane 0",
                "rsm lane 1",
                "all_gather",
                "all_gather in place",
            ];
            for ((got, want), name) in outs.iter().zip(&want).zip(names) {
                assert!(got == want, "world {world} {dtype}: rank {r} {name} differs from fixed-tree");
            }
        }
        all
    })
}

fn config() -> Config {
    Config::new().with_capacity(1 << 16)
}

/// `nodes` x `local` virtual nodes: the route the layout takes, then every op against
/// `fixed-tree` and against the flat transport route on the same inputs.
fn check(nodes: usize, local: usize, dtypes: &[DType]) {
    let world = nodes * local;
    let comms = cpu::virtual_nodes(nodes, local, &config()).expect("virtual nodes");
    let hier = local.is_power_of_two() && (2..=8).contains(&local);
    let want = if hier { Route::Hierarchical } else { Route::Transport };
    for op in Op::ALL {
        assert_eq!(comms[0].route(op, 4096), want, "{nodes}x{local}: {op}");
    }
    assert_eq!(comms.iter().all(|c| c.nodes().is_some()), hier, "{nodes}x{local}: hierarchical backends");
    let flat = cpu::virtual_nodes(nodes, local, &config().with_routing(Routing::from_json(FLAT).expect("flat")))
        .expect("flat virtual nodes");
    assert_eq!(flat[0].route(Op::AllReduce, 4096), Route::Transport);
    for (i, &dtype) in dtypes.iter().enumerate() {
        let seed = (world * 31 + i) as u64;
        let a = run_ops(&comms, dtype, seed);
        let b = run_ops(&flat, dtype, seed);
        assert!(a == b, "{nodes}x{local} {dtype}: the hierarchical route and the flat one differ");
    }
    // Close is collective: every rank at once.
    for group in [&comms, &flat] {
        std::thread::scope(|s| {
            for c in group.iter() {
                s.spawn(move || c.close().expect("close"));
            }
        });
    }
    println!("{nodes}x{local} (world {world}): {want:?} = flat = fixed-tree for {dtypes:?}");
}

#[test]
fn worlds_9_to_16_take_the_canonical_tree() {
    // (nodes, ranks per node) for every world from 9 to 16: hierarchical where the ranks per
    // node are 2, 4 or 8, flat otherwise (3 or 1 per node).
    for (n, l) in [(3, 3), (5, 2), (11, 1), (3, 4), (13, 1), (7, 2), (5, 3), (2, 8)] {
        check(n, l, &[DType::F32]);
    }
}

#[test]
fn layouts_of_the_issue_in_every_dtype() {
    for (n, l) in [(2, 4), (4, 2), (3, 4), (2, 8), (4, 4), (8, 2)] {
        check(n, l, &[DType::F32, DType::BF16, DType::F16]);
    }
}

#[test]
fn worlds_24_32_and_64() {
    for (n, l) in [(3, 8), (4, 8), (8, 8)] {
        check(n, l, &[DType::BF16]);
    }
}

/// More ranks on one host than one IPC world holds (`cpu::thread_group(16)`, as
/// `detcoll-run --nproc 16` on one machine): nodes of the one-host layout (16 = 2 x 8, 12 = 3 x 4,
/// 24 = 3 x 8) by the hierarchical route, an odd world (9) by the flat transport route; bits equal
/// to the flat route's and `fixed-tree`'s.
#[test]
fn one_host_above_the_ipc_world_is_split_into_nodes() {
    for (world, want) in [(16, Some((2, 8))), (12, Some((3, 4))), (24, Some((3, 8))), (9, None)] {
        let comms = cpu::thread_group(world, &config()).expect("thread group");
        let layout = comms[0].nodes().map(|n| (n.layout().nodes, n.layout().local));
        assert_eq!(layout, want, "world {world}");
        let route = if want.is_some() { Route::Hierarchical } else { Route::Transport };
        for op in Op::ALL {
            assert_eq!(comms[0].route(op, 4096), route, "world {world}: {op}");
        }
        let flat = cpu::thread_group(world, &config().with_routing(Routing::from_json(FLAT).expect("flat")))
            .expect("flat thread group");
        let seed = world as u64 * 7;
        assert!(run_ops(&comms, DType::BF16, seed) == run_ops(&flat, DType::BF16, seed), "world {world}");
        for group in [&comms, &flat] {
            std::thread::scope(|s| {
                for c in group.iter() {
                    s.spawn(move || c.close().expect("close"));
                }
            });
        }
    }
}
