//! Construction-time configuration, equal on every rank (checked): the backend-neutral
//! [`collective_core::protocol::IpcConfig`], shared with `hip-ipc`.
pub use collective_core::protocol::{DEFAULT_RSAG_THRESHOLD, IpcConfig as CudaIpcConfig};
