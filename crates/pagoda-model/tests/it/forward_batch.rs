//! Batched forward passes over the paged KV cache: a batch of several sequences (decode rows
//! and prefill chunks at different positions, non-contiguous shuffled block tables, segments in
//! varying order) gives each sequence the logits it gets when run alone through
//! `Model::forward`, for the tiny Llama, Qwen2 and Gemma 3 models of tests/golden/ (Gemma 3's
//! sliding window of 4 is far shorter than the sequences, so windowed layers are covered).
//! Also copy-on-write of a shared block, and every input error. The batching and
//! copy-on-write checks run on the CPU and, where a GPU is usable, on CUDA too (elsewhere
//! those print `skipped: no GPU (...)`).

use pagoda_model::arch::{BatchSegment, Logits, Model};
use pagoda_model::{open_model, Device, KvDtype, ModelError, PagedKvCache};
use std::path::PathBuf;

/// Largest `max|batched - alone| / max(1, max|alone|)` over a logits row: the same f32 math, but
/// attention of a chunk runs the GEMM path where a lone decode row runs the per-row loop, and
/// matmuls tile rows differently, so summation orders differ.
const RELATIVE_TOLERANCE: f32 = 1e-4;

/// The same on CUDA: the same bf16 weights and K/V, but cuBLAS picks its kernel (and so its
/// summation order) by the number of rows, activations are rounded to bf16 before every
/// GEMM, and decode rows and prefill chunks run different attention kernels.
const CUDA_RELATIVE_TOLERANCE: f32 = 2e-2;

fn load(name: &str) -> Model {
    load_on(name, Device::Cpu)
}

fn load_on(name: &str, device: Device) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name);
    let source = open_model(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    Model::from_source_on(&source, device).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The K/V type a device's tests use: f32 on the CPU (exact), 16-bit (bf16) on CUDA.
fn test_dtype(model: &Model) -> KvDtype {
    match model.device() {
        Device::Cpu => KvDtype::F32,
        Device::Cuda(_) => KvDtype::F16,
    }
}

fn tolerance(model: &Model) -> f32 {
    match model.device() {
        Device::Cpu => RELATIVE_TOLERANCE,
        Device::Cuda(_) => CUDA_RELATIVE_TOLERANCE,
    }
}

/// Deterministic pseudo-random token ids below `vocab`.
fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Every position's logits of `tokens` run alone from an empty cache (`[n, vocab]`).
fn alone(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model
        .try_new_cache(tokens.len(), test_dtype(model))
        .expect("a cache");
    model
        .forward(tokens, 0, &mut cache, Logits::All)
        .expect("forward alone")
}

fn assert_rows_close(what: &str, got: &[f32], want: &[f32]) {
    assert_rows_within(what, got, want, RELATIVE_TOLERANCE)
}

fn assert_rows_within(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    assert_eq!(got.len(), want.len(), "{what}: row length");
    let scale = want.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff / scale <= tolerance,
        "{what}: max difference {diff} (scale {scale})"
    );
}

/// Blocks `0..n_blocks` in a fixed shuffled order, dealt out to sequences.
fn shuffled_blocks(n_blocks: u32) -> Vec<u32> {
    // 37 is coprime to every pool size used here: a permutation.
    (0..n_blocks).map(|i| (i * 37 + 11) % n_blocks).collect()
}

/// One sequence of the schedule: its tokens, how they are fed (chunk lengths), and which
/// logits each chunk asks for.
struct Plan {
    tokens: Vec<u32>,
    chunks: Vec<usize>,
    logits: fn(usize) -> Option<Logits>,
}

fn check_batched_matches_alone(name: &str) {
    check_batched_matches_alone_on(&load(name), name);
}

fn check_batched_matches_alone_on(model: &Model, name: &str) {
    let vocab = model.config().vocab_size;
    let plans = [
        // A long prefill in three chunks.
        Plan {
            tokens: tokens(1, 30, vocab),
            chunks: vec![13, 10, 7],
            logits: |_| Some(Logits::All),
        },
        // A prefill, then decode steps.
        Plan {
            tokens: tokens(2, 22, vocab),
            chunks: vec![17, 1, 1, 1, 1, 1],
            logits: |_| Some(Logits::Last),
        },
        // Chunks that ask for no logits, then some that do.
        Plan {
            tokens: tokens(3, 45, vocab),
            chunks: vec![5, 20, 3, 17],
            logits: |step| (step % 2 == 1).then_some(Logits::All),
        },
        // Decode from the very first token.
        Plan {
            tokens: tokens(4, 7, vocab),
            chunks: vec![1; 7],
            logits: |_| Some(Logits::All),
        },
    ];
    let block_size = 4;
    let n_blocks = 41u32;
    let mut pool = shuffled_blocks(n_blocks).into_iter();
    let tables: Vec<Vec<u32>> = plans
        .iter()
        .map(|p| {
            pool.by_ref()
                .take(p.tokens.len().div_ceil(block_size))
                .collect()
        })
        .collect();
    let want: Vec<Vec<f32>> = plans.iter().map(|p| alone(model, &p.tokens)).collect();

    let mut cache = model
        .try_new_paged_cache(n_blocks as usize, block_size, test_dtype(model))
        .expect("a cache");
    let mut fed = vec![0usize; plans.len()];
    let steps = plans.iter().map(|p| p.chunks.len()).max().unwrap_or(0);
    let mut rows_checked = 0;
    for step in 0..steps {
        // (sequence, start, n, logits) of this step, in an order that varies by step.
        let mut work: Vec<(usize, usize, usize, Option<Logits>)> = plans
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.chunks
                    .get(step)
                    .map(|&n| (i, fed[i], n, (p.logits)(step)))
            })
            .collect();
        if step % 2 == 1 {
            work.reverse();
        }
        if step % 3 == 2 {
            work.rotate_left(1);
        }
        let segments: Vec<BatchSegment<'_>> = work
            .iter()
            .map(|&(i, start, n, logits)| BatchSegment {
                tokens: &plans[i].tokens[start..start + n],
                start,
                block_table: &tables[i],
                logits,
                adapter: None,
                state_slot: None,
            })
            .collect();
        let out = model
            .forward_batch(&segments, &mut cache)
            .unwrap_or_else(|e| panic!("{name}: step {step}: {e}"));
        let mut rows = out.chunks_exact(vocab);
        for &(i, start, n, logits) in &work {
            let positions = match logits {
                None => 0..0,
                Some(Logits::Last) => start + n - 1..start + n,
                Some(Logits::All) => start..start + n,
            };
            for p in positions {
                let got = rows.next().expect("a logits row per requested position");
                assert_rows_within(
                    &format!(
                        "{name} on {}: step {step}, sequence {i}, position {p}",
                        model.device()
                    ),
                    got,
                    &want[i][p * vocab..(p + 1) * vocab],
                    tolerance(model),
                );
                rows_checked += 1;
            }
            fed[i] += n;
        }
        assert!(
            rows.next().is_none(),
            "{name}: step {step}: extra logits rows"
        );
    }
    assert_eq!(
        fed,
        plans.iter().map(|p| p.tokens.len()).collect::<Vec<_>>()
    );
    assert!(
        rows_checked > 60,
        "{name}: only {rows_checked} rows checked"
    );
}

#[test]
fn tiny_llama_batched_matches_alone() {
    check_batched_matches_alone("tiny-llama");
}

#[test]
fn tiny_qwen2_batched_matches_alone() {
    check_batched_matches_alone("tiny-qwen2");
}

#[test]
fn tiny_gemma3_batched_matches_alone() {
    check_batched_matches_alone("tiny-gemma3");
}

/// The first usable GPU, or `None` after printing why the CUDA variant is skipped.
fn gpu_or_skip() -> Option<Device> {
    match pagoda_cuda::list_gpus() {
        Ok(gpus) if !gpus.is_empty() => Some(Device::Cuda(gpus[0].ordinal)),
        Ok(_) => {
            pagoda_cuda::interpret::no_gpu_for_test("the driver reports none");
            None
        }
        Err(e) => {
            pagoda_cuda::interpret::no_gpu_for_test(e);
            None
        }
    }
}

#[test]
fn batched_matches_alone_on_cuda() {
    let Some(gpu) = gpu_or_skip() else { return };
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        check_batched_matches_alone_on(&load_on(name, gpu), name);
    }
}

#[test]
fn forked_sequence_after_copy_on_write_matches_alone() {
    check_fork_matches_alone(&load("tiny-gemma3"));
}

#[test]
fn forked_sequence_after_copy_on_write_matches_alone_on_cuda() {
    let Some(gpu) = gpu_or_skip() else { return };
    check_fork_matches_alone(&load_on("tiny-gemma3", gpu));
}

fn check_fork_matches_alone(model: &Model) {
    let vocab = model.config().vocab_size;
    let block_size = 4;
    let mut cache = model
        .try_new_paged_cache(8, block_size, test_dtype(model))
        .expect("a cache");
    // A shared prompt of 6 tokens fills block 5 and half of block 2.
    let prompt = tokens(7, 6, vocab);
    let parent_table = [5u32, 2];
    model
        .forward_batch(
            &[BatchSegment {
                tokens: &prompt,
                start: 0,
                block_table: &parent_table,
                logits: None,
                adapter: None,
                state_slot: None,
            }],
            &mut cache,
        )
        .expect("prompt");
    // The child shares block 5 and gets a copy of the half-full block 2 before writing to it.
    cache.copy_block(2, 7).expect("both blocks exist");
    let child_table = [5u32, 7];
    let (parent_next, child_next) = ([11u32, 12], [13u32, 14]);
    let out = model
        .forward_batch(
            &[
                BatchSegment {
                    tokens: &child_next,
                    start: 6,
                    block_table: &child_table,
                    logits: Some(Logits::All),
                    adapter: None,
                    state_slot: None,
                },
                BatchSegment {
                    tokens: &parent_next,
                    start: 6,
                    block_table: &parent_table,
                    logits: Some(Logits::All),
                    adapter: None,
                    state_slot: None,
                },
            ],
            &mut cache,
        )
        .expect("fork step");
    for (k, next) in [child_next, parent_next].iter().enumerate() {
        let mut seq = prompt.clone();
        seq.extend_from_slice(next);
        let want = alone(model, &seq);
        for j in 0..2 {
            let row = k * 2 + j;
            assert_rows_within(
                &format!("fork {k} position {}", 6 + j),
                &out[row * vocab..(row + 1) * vocab],
                &want[(6 + j) * vocab..(7 + j) * vocab],
                tolerance(model),
            );
        }
    }
}

#[test]
fn paged_cache_sizes() {
    let model = load("tiny-llama");
    let cfg = model.config();
    for dtype in [KvDtype::F16, KvDtype::F32, KvDtype::Fp8E4m3] {
        let cache = model.new_paged_cache(10, 16, dtype);
        assert_eq!(cache.n_blocks(), 10);
        assert_eq!(cache.block_size(), 16);
        assert_eq!(cache.dtype(), dtype);
        let per_block = PagedKvCache::bytes_per_block(cfg, 16, dtype);
        assert_eq!(
            per_block,
            2 * cfg.n_layers * 16 * cfg.n_kv_heads * cfg.head_dim * dtype.bytes()
        );
        assert_eq!(cache.memory_bytes(), 10 * per_block);
    }
    let f16 = model.new_cache(100);
    let f32 = model.new_cache_with(100, KvDtype::F32);
    assert_eq!(f16.dtype(), KvDtype::F16, "llama.cpp's default");
    assert_eq!(f16.capacity(), 100);
    assert_eq!(2 * f16.memory_bytes(), f32.memory_bytes());
    let fp8 = model.new_cache_with(100, KvDtype::Fp8E4m3);
    assert_eq!(
        2 * fp8.memory_bytes(),
        f16.memory_bytes(),
        "FP8 halves f16's bytes"
    );
    assert_eq!(
        2 * PagedKvCache::bytes_per_block(cfg, 16, KvDtype::Fp8E4m3),
        PagedKvCache::bytes_per_block(cfg, 16, KvDtype::F16)
    );
}

/// A segment asking for its last row's logits.
fn seg<'a>(tokens: &'a [u32], start: usize, block_table: &'a [u32]) -> BatchSegment<'a> {
    BatchSegment {
        tokens,
        start,
        block_table,
        logits: Some(Logits::Last),
        adapter: None,
        state_slot: None,
    }
}

#[test]
fn bad_batches_are_errors_and_write_nothing() {
    let model = load("tiny-llama");
    let vocab = model.config().vocab_size;
    let context = model.config().context_length;
    let mut cache = model.new_paged_cache(4, 4, KvDtype::F32);
    let good = [1u32, 2, 3];
    let table = [3u32, 1];
    let mut run = |segments: &[BatchSegment<'_>]| model.forward_batch(segments, &mut cache);

    let e = run(&[]).expect_err("no segments");
    assert!(matches!(e, ModelError::InvalidBatch(_)), "{e}");
    let e = run(&[seg(&good, 0, &table), seg(&[], 0, &table)]).expect_err("empty segment");
    assert!(matches!(e, ModelError::InvalidBatch(_)), "{e}");
    let bad_token = [1u32, vocab as u32];
    let e = run(&[seg(&bad_token, 0, &table)]).expect_err("token outside vocab");
    assert!(
        matches!(e, ModelError::InvalidToken { token, vocab_size } if token == vocab as u32 && vocab_size == vocab),
        "{e}"
    );
    let e = run(&[seg(&good, 6, &table)]).expect_err("table too short");
    assert!(
        matches!(
            e,
            ModelError::BlockTableTooShort {
                needed: 9,
                covered: 8
            }
        ),
        "{e}"
    );
    let e = run(&[seg(&good, 0, &[])]).expect_err("no blocks");
    assert!(matches!(e, ModelError::BlockTableTooShort { .. }), "{e}");
    let e = run(&[seg(&good, 0, &[4])]).expect_err("block outside the cache");
    assert!(matches!(e, ModelError::InvalidBatch(_)), "{e}");
    let long_table: Vec<u32> = vec![0; context];
    let e = run(&[seg(&good, context - 2, &long_table)]).expect_err("past the context");
    assert!(matches!(e, ModelError::ContextFull { .. }), "{e}");
    let mut other = load("tiny-gemma3").new_paged_cache(4, 4, KvDtype::F32);
    let e = model
        .forward_batch(&[seg(&good, 0, &table)], &mut other)
        .expect_err("cache of another model");
    assert!(matches!(e, ModelError::InvalidBatch(_)), "{e}");

    // None of that wrote anything: the cache still gives a fresh cache's logits.
    let got = model
        .forward_batch(&[seg(&good, 0, &table)], &mut cache)
        .expect("good batch");
    let want = alone(&model, &good);
    assert_rows_close("after errors", &got, &want[2 * vocab..]);

    // A batch that asks for no logits returns none.
    let none = model
        .forward_batch(
            &[BatchSegment {
                logits: None,
                ..seg(&good, 0, &table)
            }],
            &mut cache,
        )
        .expect("no logits");
    assert!(none.is_empty());
}

#[test]
fn single_sequence_forward_errors_leave_the_cache_unchanged() {
    let model = load("tiny-qwen2");
    let vocab = model.config().vocab_size as u32;
    let mut cache = model.new_cache_with(8, KvDtype::F32);
    model
        .forward(&[1, 2, 3], 0, &mut cache, Logits::Last)
        .expect("prefill");
    assert_eq!(cache.len(), 3);
    for (tokens, start) in [
        (vec![], 3),
        (vec![vocab], 3),
        (vec![4], 2),
        (vec![1, 2, 3, 4, 5, 6], 3),
    ] {
        assert!(
            model
                .forward(&tokens, start, &mut cache, Logits::Last)
                .is_err(),
            "{tokens:?} at {start}"
        );
        assert_eq!(cache.len(), 3, "{tokens:?} at {start}");
    }
    cache.truncate(1);
    assert_eq!(cache.len(), 1);
    let got = model
        .forward(&[2, 3], 1, &mut cache, Logits::Last)
        .expect("after truncate");
    let want = alone(&model, &[1, 2, 3]);
    assert_rows_close("after truncate", &got, &want[2 * vocab as usize..]);
}
