//! pagoda-tidy: tests of the workspace's structure, after rust-analyzer's "tidy" tests. It
//! reads source text and manifests only; no Pagoda crate depends on it and it depends on
//! none, so `cargo test -p pagoda-tidy` builds in seconds.
//!
//! - [`imports`]: each crate's module import graph and its circles (modules that import each
//!   other, directly or around a loop).
//! - [`codemap`]: ARCHITECTURE.md against the tree: every file or module path it names in
//!   backticks exists, every crate under `crates/` has its section (and every section its
//!   crate), and every Pagoda crate's dependencies on other Pagoda crates follow
//!   the stated direction ([`codemap::ALLOWED_DEPS`]).
//!
//! - [`admission`]: where the front ends refuse `max_tokens`, temperature, `n` and a
//!   prompt's length by name: one function per field (one admission).
//!
//! The checks over the real workspace are `tests/structure.rs`.

#![deny(clippy::unwrap_used)]

pub mod admission;
pub mod codemap;
pub mod imports;
mod lexer;
