//! Construction-time configuration, equal on every rank (checked): the backend-neutral
//! [`detcoll_protocol::IpcConfig`], shared with `hip-ipc`.
pub use detcoll_protocol::{DEFAULT_RSAG_THRESHOLD, IpcConfig as CudaIpcConfig};
