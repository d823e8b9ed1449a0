//! Host slices on a collective whose kernels read device memory: `Io::host` and
//! `RawRef::host` are safe constructors, and the GPU platforms' handles take any `Io` through
//! the `Collective` trait, so a host slice could reach a GPU kernel — which would dereference a
//! host address after the slice's borrow ended (calls are asynchronous). The front door refuses
//! such views with `Error::HostMemory` before any work, on every op and in the fused call.
//! Here the front door composes a stand-in backend that reads "device memory" (the
//! `Collective::host_memory` default) and counts what reaches it: nothing may, and nothing is
//! written. Views from raw addresses (the unsafe constructors: the typed cudarc entry points
//! build those) pass. The GPU suite checks the same on a real device (`nvidia` tests).
use collective_core::{Capabilities, Collective, Error, Io, IpcRoute, Op, RawMut, RawRef, RmsNorm, Route, RouteSelect};
use collective_factory::nodes::CallStream;
use collective_factory::{NoTransport, NormBackend, Routed, Routing};
use detcoll_protocol::norm::NormArgs;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rank 0 of 2 whose memory is not the host's: every call that reaches it is counted, none
/// touches memory.
#[derive(Debug, Default)]
struct DeviceMemory {
    calls: AtomicUsize,
}

impl DeviceMemory {
    fn reached(&self) -> Result<(), Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl Collective for DeviceMemory {
    type Stream = ();
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::strict(1 << 20, false)
    }
    fn route(&self, _: Op, _: usize) -> Route {
        Route::IpcOneShot
    }
    fn all_reduce(&self, _: Io<'_>, _: &()) -> Result<(), Error> {
        self.reached()
    }
    fn all_gather(&self, _: Io<'_>, _: &()) -> Result<(), Error> {
        self.reached()
    }
    fn reduce_scatter(&self, _: Io<'_>, _: &()) -> Result<(), Error> {
        self.reached()
    }
    fn reduce_scatter_many(&self, _: &[Io<'_>], _: &()) -> Result<(), Error> {
        self.reached()
    }
    fn check(&self) -> Result<(), Error> {
        Ok(())
    }
    fn synchronize(&self, _: &()) -> Result<(), Error> {
        Ok(())
    }
    fn close(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl RouteSelect for DeviceMemory {
    fn call_on_route_as_part(&self, _: Op, _: Io<'_>, _: IpcRoute, _: u32, _: &()) -> Result<(), Error> {
        self.reached()
    }
}

impl NormBackend for DeviceMemory {
    fn residual_rmsnorm(&self, _: &NormArgs, _: CallStream<'_, ()>) -> Result<(), Error> {
        self.reached()
    }
}

fn front_door() -> Routed<DeviceMemory, NoTransport<()>> {
    let rule = |op: &str| format!(r#"{{"op":"{op}","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}}"#);
    let rules = ["all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_many"].map(rule).join(",");
    let routing = Routing::from_json(&format!(r#"{{"platform":"cpu","source":"test","rules":[{rules}]}}"#)).unwrap();
    Routed::new(0, 2, 1 << 20, routing, Some(DeviceMemory::default()), None).expect("front door")
}

fn host_memory_error(r: Result<(), Error>, argument: &str) {
    match r {
        Err(Error::HostMemory { argument: a, .. }) if a == argument => {}
        other => panic!("expected HostMemory naming `{argument}`, got {other:?}"),
    }
}

#[test]
fn host_slices_are_refused_before_any_work() {
    let comm = front_door();
    assert!(!comm.host_memory());
    let x = vec![1.0f32; 8];
    let mut y = vec![-7.0f32; 8];
    let mut buf = vec![-7.0f32; 8];
    for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
        let out = if op == Op::AllGather {
            16
        } else if op == Op::ReduceScatter {
            4
        } else {
            8
        };
        let mut y = vec![-7.0f32; out];
        let r = match op {
            Op::AllReduce => comm.all_reduce(Io::host(&x, &mut y), &()),
            Op::AllGather => comm.all_gather(Io::host(&x, &mut y), &()),
            _ => comm.reduce_scatter(Io::host(&x, &mut y), &()),
        };
        host_memory_error(r, "input");
        assert!(y.iter().all(|v| *v == -7.0), "{op}: written");
    }
    host_memory_error(comm.all_reduce(Io::host_in_place(&mut buf), &()), "buffer");
    // A device input with a host output is refused too, naming the output.
    // SAFETY: never dereferenced (refused first; the backend touches no memory).
    let device_in = unsafe { RawRef::from_raw(x.as_ptr() as u64, 8, collective_core::DType::F32) };
    let r = comm.all_reduce(Io::OutOfPlace { input: device_in, output: RawMut::host(&mut y) }, &());
    host_memory_error(r, "output");
    let mut lane = vec![-7.0f32; 8];
    host_memory_error(comm.reduce_scatter_many(&[Io::host_in_place(&mut lane)], &()), "buffer");
    assert_eq!(comm.ipc().unwrap().calls.load(Ordering::SeqCst), 0, "a call reached the backend");
    assert!(buf.iter().chain(&y).chain(&lane).all(|v| *v == -7.0));
}

#[test]
fn the_fused_call_names_its_host_view() {
    let comm = front_door();
    let (rows, hidden) = (2, 4);
    let n = rows * hidden;
    let (x, w, residual) = (vec![1.0f32; n], vec![1.0f32; hidden], vec![0.5f32; n]);
    let (mut y, mut h) = (vec![-7.0f32; n], vec![-7.0f32; n]);
    // SAFETY: never dereferenced (refused first; the backend touches no memory).
    let dev = |v: &[f32]| unsafe { RawRef::from_raw(v.as_ptr() as u64, v.len(), collective_core::DType::F32) };
    // SAFETY: as above.
    let dev_mut =
        |v: &mut [f32]| unsafe { RawMut::from_raw(v.as_mut_ptr() as u64, v.len(), collective_core::DType::F32) };
    let r = comm.all_reduce_residual_rmsnorm(
        Io::host(&x, &mut y),
        RmsNorm { residual: Io::host(&residual, &mut h), weight: RawRef::host(&w), hidden, eps: 1e-6 },
        &(),
    );
    host_memory_error(r, "input");
    let r = comm.all_reduce_residual_rmsnorm(
        Io::OutOfPlace { input: dev(&x), output: dev_mut(&mut y) },
        RmsNorm {
            residual: Io::OutOfPlace { input: dev(&residual), output: RawMut::host(&mut h) },
            weight: dev(&w),
            hidden,
            eps: 1e-6,
        },
        &(),
    );
    host_memory_error(r, "h");
    let r = comm.all_reduce_residual_rmsnorm(
        Io::OutOfPlace { input: dev(&x), output: dev_mut(&mut y) },
        RmsNorm { residual: Io::host(&residual, &mut h), weight: dev(&w), hidden, eps: 1e-6 },
        &(),
    );
    host_memory_error(r, "residual");
    let r = comm.all_reduce_residual_rmsnorm(
        Io::OutOfPlace { input: dev(&x), output: dev_mut(&mut y) },
        RmsNorm {
            residual: Io::OutOfPlace { input: dev(&residual), output: dev_mut(&mut h) },
            weight: RawRef::host(&w),
            hidden,
            eps: 1e-6,
        },
        &(),
    );
    host_memory_error(r, "weight");
    assert_eq!(comm.ipc().unwrap().calls.load(Ordering::SeqCst), 0, "a call reached the backend");
    assert!(y.iter().chain(&h).all(|v| *v == -7.0));
}

#[test]
fn views_of_raw_addresses_pass_and_host_backends_take_host_slices() {
    let comm = front_door();
    let x = vec![1.0f32; 8];
    let mut y = vec![0.0f32; 8];
    // SAFETY: the stand-in backend never dereferences them.
    let io = unsafe {
        Io::OutOfPlace {
            input: RawRef::from_raw(x.as_ptr() as u64, 8, collective_core::DType::F32),
            output: RawMut::from_raw(y.as_mut_ptr() as u64, 8, collective_core::DType::F32),
        }
    };
    comm.all_reduce(io, &()).expect("a raw view reaches the backend");
    assert_eq!(comm.ipc().unwrap().calls.load(Ordering::SeqCst), 1);
    // The CPU twin reads host memory: host slices are what it takes.
    let ranks = collective_factory::cpu::thread_group(1, &collective_factory::Config::new()).unwrap();
    assert!(ranks[0].host_memory());
    ranks[0].all_reduce(Io::host(&x, &mut y), &()).unwrap();
    assert_eq!(y, x);
}
