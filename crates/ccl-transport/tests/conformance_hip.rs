//! The shared conformance suite on the RCCL transport (`HipDevice`: the HIP twin's tree
//! kernel): one rank per GPU as threads of this process, both reduce_scatter exchanges. World 1
//! runs on any host with an AMD GPU, RCCL and the prebuilt code object (`cargo xtask build
//! --arch gfx942`); larger worlds need that many GPUs (RCCL refuses two ranks on one GPU) and
//! print a skip otherwise, as does every test without a HIP device or RCCL.
//!
//! Never executed on an AMD GPU (none was available): see docs/rocm.md.
mod common;

common::conformance!(common::hip::Hip);
