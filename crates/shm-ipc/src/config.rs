//! Construction parameters of the CPU twin: the engine's own configuration, one builder shape for
//! every device (`CudaIpcConfig` and `HipIpcConfig` are the same type).
//!
//! On the host device: `capacity` is the staging per frame (at least
//! `detcoll_protocol::MIN_CAPACITY`, 128 bytes, where every call can be chunked); `timeouts`
//! `None` reads `DETCOLL_TIMEOUT_MS` when the collective is built; `routes` is the route policy
//! of the collective's own calls (the factory passes its agreed table); `ll_capacity` the LL push
//! payload per rank (the receive area takes `4 * world * ll_capacity` bytes per rank; 0: no LL
//! route); `max_blocks` `None` runs one block per call (blocks run in order on the host); the
//! lockstep does not apply (no ranks share a GPU). Every rank must pass the same values
//! (checked where they shape the staging).
pub use detcoll_protocol::IpcConfig as ShmConfig;
