//! The `pagoda` binary (being built).
fn main() {}
