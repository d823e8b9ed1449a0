//! Placeholder (filled in next).
fn main() {}
