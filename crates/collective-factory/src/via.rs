//! How one call reaches the backends of a composed collective ([`crate::Routed`], and the
//! hierarchical route's [`crate::nodes::Nodes`]): the safe stream type or a raw stream.
use crate::scratch::CallStream;
use collective_core::{Collective, Error, Io, IpcRoute, Op};

/// How one call reaches the backends of a [`crate::Routed`]: through their safe stream type
/// (its `Collective` impl) or a raw stream (the NVIDIA raw entry points).
pub(crate) trait Via<I: Collective, T> {
    /// `op` on the IPC backend, by `route` (an IPC route or `Local`), its signature's `split`
    /// being `part`: `Signature::part_split` of a composite route's whole call, a fused call's
    /// `Signature::norm_split`, or 0 for a plain call of its own.
    fn ipc(&self, ipc: &I, op: Op, io: Io<'_>, route: IpcRoute, part: u32) -> Result<(), Error>;
    /// `op` on the transport, signed with `part` where the transport signs calls (as in
    /// [`Via::ipc`]; `Collective::call_as_part`).
    fn transport(&self, transport: &T, op: Op, io: Io<'_>, part: u32) -> Result<(), Error>;
    /// `reduce_scatter_many` on the IPC backend, by `route`, signed as a part of the call
    /// `part` names (as in [`Via::ipc`]).
    fn ipc_many(&self, ipc: &I, lanes: &[Io<'_>], route: IpcRoute, part: u32) -> Result<(), Error>;
    /// The call's stream (what the hierarchical route's scratch row orders its reuse by).
    fn stream(&self) -> CallStream<'_, I::Stream>;
}
