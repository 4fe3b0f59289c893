//! Every GPU kernel and the GEMM against pagoda-kernels' CPU reference, on random inputs.
//!
//! Without a usable GPU each test prints `skipped: no GPU (<reason>)` to stderr and passes
//! (under CI, where they run in the CUDA interpreter, a skip fails)
//! (see it with `--nocapture`): the machines that build Pagoda mostly have none, and a GPU
//! run is a separate, deliberate step.

use cudarc::driver::{CudaSlice, DeviceRepr};
use half::bf16;
use pagoda_cuda::{
    list_gpus, AttentionBatch, AttentionParams, AttentionWorkspace, Fp8Scales, GatedActivation,
    GpuContext, KernelCache, RopeStyle, SeqSpan,
};
use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::fp8::E4m3;
use pagoda_kernels::kv_blocks::{KvBlockStorage, KvDtype};
use pagoda_kernels::ops;
use pagoda_kernels::paged_attention::{paged_attention_with_sinks, SeqAttention};

/// Relative tolerance of RMSNorm (the sum of squares is reduced in another order).
const NORM_TOLERANCE: f32 = 1e-5;
/// Largest |gpu - cpu| for RoPE: the GPU's sincosf and the CPU's sin_cos may differ in the
/// last bit, and the angles reach thousands of radians.
const ROPE_TOLERANCE: f32 = 1e-4;
/// Largest |gpu - cpu| for activations (expf / tanhf against Rust's, FMA contraction).
const ACTIVATION_TOLERANCE: f32 = 1e-5;
/// Largest |gpu - cpu| of an attention output (values in [-1, 1]; other summation orders,
/// online softmax, split merging).
const ATTENTION_TOLERANCE: f32 = 2e-4;
/// Largest |gpu - cpu| relative to sqrt(k) for the bf16 GEMM with f32 accumulation (inputs
/// in [-1, 1]).
const GEMM_TOLERANCE: f32 = 1e-4;

/// The GPU to test on, or `None` after printing why there is none.
fn gpu() -> Option<GpuContext> {
    if let Err(e) = list_gpus() {
        pagoda_cuda::interpret::no_gpu_for_test(e);
        return None;
    }
    let cache = KernelCache::new(KernelCache::default_dir());
    Some(GpuContext::new(0, &cache).expect("a GPU context on cuda:0"))
}

/// Deterministic values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.next() + 1.0) * 0.5 * n as f32) as usize % n
    }
}

fn bf16s(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn rounded(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

fn up<T: DeviceRepr>(g: &GpuContext, v: &[T]) -> CudaSlice<T> {
    g.stream().clone_htod(v).expect("upload")
}

fn down<T: DeviceRepr + Default + Clone>(g: &GpuContext, s: &CudaSlice<T>) -> Vec<T> {
    let v = g.stream().clone_dtoh(s).expect("download");
    g.synchronize().expect("synchronize");
    v
}

fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tol: f32) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let (i, err) = gpu
        .iter()
        .zip(cpu)
        .map(|(a, b)| {
            if a.is_nan() || b.is_nan() {
                f32::INFINITY
            } else {
                (a - b).abs()
            }
        })
        .enumerate()
        .fold((0, 0.0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
    assert!(
        err <= tol,
        "{what}: |gpu - cpu| = {err} at {i} ({} vs {}), tolerance {tol}",
        gpu[i],
        cpu[i]
    );
}

#[test]
fn embed_looks_up_and_scales_rows() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(1);
    let (vocab, d) = (50, 96);
    let table = bf16s(&r.vec(vocab * d));
    let tokens: Vec<u32> = vec![3, 0, 49, 3, 17, 8, 21];
    let mut out = up(&g, &vec![0.0f32; tokens.len() * d]);
    g.kernels()
        .embed(
            &up(&g, &table),
            &up(&g, &tokens),
            &mut out,
            tokens.len(),
            d,
            0.5,
        )
        .expect("embed");
    let want: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            table[t as usize * d..][..d]
                .iter()
                .map(|v| v.to_f32() * 0.5)
        })
        .collect();
    assert_eq!(down(&g, &out), want);
}

#[test]
fn rms_norm_matches_the_cpu_out_of_place_and_in_place() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(2);
    for (rows, dim, offset) in [(5, 896, 0.0f32), (3 * 14, 64, 1.0), (2, 5000, 0.0)] {
        let x = r.vec(rows * dim);
        let w = r.vec(dim);
        let mut want = vec![0.0; x.len()];
        ops::rms_norm(&x, &w, 1e-6, offset, &mut want);
        let (xd, wd) = (up(&g, &x), up(&g, &w));
        let mut out = up(&g, &vec![0.0f32; x.len()]);
        g.kernels()
            .rms_norm(&xd, &wd, &mut out, rows, dim, 1e-6, offset)
            .expect("rms_norm");
        let scale: f32 = want.iter().fold(1.0, |m, v| m.max(v.abs()));
        assert_close("rms_norm", &down(&g, &out), &want, NORM_TOLERANCE * scale);
        let mut xi = up(&g, &x);
        g.kernels()
            .rms_norm_inplace(&mut xi, &wd, rows, dim, 1e-6, offset)
            .expect("rms_norm_inplace");
        let mut want_i = x.clone();
        ops::rms_norm_inplace(&mut want_i, &w, 1e-6, offset);
        assert_close(
            "rms_norm_inplace",
            &down(&g, &xi),
            &want_i,
            NORM_TOLERANCE * scale,
        );
    }
}

#[test]
fn elementwise_kernels_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(3);
    let n = 100_003;
    let (a, b) = (r.vec(n), r.vec(n));
    let k = g.kernels();

    let mut x = up(&g, &a);
    k.add(&mut x, &up(&g, &b), n).expect("add");
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_close("add", &down(&g, &x), &want, 0.0);

    let (rows, cols) = (7, 333);
    let bias = r.vec(cols);
    let mut x = up(&g, &a[..rows * cols]);
    k.add_bias(&mut x, &up(&g, &bias), rows, cols)
        .expect("add_bias");
    let want: Vec<f32> = a[..rows * cols]
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % cols])
        .collect();
    assert_close("add_bias", &down(&g, &x), &want, 0.0);

    let scaled: Vec<f32> = a.iter().map(|v| v * 8.0).collect();
    for act in [
        GatedActivation::Silu,
        GatedActivation::GeluTanh,
        GatedActivation::SwigluOai,
    ] {
        let mut gate = up(&g, &scaled);
        k.gated(act, &mut gate, &up(&g, &b), n).expect("gated");
        let mut want = scaled.clone();
        match act {
            GatedActivation::Silu => ops::silu_mul(&mut want, &b),
            GatedActivation::GeluTanh => ops::gelu_tanh_mul(&mut want, &b),
            GatedActivation::SwigluOai => ops::swiglu_oai_mul(&mut want, &b),
        }
        assert_close(
            &format!("{act:?}"),
            &down(&g, &gate),
            &want,
            ACTIVATION_TOLERANCE * 8.0,
        );
    }

    let mut x = up(&g, &scaled);
    k.softcap(&mut x, n, 3.0).expect("softcap");
    let mut want = scaled.clone();
    ops::softcap_inplace(&mut want, 3.0);
    assert_close("softcap", &down(&g, &x), &want, ACTIVATION_TOLERANCE);

    let mut special = scaled.clone();
    special[..6].copy_from_slice(&[
        f32::NAN,
        f32::INFINITY,
        -0.0,
        3.4e38,
        1.0e-40,
        -(1.0 + 1.0 / 256.0),
    ]);
    let mut out = up(&g, &vec![bf16::ZERO; n]);
    k.to_bf16(&up(&g, &special), &mut out, n).expect("to_bf16");
    let got: Vec<u16> = down(&g, &out).iter().map(|v| v.to_bits()).collect();
    let want: Vec<u16> = bf16s(&special).iter().map(|v| v.to_bits()).collect();
    assert_eq!(got, want, "to_bf16 rounds to nearest even as half does");

    let (total, d) = (40, 96);
    let idx: Vec<i32> = vec![39, 0, 7, 7, 12];
    let mut out = up(&g, &vec![0.0f32; idx.len() * d]);
    k.gather_rows(
        &up(&g, &a[..total * d]),
        &up(&g, &idx),
        &mut out,
        idx.len(),
        d,
    )
    .expect("gather_rows");
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&i| a[i as usize * d..][..d].to_vec())
        .collect();
    assert_close("gather_rows", &down(&g, &out), &want, 0.0);

    // Sub-views in and out: the second half of a buffer.
    let mut x = up(&g, &a[..2 * cols]);
    let y = up(&g, &b[..2 * cols]);
    k.add(&mut x.slice_mut(cols..), &y.slice(cols..), cols)
        .expect("add on views");
    let got = down(&g, &x);
    assert_close(
        "add on views (untouched half)",
        &got[..cols],
        &a[..cols],
        0.0,
    );
    let want: Vec<f32> = (cols..2 * cols).map(|i| a[i] + b[i]).collect();
    assert_close("add on views", &got[cols..], &want, 0.0);

    // A buffer too short is an error naming the kernel, before any launch.
    let e = k
        .add(&mut up(&g, &a[..10]), &up(&g, &b[..10]), 11)
        .expect_err("too short");
    assert!(
        e.to_string().contains("add_f32") && e.to_string().contains("11"),
        "{e}"
    );
}

#[test]
fn rope_matches_the_cpu_for_both_styles_and_a_partial_rotation() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(4);
    let (heads, head_dim) = (3, 64);
    for (style, cpu_style, half) in [
        (RopeStyle::Neox, ops::RopeStyle::Neox, 32),
        (RopeStyle::Normal, ops::RopeStyle::Interleaved, 32),
        (RopeStyle::Neox, ops::RopeStyle::Neox, 16),
    ] {
        let positions: Vec<i32> = vec![0, 1, 17, 4095, 32000, 7];
        let rows = positions.len();
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / 10000f64.powf(2.0 * i as f64 / (2 * half) as f64) as f32)
            .collect();
        let mscale = 1.25f32;
        let x = r.vec(rows * heads * head_dim);
        let mut xd = up(&g, &x);
        g.kernels()
            .rope(
                &mut xd,
                &up(&g, &positions),
                &up(&g, &inv_freq),
                rows,
                heads,
                head_dim,
                half,
                style,
                mscale,
                None,
            )
            .expect("rope");
        let mut want = x.clone();
        for (row, &pos) in want.chunks_exact_mut(heads * head_dim).zip(&positions) {
            let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
                .iter()
                .map(|f| {
                    let (s, c) = (pos as f32 * f).sin_cos();
                    (c * mscale, s * mscale)
                })
                .unzip();
            ops::rope(row, head_dim, &cos, &sin, cpu_style);
        }
        assert_close(
            &format!("rope {style:?} half {half}"),
            &down(&g, &xd),
            &want,
            ROPE_TOLERANCE,
        );
    }
}

#[test]
fn kv_write_stores_bf16_rows_at_their_slots_and_skips_negative_ones() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(5);
    let (rows, kv_dim, n_slots) = (5, 256, 40);
    let (k, v) = (r.vec(rows * kv_dim), r.vec(rows * kv_dim));
    let slots: Vec<i32> = vec![3, -1, 39, 0, 17];
    let mut kc = up(&g, &vec![bf16::ZERO; n_slots * kv_dim]);
    let mut vc = up(&g, &vec![bf16::ZERO; n_slots * kv_dim]);
    g.kernels()
        .kv_write(
            &up(&g, &k),
            &up(&g, &v),
            &mut kc,
            &mut vc,
            &up(&g, &slots),
            rows,
            kv_dim,
        )
        .expect("kv_write");
    for (cache, src) in [(down(&g, &kc), &k), (down(&g, &vc), &v)] {
        let mut want = vec![bf16::ZERO; n_slots * kv_dim];
        for (row, &s) in slots.iter().enumerate() {
            if s >= 0 {
                want[s as usize * kv_dim..][..kv_dim]
                    .copy_from_slice(&bf16s(&src[row * kv_dim..][..kv_dim]));
            }
        }
        assert_eq!(cache, want);
    }
}

/// One sequence of an attention test: rows, start.
struct Seq {
    rows: usize,
    start: usize,
}

fn attention_case(g: &GpuContext, shape: AttentionShape, seqs: &[Seq], seed: u64) {
    attention_case_as(g, shape, seqs, seed, None, None)
}

/// As [`attention_case`], over FP8 caches under `fp8`'s scales when given (the CPU reference
/// reads FP8 storage made with the same scales, so both see the same codes).
fn attention_case_as(
    g: &GpuContext,
    shape: AttentionShape,
    seqs: &[Seq],
    seed: u64,
    fp8: Option<Fp8Scales>,
    sinks: Option<&[f32]>,
) {
    let mut r = Rng(seed);
    let bs = 16;
    let (hd, nh, nkv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
    let kv_dim = nkv * hd;
    // Block tables: every block of the pool used once, in a shuffled order.
    let need: Vec<usize> = seqs
        .iter()
        .map(|s| (s.start + s.rows).div_ceil(bs))
        .collect();
    let n_blocks: usize = need.iter().sum::<usize>() + 3;
    let mut pool: Vec<u32> = (0..n_blocks as u32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, r.below(i + 1));
    }
    let mut tables = Vec::new();
    let mut at = 0;
    for &n in &need {
        tables.push(pool[at..at + n].to_vec());
        at += n;
    }
    // K/V of every position 0..start + rows, bf16-rounded, in both caches.
    let (mut keys, mut values) = match fp8 {
        Some(sc) => (
            KvBlockStorage::new_fp8(n_blocks, bs, kv_dim, sc.k),
            KvBlockStorage::new_fp8(n_blocks, bs, kv_dim, sc.v),
        ),
        None => (
            KvBlockStorage::new(KvDtype::F32, n_blocks, bs, kv_dim),
            KvBlockStorage::new(KvDtype::F32, n_blocks, bs, kv_dim),
        ),
    };
    let mut kc = vec![bf16::ZERO; n_blocks * bs * kv_dim];
    let mut vc = vec![bf16::ZERO; n_blocks * bs * kv_dim];
    let mut kc8 = vec![0u8; n_blocks * bs * kv_dim];
    let mut vc8 = vec![0u8; n_blocks * bs * kv_dim];
    let codes = |x: &[f32], scale: f32| -> Vec<u8> {
        x.iter().map(|&x| E4m3::from_f32(x / scale).0).collect()
    };
    for (s, table) in seqs.iter().zip(&tables) {
        let len = s.start + s.rows;
        let (k, v) = (rounded(&r.vec(len * kv_dim)), rounded(&r.vec(len * kv_dim)));
        keys.write(table, 0, &k);
        values.write(table, 0, &v);
        for p in 0..len {
            let slot = table[p / bs] as usize * bs + p % bs;
            let (kr, vr) = (&k[p * kv_dim..][..kv_dim], &v[p * kv_dim..][..kv_dim]);
            kc[slot * kv_dim..][..kv_dim].copy_from_slice(&bf16s(kr));
            vc[slot * kv_dim..][..kv_dim].copy_from_slice(&bf16s(vr));
            if let Some(sc) = fp8 {
                kc8[slot * kv_dim..][..kv_dim].copy_from_slice(&codes(kr, sc.k));
                vc8[slot * kv_dim..][..kv_dim].copy_from_slice(&codes(vr, sc.v));
            }
        }
    }
    let total: usize = seqs.iter().map(|s| s.rows).sum();
    let q = r.vec(total * nh * hd);
    let mut first = 0;
    let mut cpu_seqs = Vec::new();
    let mut spans = Vec::new();
    for (s, table) in seqs.iter().zip(&tables) {
        cpu_seqs.push(SeqAttention {
            rows: first..first + s.rows,
            start: s.start,
            block_table: table,
        });
        spans.push(SeqSpan {
            first_row: first,
            rows: s.rows,
            start: s.start,
            block_table: table,
        });
        first += s.rows;
    }
    let mut want = vec![0.0f32; q.len()];
    paged_attention_with_sinks(&shape, sinks, &q, &keys, &values, &cpu_seqs, &mut want);
    let gpu_sinks = sinks.map(|s| up(g, s));

    let batch = AttentionBatch::upload(g, &spans, bs).expect("upload");
    let positions = down(g, batch.positions());
    let want_positions: Vec<i32> = seqs
        .iter()
        .flat_map(|s| (s.start..s.start + s.rows).map(|p| p as i32))
        .collect();
    assert_eq!(positions[..total], want_positions[..]);
    let mut out = up(g, &vec![0.0f32; q.len()]);
    let mut ws = AttentionWorkspace::new();
    let params = AttentionParams {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        scale: shape.scale,
        softcap: shape.softcap,
        window: shape.window,
    };
    match fp8 {
        None => g.kernels().paged_attention(
            &batch,
            &up(g, &q),
            &up(g, &kc),
            &up(g, &vc),
            &mut out,
            params,
            gpu_sinks.as_ref(),
            &mut ws,
        ),
        Some(sc) => g.kernels().paged_attention_fp8(
            &batch,
            &up(g, &q),
            &up(g, &kc8),
            &up(g, &vc8),
            &mut out,
            params,
            sc,
            gpu_sinks.as_ref(),
            &mut ws,
        ),
    }
    .expect("paged_attention");
    assert_close(
        &format!("paged attention {shape:?} fp8 {fp8:?}"),
        &down(g, &out),
        &want,
        ATTENTION_TOLERANCE,
    );
}

#[test]
fn paged_attention_matches_the_cpu_for_decode_and_prefill_rows() {
    let Some(g) = gpu() else { return };
    // Decode rows (short, and long enough to split), prefill chunks with start > 0 across
    // block boundaries, an empty sequence, a single-row sequence at position 0.
    let seqs = [
        Seq {
            rows: 1,
            start: 700,
        },
        Seq {
            rows: 37,
            start: 50,
        },
        Seq { rows: 1, start: 0 },
        Seq { rows: 0, start: 5 },
        Seq { rows: 5, start: 0 },
        Seq {
            rows: 1,
            start: 2100,
        },
        Seq {
            rows: 16,
            start: 16,
        },
    ];
    let mut seed = 10;
    // 16 (the tiny test models), 80 (not a multiple of 32: Phi-2's), and the common sizes.
    for head_dim in [16, 64, 80, 128, 256] {
        for (n_heads, n_kv_heads) in [(8, 2), (4, 4)] {
            for window in [None, Some(20), Some(600)] {
                for softcap in [None, Some(5.0)] {
                    let shape = AttentionShape {
                        n_heads,
                        n_kv_heads,
                        head_dim,
                        scale: 1.0 / (head_dim as f32).sqrt() * 2.0,
                        softcap,
                        window,
                    };
                    seed += 1;
                    attention_case(&g, shape, &seqs, seed);
                }
            }
        }
    }
}

/// The FP8 kernels (decode, split decode, prefill) against the CPU over the same codes.
#[test]
fn fp8_paged_attention_matches_the_cpu_for_decode_and_prefill_rows() {
    let Some(g) = gpu() else { return };
    let seqs = [
        Seq {
            rows: 1,
            start: 700,
        },
        Seq {
            rows: 37,
            start: 50,
        },
        Seq { rows: 1, start: 0 },
        Seq {
            rows: 1,
            start: 2100,
        },
        Seq {
            rows: 16,
            start: 16,
        },
    ];
    let mut seed = 200;
    for scales in [
        Fp8Scales { k: 1.0, v: 1.0 },
        Fp8Scales {
            k: 1.0 / 64.0,
            v: 1.0 / 128.0,
        },
    ] {
        for head_dim in [16, 64, 128, 256] {
            for (n_heads, n_kv_heads, window, softcap) in
                [(8, 2, None, None), (4, 4, Some(20), Some(5.0))]
            {
                let shape = AttentionShape {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt() * 2.0,
                    softcap,
                    window,
                };
                seed += 1;
                attention_case_as(&g, shape, &seqs, seed, Some(scales), None);
            }
        }
    }
}

/// `kv_write_fp8` stores exactly `E4m3::from_f32(x / scale)`: rounding ties, subnormals,
/// saturation, infinities and NaN, for two scales.
#[test]
fn kv_write_fp8_stores_the_cpu_codes_at_their_slots() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(8);
    let kv_dim = 64;
    let specials = [
        0.0f32,
        -0.0,
        448.0,
        -449.0,
        464.0,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        2f32.powi(-10),
        3.0 * 2f32.powi(-10),
        1.0625,
        1.1875,
        -0.015_625,
        0.014,
        1e-30,
    ];
    let mut k: Vec<f32> = specials.to_vec();
    k.extend(r.vec(3 * kv_dim - specials.len()).iter().map(|x| x * 300.0));
    let v: Vec<f32> = r.vec(3 * kv_dim).iter().map(|x| x * 0.01).collect();
    let slots: Vec<i32> = vec![4, -1, 0];
    let n_slots = 6;
    let scales = Fp8Scales { k: 0.5, v: 2.0 };
    let mut kc = up(&g, &vec![0u8; n_slots * kv_dim]);
    let mut vc = up(&g, &vec![0u8; n_slots * kv_dim]);
    g.kernels()
        .kv_write_fp8(
            &up(&g, &k),
            &up(&g, &v),
            &mut kc,
            &mut vc,
            &up(&g, &slots),
            3,
            kv_dim,
            scales,
        )
        .expect("kv_write_fp8");
    for (cache, src, scale) in [(down(&g, &kc), &k, scales.k), (down(&g, &vc), &v, scales.v)] {
        let mut want = vec![0u8; n_slots * kv_dim];
        for (row, &s) in slots.iter().enumerate() {
            if s >= 0 {
                for (d, &x) in src[row * kv_dim..][..kv_dim].iter().enumerate() {
                    want[s as usize * kv_dim + d] = E4m3::from_f32(x / scale).0;
                }
            }
        }
        assert_eq!(cache, want, "scale {scale}");
    }
    assert!(g
        .kernels()
        .kv_write_fp8(
            &up(&g, &k),
            &up(&g, &v),
            &mut kc,
            &mut vc,
            &up(&g, &slots),
            3,
            kv_dim,
            Fp8Scales { k: 0.0, v: 1.0 },
        )
        .is_err());
}

/// Attention sinks (gpt-oss) on every path — decode, split decode (merged by the reduce
/// kernel), prefill tiles — bf16 and FP8, against the CPU's `paged_attention_with_sinks`.
#[test]
fn paged_attention_with_sinks_matches_the_cpu_on_every_path() {
    let Some(g) = gpu() else { return };
    let seqs = [
        Seq { rows: 1, start: 30 },
        Seq {
            rows: 1,
            start: 3000,
        },
        Seq {
            rows: 37,
            start: 50,
        },
    ];
    let shape = AttentionShape {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        scale: 0.25,
        softcap: None,
        window: None,
    };
    let sinks: Vec<f32> = (0..8).map(|h| h as f32 * 1.5 - 2.0).collect();
    for (seed, fp8) in [
        (71, None),
        (
            72,
            Some(Fp8Scales {
                k: 1.0 / 32.0,
                v: 1.0 / 128.0,
            }),
        ),
    ] {
        attention_case_as(&g, shape, &seqs, seed, fp8, Some(&sinks));
    }
}

#[test]
fn paged_attention_splits_one_long_decode_across_many_blocks() {
    let Some(g) = gpu() else { return };
    // One sequence, one kv head: the decode is split into many parts and merged.
    let shape = AttentionShape {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 96,
        scale: 0.1,
        softcap: None,
        window: None,
    };
    attention_case(
        &g,
        shape,
        &[Seq {
            rows: 1,
            start: 5000,
        }],
        99,
    );
}

#[test]
fn gemm_bf16_matches_an_f32_product_of_the_rounded_inputs() {
    let Some(g) = gpu() else { return };
    let mut r = Rng(6);
    for (m, n, k) in [(1, 70, 96), (33, 130, 320), (64, 64, 1)] {
        let (x, w, c0) = (r.vec(m * k), r.vec(n * k), r.vec(m * n));
        let (xr, wr) = (rounded(&x), rounded(&w));
        for (alpha, beta) in [(1.0f32, 0.0f32), (0.5, 1.0)] {
            let mut out = up(&g, &c0);
            g.blas()
                .gemm_bf16(
                    &up(&g, &bf16s(&x)),
                    &up(&g, &bf16s(&w)),
                    &mut out,
                    m,
                    n,
                    k,
                    alpha,
                    beta,
                )
                .expect("gemm_bf16");
            let want: Vec<f32> = (0..m * n)
                .map(|i| {
                    let (row, col) = (i / n, i % n);
                    let dot: f64 = (0..k)
                        .map(|j| xr[row * k + j] as f64 * wr[col * k + j] as f64)
                        .sum();
                    (alpha as f64 * dot + beta as f64 * c0[i] as f64) as f32
                })
                .collect();
            assert_close(
                &format!("gemm m {m} n {n} k {k} alpha {alpha} beta {beta}"),
                &down(&g, &out),
                &want,
                GEMM_TOLERANCE * (k as f32).sqrt(),
            );
        }
    }
}

#[test]
fn the_context_reports_its_gpu_and_memory() {
    let Some(g) = gpu() else { return };
    let (free, total) = g.memory_info().expect("memory info");
    assert!(free > 0 && free <= total, "{free} {total}");
    assert!(g.gpu().compute_capability.0 >= 8);
    g.synchronize().expect("synchronize");
}
