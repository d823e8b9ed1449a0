//! The fused all_reduce + residual + RMSNorm at the front door
//! ([`Routed::all_reduce_residual_rmsnorm`]): every argument validated before any device
//! work, the all_reduce by the agreed route (any route: the bits are the tree's), then the
//! residual + RMSNorm of the rank's device on the same stream — the evaluation of
//! `fixed_tree::rmsnorm`, so `y` is bit-identical across batch sizes, routes, TP sizes (with
//! the TP-invariant layer) and runs.
//!
//! Where the table sends the all_reduce to an IPC route (one-shot, LL push, bulk push, RS+AG)
//! and the batch has at most [`ONE_KERNEL_MAX_ROWS`] rows, and at most as many as a launch has
//! blocks, the call is one kernel: the norm is the epilogue of the all_reduce's last launch
//! (`Launch::SingleNorm`, `detcoll_collective_norm`: the collective, a barrier of the launch's
//! blocks, then the rows). So is a batch of at least [`GATHERED_MIN_ROWS`] rows on RS+AG in one
//! launch, whose norm reads the peers' reduced shards in place, and a batch of any size on
//! one-shot in one launch whose rows are one protocol tile each (f16/bf16 of hidden 4096: each
//! row normalised in registers right after its reduce), one of rows of two tiles (hidden
//! 8192) with a block for each row, and a batch of any size on bulk push or RS+AG whose rows
//! are one protocol tile each and whose shards are whole rows, in every launch of the call (the
//! row forms in the protocol: each block normalises the own shard's rows as it reduces them and
//! the peers' rows where their reduced shards lie after phase 2)
//! ([`NormBackend::one_kernel_at_any_size`]);
//! see [`one_kernel`]. On the other routes
//! (transport, hierarchical, the hybrid), for the other batches and at world 1 the norm is a
//! second launch on the same stream.
use crate::Routed;
use crate::routed::{NoTransport, OnStream, contributed_bytes};
use crate::scratch::CallStream;
use crate::via::Via;
use collective_core::{
    Collective, Error, Io, IpcRoute, NormCall, Op, ResidualRmsNorm, RmsNorm, RouteSelect, Signature, validate,
    validate_norm,
};
use detcoll_protocol::NormDevice;
use detcoll_protocol::norm::{NormArgs, NormParams};

/// The most rows a fused call takes in the one-kernel form (and no more than a launch has
/// blocks: [`one_kernel`]); larger batches run the norm as a second (programmatic, on CUDA)
/// launch. The epilogue has the collective's blocks (at most its
/// resident grid) for the rows, the separate kernel one block per row: on one H200 (bf16,
/// hidden 4096/8192, thread ranks, benches/results/h200-2026-12-03-fused-norm.md) the one
/// kernel was the faster eager call up to 64 rows (1.10-1.47x the all_reduce alone at world 2
/// against 1.36-1.80x for two launches) and the slower one from 512 rows on (2.2x against
/// 1.6x at 8192 x 4096). The bits are the same either way.
pub const ONE_KERNEL_MAX_ROWS: usize = 64;

/// The fewest rows from which a fused call whose norm can read the gathered sums in place
/// (RS+AG, one launch: [`NormBackend::one_kernel_at_any_size`]) is one kernel, and from which
/// the engine lets a fused launch's norm read them (`CollectiveNormParams::new`). That form runs
/// a row per warp on the protocol's blocks, so a row costs a few dependent memory round trips:
/// on one H200 (bf16, worlds 4/8, hidden 4096/8192,
/// benches/results/h200-2026-12-03-fused-norm-gathered.md) it was 3-13 % faster than the
/// all_reduce then the norm kernel from 512 rows on, and 1.3-1.7x slower at 128 rows, where the
/// norm kernel's block per row has the whole GPU.
pub const GATHERED_MIN_ROWS: usize = detcoll_protocol::params::NORM_GATHERED_MIN_ROWS;

/// Whether a fused call of `rows` rows is one kernel (the norm as the epilogue of the
/// all_reduce's last launch) rather than the all_reduce then the norm as a launch of its own,
/// given the rows the epilogue normalises in one pass ([`NormBackend::epilogue_rows`]) and
/// whether the call's launch takes a form that pays at any batch size
/// ([`NormBackend::one_kernel_at_any_size`], asked only where the first rule below says no).
/// The bits are the same either way; this is where each form measured faster (bf16, thread
/// ranks, graphs):
///
/// * up to [`ONE_KERNEL_MAX_ROWS`] rows when the epilogue has a block for every row. With more
///   rows than blocks a block normalises several rows one after the other, while the norm
///   kernel has a block per row on the whole GPU: with four or eight ranks sharing the GPU
///   (33 or 16 blocks each) the one kernel was 0.1-5.0 us slower where the rows outnumbered
///   the blocks (17-64 rows at world 8, 40-64 of 4096 at world 4; one exception, 40-48 rows
///   of 8192 at world 4, 0.2-0.35 us faster), and 1.2-1.6 us faster with a row per block (24-32
///   rows of 8192 on RS+AG at world 4) (benches/results/h200-2026-12-05-epilogue-rows.md). A
///   rank with a GPU of its own has a block per multiprocessor, more than
///   [`ONE_KERNEL_MAX_ROWS`];
/// * from [`GATHERED_MIN_ROWS`] rows where the norm reads the gathered sums (a warp per row);
/// * at any batch size where each row is normalised in registers right after its reduce (the
///   row loop: one-shot in one launch, a row a protocol tile), which re-reads nothing; and
///   where every row of two protocol tiles (hidden 8192) has a block that holds it in
///   registers (one-shot in one launch, rows up to the resident grid); and on bulk push or
///   RS+AG with rows of one tile in whole-row shards in every launch (the row forms in the
///   protocol).
pub fn one_kernel(rows: usize, epilogue_rows: usize, at_any_size: impl FnOnce() -> bool) -> bool {
    (rows < GATHERED_MIN_ROWS && rows <= ONE_KERNEL_MAX_ROWS.min(epilogue_rows)) || at_any_size()
}

/// A backend that can launch the residual + RMSNorm kernel on its device.
pub trait NormBackend: Collective {
    /// Enqueues the norm of a validated call on `stream`.
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, Self::Stream>) -> Result<(), Error>;

    /// Enqueues the all_reduce of a fused call by IPC `route`, signed with the norm of `args`
    /// (`Signature::norm_split`: peers disagreeing on `hidden` or `eps`, or making a plain
    /// all_reduce, fail with `SignatureMismatch`) joined with `part` (the front door's call
    /// number, `Signature::call_split`; 0 for none), and, with `fuse`, the norm as the epilogue
    /// of its last launch (the one-kernel form, `Launch::SingleNorm`). `Ok(true)`: the norm is
    /// enqueued too; `Ok(false)`: only the all_reduce was (`fuse` false, or a world of one
    /// rank), the caller enqueues the norm. A backend without IPC routes refuses
    /// (`InvalidConfig`: the default).
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_then_norm(
        &self,
        io: Io<'_>,
        route: IpcRoute,
        args: &NormArgs,
        fuse: bool,
        part: u32,
        stream: CallStream<'_, Self::Stream>,
    ) -> Result<bool, Error> {
        let _ = (io, route, args, fuse, part, stream);
        Err(not_ipc())
    }

    /// The rows the one-kernel form's epilogue normalises with a block each, in one pass (see
    /// [`one_kernel`]). Backends without IPC routes: 0 (never asked).
    fn epilogue_rows(&self) -> usize {
        0
    }

    /// Whether a fused call of `io` by IPC `route` is one kernel whatever [`one_kernel`]'s
    /// first rule says: from [`GATHERED_MIN_ROWS`] rows, its norm reads the gathered sums in
    /// place and covers the whole call (`IpcCollective::fused_norm_reads_gathered`); at any
    /// rows, it normalises each row in registers after its reduce
    /// (`IpcCollective::fused_norm_row_loop`, `fused_norm_two_tile_rows`,
    /// `fused_norm_shard_rows`). Backends without IPC routes: never.
    fn one_kernel_at_any_size(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        let _ = (io, route, norm);
        false
    }
}

/// [`NormBackend::one_kernel_at_any_size`] of `engine`.
#[cfg(any(feature = "cuda", feature = "rocm", feature = "cpu"))]
fn engine_one_kernel_at_any_size<D: detcoll_protocol::IpcDevice>(
    engine: &ipc_engine::IpcCollective<D>,
    io: &Io<'_>,
    route: IpcRoute,
    norm: &NormParams,
) -> bool {
    let gathered = norm.rows >= GATHERED_MIN_ROWS as u64 && engine.fused_norm_reads_gathered(io, route, norm);
    gathered
        || engine.fused_norm_row_loop(io, route, norm)
        || engine.fused_norm_two_tile_rows(io, route, norm)
        || engine.fused_norm_shard_rows(io, route, norm)
}

/// The fused call's all_reduce on `engine` (see [`NormBackend::all_reduce_then_norm`]).
#[cfg(any(feature = "cuda", feature = "rocm", feature = "cpu"))]
#[allow(clippy::too_many_arguments)]
fn engine_then_norm<D: detcoll_protocol::IpcDevice>(
    engine: &ipc_engine::IpcCollective<D>,
    io: Io<'_>,
    route: IpcRoute,
    args: &NormArgs,
    fuse: bool,
    part: u32,
    stream: CallStream<'_, D::Stream>,
) -> Result<bool, Error> {
    let raw = match stream {
        CallStream::Safe(s) => engine.device().raw_stream(s)?,
        CallStream::Raw(r) => r,
    };
    // SAFETY: `raw` is this device's stream (checked by `raw_stream`) or vouched for by a raw
    // entry point's caller; the views were validated at the front door (`validate`,
    // `validate_norm`) and their validity is the contract of their constructors.
    unsafe { engine.enqueue_all_reduce_norm_as_part(io, Some(route), args, fuse, part, raw) }
}

/// A fused call's norm view built from a host slice, on device memory.
fn host_norm_view(argument: &'static str) -> Error {
    Error::HostMemory { op: Op::AllReduce, argument }
}

/// What a transport answers for the one-kernel form: it has no IPC route.
fn not_ipc() -> Error {
    Error::InvalidConfig { detail: "the fused all_reduce + RMSNorm's one-kernel form is an IPC route".into() }
}

/// The norm on `device`, on `stream` as the caller gave it.
#[cfg_attr(not(any(feature = "cpu", feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) fn launch<D: NormDevice>(
    device: &D,
    args: &NormArgs,
    stream: CallStream<'_, D::Stream>,
) -> Result<(), Error> {
    let raw = match stream {
        CallStream::Safe(s) => device.raw_stream(s)?,
        CallStream::Raw(r) => r,
    };
    device.bind()?;
    // SAFETY: `args` was validated against the call's views (front door) and packed
    // (`NormParams::pack`) before the all_reduce; the views outlive the stream's execution
    // (the caller's contract for every enqueue); `raw` is the call's stream, checked to belong
    // to this device or vouched for by a raw entry point's caller.
    unsafe { device.residual_rmsnorm(args, raw) }
}

fn args(c: &NormCall) -> NormArgs {
    NormArgs {
        sum: c.y,
        residual: c.residual,
        weight: c.weight,
        h: c.h,
        y: c.y,
        rows: c.rows,
        hidden: c.hidden,
        eps: c.eps,
        dtype: c.dtype,
    }
}

impl<I, T> Routed<I, T>
where
    I: RouteSelect + NormBackend,
    T: Collective<Stream = I::Stream> + NormBackend,
{
    /// `y = tree(x)`, `h = residual + y`, `y = rmsnorm(h) * weight` on row-major `[rows,
    /// hidden]` tensors (see [`RmsNorm`]): the all_reduce's [`Io`] carries `x` and `y`, `norm`
    /// the residual, `h`, the weight, `hidden` and `eps`. Collective like `all_reduce`; a
    /// refused call (a typed error) writes nothing.
    pub fn all_reduce_residual_rmsnorm(&self, x: Io<'_>, norm: RmsNorm<'_>, stream: &I::Stream) -> Result<(), Error> {
        self.fused_norm(x, norm, &OnStream(stream))
    }

    /// The call through `via` (a safe or a raw stream).
    pub(crate) fn fused_norm(&self, x: Io<'_>, norm: RmsNorm<'_>, via: &impl Via<I, T>) -> Result<(), Error> {
        // Counted first, refused or made (`Routed::begin_call`).
        let (_call, seq) = self.begin_call()?;
        self.settle(self.numbered_fused_norm(x, norm, seq, via))
    }

    /// The call numbered `seq`, under the call lock: refused before any work, or made.
    fn numbered_fused_norm(&self, x: Io<'_>, norm: RmsNorm<'_>, seq: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        if !self.host_memory() {
            // Host slices (`Io::host`) on device memory: refused before any work.
            x.refuse_host_views(Op::AllReduce)?;
            if let Some(view) = norm.residual.host_view() {
                return Err(host_norm_view(if view == "output" { "h" } else { "residual" }));
            }
            if norm.weight.is_host() {
                return Err(host_norm_view("weight"));
            }
        }
        validate(Op::AllReduce, &x, self.rank(), self.world_size(), usize::MAX)?;
        let call = validate_norm(&x, &norm)?;
        let args = args(&call);
        let packed = NormParams::pack(&args)?;
        // The one-kernel form where the table sends the all_reduce to an IPC route and it
        // pays (`one_kernel`).
        // On an IPC route the all_reduce is signed with the norm either way (peers that
        // disagree on it fail with SignatureMismatch), on the composite routes (hierarchical,
        // hybrid) each of its IPC parts; the transport signs the all_reduce alone.
        // The route is the table's for the fused call (`all_reduce_residual_rmsnorm` rules,
        // else the all_reduce's).
        let route = self.fused_norm_route(contributed_bytes(Op::AllReduce, &x, self.world_size()));
        match (IpcRoute::of(route), self.ipc()) {
            (Some(route), Some(ipc)) => {
                let fuse =
                    one_kernel(call.rows, ipc.epilogue_rows(), || ipc.one_kernel_at_any_size(&x, route, &packed));
                if ipc.all_reduce_then_norm(x, route, &args, fuse, Signature::call_split(seq, 0), via.stream())? {
                    return Ok(());
                }
            }
            _ => {
                let split = Signature::call_split(seq, Signature::norm_split(call.hidden, call.eps));
                self.dispatch_on(route, Op::AllReduce, x, split, via)?
            }
        }
        let stream = via.stream();
        match (self.ipc(), self.nodes(), self.transport()) {
            (Some(i), _, _) => i.residual_rmsnorm(&args, stream),
            (None, Some(n), _) => n.local().residual_rmsnorm(&args, stream),
            (None, None, Some(t)) => t.residual_rmsnorm(&args, stream),
            (None, None, None) => Err(Error::InvalidConfig { detail: "no backend".into() }),
        }
    }
}

impl<I, T> ResidualRmsNorm for Routed<I, T>
where
    I: RouteSelect + NormBackend,
    T: Collective<Stream = I::Stream> + NormBackend,
{
    fn all_reduce_residual_rmsnorm(&self, x: Io<'_>, norm: RmsNorm<'_>, stream: &I::Stream) -> Result<(), Error> {
        self.fused_norm(x, norm, &OnStream(stream))
    }
}

impl<S: ?Sized> NormBackend for NoTransport<S> {
    fn residual_rmsnorm(&self, _: &NormArgs, _: CallStream<'_, S>) -> Result<(), Error> {
        match self.0 {}
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl<D: detcoll_protocol::IpcDevice + NormDevice> NormBackend for ipc_engine::IpcCollective<D> {
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, D::Stream>) -> Result<(), Error> {
        launch(self.device(), args, stream)
    }
    fn all_reduce_then_norm(
        &self,
        io: Io<'_>,
        route: IpcRoute,
        args: &NormArgs,
        fuse: bool,
        part: u32,
        stream: CallStream<'_, D::Stream>,
    ) -> Result<bool, Error> {
        engine_then_norm(self, io, route, args, fuse, part, stream)
    }
    /// The blocks of one launch (the multiprocessors over the ranks sharing the GPU, unless
    /// configured).
    fn epilogue_rows(&self) -> usize {
        self.config().max_blocks.unwrap_or(usize::MAX)
    }
    fn one_kernel_at_any_size(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        engine_one_kernel_at_any_size(self, io, route, norm)
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl<D: NormDevice + Clone> NormBackend for crate::GpuTransport<D> {
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, D::Stream>) -> Result<(), Error> {
        launch(self.device(), args, stream)
    }
}

#[cfg(feature = "cpu")]
impl NormBackend for shm_ipc::ShmCollective {
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, ()>) -> Result<(), Error> {
        launch(self.engine().device(), args, stream)
    }
    fn all_reduce_then_norm(
        &self,
        io: Io<'_>,
        route: IpcRoute,
        args: &NormArgs,
        fuse: bool,
        part: u32,
        stream: CallStream<'_, ()>,
    ) -> Result<bool, Error> {
        engine_then_norm(self.engine(), io, route, args, fuse, part, stream)
    }
    /// No bound: the host executor runs a launch's rows on its threads whatever its block count
    /// (one, the twin's "multiprocessors"), so the twin takes the form of a rank with a GPU of
    /// its own — and CI runs the one-kernel form through the front door.
    fn epilogue_rows(&self) -> usize {
        usize::MAX
    }
    fn one_kernel_at_any_size(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        engine_one_kernel_at_any_size(self.engine(), io, route, norm)
    }
}

#[cfg(feature = "cpu")]
impl NormBackend for detcoll_host_transport::HostTransport {
    /// The host executor of the kernel (the ranks of a flat transport world have no IPC
    /// collective to borrow it from).
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, ()>) -> Result<(), Error> {
        launch(&shm_ipc::HostDevice::threads(), args, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kernel_up_to_the_rows_a_launch_has_blocks_for() {
        let never = || -> bool { panic!("not asked where the epilogue has a block for every row") };
        let no = || false;
        // A rank with a GPU of its own (132 blocks), and the twin (no bound): up to 64 rows.
        for blocks in [132, usize::MAX] {
            assert!(one_kernel(1, blocks, never));
            assert!(one_kernel(ONE_KERNEL_MAX_ROWS, blocks, never));
            assert!(!one_kernel(ONE_KERNEL_MAX_ROWS + 1, blocks, no));
            assert!(!one_kernel(GATHERED_MIN_ROWS - 1, blocks, no));
        }
        // Eight ranks sharing one H200 (16 blocks each): up to 16 rows.
        assert!(one_kernel(16, 16, never));
        assert!(!one_kernel(17, 16, no));
        assert!(!one_kernel(64, 33, no));
        // An empty batch: one launch either way.
        assert!(one_kernel(0, 1, never));
        // Beyond: where the launch's form pays at any size (the gathered sums from
        // GATHERED_MIN_ROWS, the row loop at any rows), whatever the blocks.
        for blocks in [1, 16, usize::MAX] {
            for rows in [17, ONE_KERNEL_MAX_ROWS + 1, GATHERED_MIN_ROWS, 8192] {
                assert!(one_kernel(rows, blocks, || true));
                assert_eq!(
                    one_kernel(rows, blocks, no),
                    rows <= blocks.min(ONE_KERNEL_MAX_ROWS) && rows < GATHERED_MIN_ROWS
                );
            }
        }
    }
}
