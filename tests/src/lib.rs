//! Cross-crate, multi-process integration tests of detcoll (see `tests/`). No library code.
