//! pagoda-kernels: the numeric core of Pagoda.
//!
//! Owns tensor element types ([`GgmlType`]), the GGUF block formats and their dequantization
//! ([`quant`]), the quantized matrix products that work directly on those blocks
//! ([`matmul()`], with SIMD paths picked at run time: [`cpu`], `simd`), and the row operations
//! of a transformer layer ([`ops`]). Knows nothing of models, files or scheduling.
//!
//! Codemap:
//! - `dtype`: [`GgmlType`] (GGUF types and the Pagoda-internal INT8 / INT4 / NF4 types) and
//!   row geometry ([`GgmlType::row_bytes`]); `error`: [`KernelError`].
//! - `quant/`: one file per GGUF block format (`#[repr(C)]` layout, dequantize, reference
//!   quantize, scalar dot against the activation partner: Q8_0, Q8_1 or Q8_K); `float.rs` for
//!   F32/F16/BF16; `int8.rs`, `int4.rs`, `nf4.rs` for the internal types (row functions).
//!   The scalar code is the reference every SIMD path is tested against.
//! - `cpu`: [`Isa`] detection ([`best_isa`], [`available_isas`]).
//! - `simd/`: the row-kernel table (`mod.rs`), AVX2 bodies (`avx2.rs`, generic over the int8
//!   dot primitive) and AVX-512 kernels (`avx512.rs`: VNNI, 512-bit; `avx512_fmt.rs`: the
//!   internal types); `attn.rs`: the AVX2 and
//!   AVX-512 bodies of the paged-attention decode primitives.
//! - `matmul`: [`WeightMatrix`] and the driver ([`matmul()`], [`matmul_with_isa`]): shape
//!   checks, activation quantization once per call, row chunks on rayon, 8-token tiles.
//! - `packed`: the 16-row strip format of packable weights, made at load
//!   ([`WeightMatrix::pack`], [`WeightLayout::Strips16`]): bytes and formats only; their
//!   products are in `matmul`, the AVX-512 VNNI strip kernel in `simd/avx512_packed.rs`.
//! - `f32_gemm`: [`f32_gemm::matmul_nt`], dense f32 products of small factors (LoRA).
//! - `ops`, `attention`: row operations and attention of a transformer layer;
//!   `attention_shape`: the [`attention::AttentionShape`] and sliding-window rule every
//!   attention kernel shares.
//! - `kv_blocks`, `paged_attention`: paged K/V storage ([`kv_blocks::KvBlockStorage`], F16,
//!   F32 or FP8 E4M3 with a static scale: `fp8`, the E4M3 codec) and attention of a batch of sequences through their block tables;
//!   `paged_attention/decode.rs`: the decode tile primitives, their scalar bodies and the
//!   driver generic over them, which `simd/attn.rs` implements.
//! - `recurrent/`: the recurrent layers of hybrid models on one sequence's f32 state: causal
//!   short convolution (`conv1d`), the gated delta rule of Qwen3.5 (`gated_delta`), the
//!   Mamba-2 scan (`ssd`); step (decode) and chunked prefill forms of each.
//!
//! Architecture Invariant: no function here allocates per call on the hot path except the
//! activation quantization scratch inside `matmul` (with, for strips of Q4_0 / Q5_0 / Q8_0
//! / INT8, the activations' block sums); weights are only ever borrowed, never dequantized
//! to a matrix (a strip matrix off AVX-512 VNNI, never made by models, is unpacked per
//! call), and may be unaligned.
//!
//! Architecture Invariant: every kernel result is within a named tolerance of the scalar path
//! on the same inputs (tests/kernels.rs runs one body over every available ISA).

#![deny(clippy::unwrap_used)]
// Block kernels index several arrays with one counter; iterator chains would hide the layout.
#![allow(clippy::needless_range_loop)]
// `usize::is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod attention;
mod attention_shape;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod f32_gemm;
pub mod fp8;
pub mod hot_pool;
pub mod kv_blocks;
pub mod matmul;
pub mod matmul_group;
pub mod ops;
pub mod packed;
pub mod paged_attention;
pub mod quant;
pub mod recurrent;
mod simd;

pub use cpu::{available_isas, best_isa, Isa};
pub use dtype::{GgmlType, NF4_DQ_GROUP, QK_K};
pub use error::KernelError;
pub use matmul::{matmul, matmul_with_isa, WeightMatrix};
pub use matmul_group::{matmul_group, matmul_group_with_isa};
pub use packed::WeightLayout;

/// Up to this many rows (tokens) per call, [`matmul`] and
/// [`paged_attention`](paged_attention::paged_attention) compute every row with the per-row
/// kernels, so each row's result is bit-identical to computing it alone: a decode step that
/// verifies up to `BATCH_INVARIANT_ROWS - 1` speculative proposals gives the logits one-row
/// decode steps would, and greedy speculative decoding reproduces plain greedy decoding. Larger
/// calls (prefill chunks, big batches) take the faster blocked paths, whose rounding differs.
pub const BATCH_INVARIANT_ROWS: usize = 18;
pub use quant::{dequantize_row, quantize_row};
