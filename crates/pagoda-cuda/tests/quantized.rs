//! The quantized-weight kernels (`QuantizedMatrix`, `QuantKernels`) against pagoda-kernels'
//! CPU reference: for every format, random weights quantized by the CPU's quantizer, the GPU
//! product equals the CPU's dequantize-then-multiply within named tolerances, for 1 and 3
//! activation rows (the GEMV) and 64 (the tiled GEMM, with tiles that do not divide the
//! rows), on shapes whose rows and groups are not multiples of the kernels' tiles.
//!
//! Without a usable GPU each GPU test prints `skipped: no GPU (<reason>)` to stderr and
//! passes. Three run everywhere: the row sizes against pagoda-kernels; the NVRTC compile of
//! every new kernel for sm_80 and sm_90 (NVRTC only: scripts/test.sh installs it); and the
//! kernels' layout code (`dequant8` of quant.cu, every format) compiled as host C++ and run
//! against pagoda-kernels' dequantization bit for bit (needs a C++ compiler; skipped,
//! saying so, without one).

use cudarc::driver::{CudaSlice, DeviceRepr};
use half::bf16;
use pagoda_cuda::kernels::{KernelCache, QUANT};
use pagoda_cuda::{
    list_gpus, CudaError, GpuContext, Libraries, QuantFormat, QuantWorkspace, QuantizedMatrix,
    GEMV_MAX_ROWS,
};
use pagoda_kernels::GgmlType;

/// Largest |gpu - cpu| of the GEMV relative to `Σ_c |W[i, c] x[r, c]|`: both multiply the
/// same f32 weights by the same f32 activations; only the order of the f32 sums differs
/// (the reference sums in f64), about `sqrt(k) · 2^-24` of that scale for k ≤ 16640.
const GEMV_TOLERANCE: f64 = 5e-5;
/// The same for the GEMM path: weights and activations are rounded to bf16 (2^-9 relative
/// each, so at most about 2 · 2^-9 per product) and summed in f32 by cuBLAS.
const GEMM_TOLERANCE: f64 = 5e-3;
/// The int8 GEMV of Q8_0 / INT8 rounds each activation to a multiple of its block's
/// `amax / 127`: at most this share of the block's amax per value (half a step, and a
/// little for the reciprocal the quantizer multiplies by), times `|W|` summed; plus
/// [`GEMV_TOLERANCE`] for the sums.
const INT8_ACTIVATION_ROUNDING: f64 = 0.5 / 127.0 * 1.001;
/// Largest |gpu - cpu| / |cpu| of a dequantized bf16 value: one bf16 step (the GPU may fuse
/// `d * q + m` into one rounding where the CPU rounds twice, which can move a value across
/// a bf16 rounding boundary).
const DEQUANT_TOLERANCE: f32 = 1.0 / 128.0;
/// Largest |gpu - cpu| / max(1, |cpu|) of an embedding value (same f32 arithmetic; only a
/// fused multiply-add may differ in the last bit).
const EMBED_TOLERANCE: f32 = 1e-6;

/// Every GPU format with the CPU type whose quantizer makes its bytes (INT4 g32 is Q4_0 /
/// Q4_1 blocks) and a row length: whole blocks, but not a multiple of the 256 elements one
/// GEMV warp covers per step, and NF4_DQ long enough for two second-level scales.
const CASES: &[(QuantFormat, GgmlType, usize)] = &[
    (QuantFormat::Q8_0, GgmlType::Q8_0, 416),
    (QuantFormat::Q4_0, GgmlType::Q4_0, 416),
    (QuantFormat::Q4_0, GgmlType::Int4G32Sym, 416),
    (QuantFormat::Q4_1, GgmlType::Q4_1, 416),
    (QuantFormat::Q4_1, GgmlType::Int4G32, 416),
    (QuantFormat::Q4K, GgmlType::Q4_K, 768),
    (QuantFormat::Q5K, GgmlType::Q5_K, 768),
    (QuantFormat::Q6K, GgmlType::Q6_K, 768),
    (QuantFormat::Int8, GgmlType::Int8, 416),
    (QuantFormat::Int4G64, GgmlType::Int4G64, 448),
    (QuantFormat::Int4G64Sym, GgmlType::Int4G64Sym, 448),
    (QuantFormat::Int4G128, GgmlType::Int4G128, 384),
    (QuantFormat::Int4G128Sym, GgmlType::Int4G128Sym, 384),
    (QuantFormat::Nf4, GgmlType::Nf4, 448),
    (QuantFormat::Nf4Dq, GgmlType::Nf4Dq, 448),
    (QuantFormat::Nf4Dq, GgmlType::Nf4Dq, 257 * 64),
    (QuantFormat::Mxfp4, GgmlType::Mxfp4, 416),
];

/// Weight rows: not a multiple of the GEMV's 4 rows per block nor of [`TILE_ROWS`].
const ROWS: usize = 77;
/// Rows per GEMM tile in these tests (77 = 2 x 30 + 17).
const TILE_ROWS: usize = 30;

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
}

/// A random `[rows, cols]` matrix quantized to `ty` by the CPU, and its CPU dequantization.
/// Magnitudes vary by 32-element chunk and row, so block scales and minimums differ.
fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut r = Rng(seed);
    let row_bytes = ty.row_bytes(cols).expect("whole blocks");
    let mut bytes = vec![0u8; rows * row_bytes];
    let mut deq = vec![0.0f32; rows * cols];
    for i in 0..rows {
        let x: Vec<f32> = (0..cols)
            .map(|c| {
                let amp = 0.05 * (1 + (c / 32 + i) % 7) as f32;
                let off = if (c / 64 + i) % 3 == 0 {
                    0.3 * amp
                } else {
                    0.0
                };
                r.next() * amp + off
            })
            .collect();
        let dst = &mut bytes[i * row_bytes..(i + 1) * row_bytes];
        pagoda_kernels::quantize_row(ty, &x, dst).expect("quantize");
        pagoda_kernels::dequantize_row(ty, dst, &mut deq[i * cols..(i + 1) * cols])
            .expect("dequantize");
    }
    (bytes, deq)
}

fn up<T: DeviceRepr>(g: &GpuContext, v: &[T]) -> CudaSlice<T> {
    g.stream().clone_htod(v).expect("upload")
}

fn down<T: DeviceRepr + Default + Clone>(g: &GpuContext, s: &CudaSlice<T>) -> Vec<T> {
    let v = g.stream().clone_dtoh(s).expect("download");
    g.synchronize().expect("synchronize");
    v
}

#[test]
fn row_sizes_are_pagoda_kernels_sizes() {
    for &(format, ty, cols) in CASES {
        for n in [cols, 2 * cols, format.block_elems()] {
            assert_eq!(
                format.row_bytes(n),
                Some(ty.row_bytes(n).expect("whole blocks")),
                "{format} vs {ty} at {n} columns"
            );
        }
        assert_eq!(format.row_bytes(0), None, "{format}");
        assert_eq!(format.row_bytes(format.block_elems() + 8), None, "{format}");
    }
    for format in QuantFormat::ALL {
        assert!(
            CASES.iter().any(|c| c.0 == format),
            "{format} has no test case"
        );
    }
}

#[test]
fn every_quant_kernel_compiles_for_sm_80_and_sm_90() {
    if !Libraries::find().nvrtc {
        assert!(
            std::env::var_os("CI").is_none(),
            "NVRTC must be found under CI"
        );
        eprintln!("skipped: no NVRTC");
        return;
    }
    // Per format GEMV, dequantize and embedding; the int8 GEMV of Q8_0 and INT8 and its
    // activation quantizer.
    let extra = ["quantize_q8_act", "qgemv8_q8_0", "qgemv8_int8"];
    assert_eq!(
        QUANT.entries.len(),
        3 * QuantFormat::ALL.len() + extra.len()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::new(dir.path());
    for arch in ["sm_80", "sm_90"] {
        let compiled = match cache.ptx(QUANT.name, QUANT.source, arch) {
            Ok(c) => c,
            Err(e) => panic!("quant.cu for {arch}: {e}"),
        };
        let text = compiled.ptx.to_src();
        assert!(text.contains(&format!(".target {arch}")));
        for entry in extra {
            assert!(QUANT.entries.contains(&entry), "{entry} is not listed");
            assert!(
                text.contains(&format!(".entry {entry}(")),
                "quant.cu for {arch} lacks {entry}"
            );
        }
        for format in QuantFormat::ALL {
            for kind in ["qgemv", "qdequant", "qembed"] {
                let entry = format!("{kind}_{}", format.name());
                assert!(
                    QUANT.entries.contains(&entry.as_str()),
                    "{entry} is not listed"
                );
                assert!(
                    text.contains(&format!(".entry {entry}(")),
                    "quant.cu for {arch} lacks {entry}"
                );
            }
        }
    }
}

/// Which GEMV or GEMM a product went through, for its tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Gemv,
    GemvInt8,
    Gemm,
}

/// Asserts `got` (`[m, rows]`) is `x · deqᵀ` within `path`'s tolerance.
#[allow(clippy::too_many_arguments)]
fn assert_product(
    what: &str,
    path: Path,
    got: &[f32],
    deq: &[f32],
    x: &[f32],
    m: usize,
    rows: usize,
    cols: usize,
) {
    for r in 0..m {
        let xr = &x[r * cols..(r + 1) * cols];
        let amax: Vec<f64> = xr
            .chunks_exact(32)
            .map(|b| b.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64)))
            .collect();
        for i in 0..rows {
            let (mut want, mut scale, mut rounding) = (0.0f64, 0.0f64, 0.0f64);
            for c in 0..cols {
                let wv = deq[i * cols + c] as f64;
                let p = wv * xr[c] as f64;
                want += p;
                scale += p.abs();
                rounding += wv.abs() * amax[c / 32];
            }
            let tol = match path {
                Path::Gemv => GEMV_TOLERANCE * scale,
                Path::GemvInt8 => GEMV_TOLERANCE * scale + INT8_ACTIVATION_ROUNDING * rounding,
                Path::Gemm => GEMM_TOLERANCE * scale,
            };
            let err = (got[r * rows + i] as f64 - want).abs();
            assert!(
                err <= tol.max(1e-7),
                "{what}, {path:?}, {m} rows: out[{r}, {i}] = {} vs {want} (|diff| {err}, \
                 tolerance {tol})",
                got[r * rows + i]
            );
        }
    }
}

/// Host shims for the part of quant.cu that also compiles as C++ (`PAGODA_HOST_TEST`), and
/// a driver that runs `dequant8<F>` over every group of every row of each case file and
/// counts values that differ from pagoda-kernels' dequantization (bit for bit: the host does
/// the same f32 operations, unfused).
const HOST_HARNESS: &str = r#"
#define PAGODA_HOST_TEST
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __constant__
static float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fmul_rn(float a, float b) { return a * b; }
static float f16_to_f32(unsigned short h) {
    const unsigned s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
            : std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
#include "quant.cu"

static std::vector<char> slurp(const char* path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <int F> static long check(const char* bin, const char* f32, int rows, int cols, long rb) {
    const std::vector<char> b = slurp(bin), r = slurp(f32);
    if ((long)b.size() != rows * rb || (long)r.size() != 4L * rows * cols) return -1;
    long bad = 0;
    for (int i = 0; i < rows; ++i) {
        for (int g = 0; g < cols / 8; ++g) {
            float v[8];
            dequant8<F>((const u8*)b.data() + i * rb, g, cols, v);
            for (int j = 0; j < 8; ++j) {
                float want;
                std::memcpy(&want, r.data() + 4L * ((long)i * cols + 8 * g + j), 4);
                if (std::memcmp(&v[j], &want, 4) != 0 && bad++ < 3)
                    std::printf("  row %d value %d: %.9g, want %.9g\n", i, 8 * g + j, v[j], want);
            }
        }
    }
    return bad;
}

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    FILE* f = std::fopen(argv[1], "r");
    if (!f) return 2;
    int id, rows, cols, failed = 0;
    long rb;
    char bin[4096], f32[4096];
    while (std::fscanf(f, "%d %d %d %ld %4095s %4095s", &id, &rows, &cols, &rb, bin, f32) == 6) {
        long bad = -2;
        switch (id) {
            case 0: bad = check<0>(bin, f32, rows, cols, rb); break;
            case 1: bad = check<1>(bin, f32, rows, cols, rb); break;
            case 2: bad = check<2>(bin, f32, rows, cols, rb); break;
            case 3: bad = check<3>(bin, f32, rows, cols, rb); break;
            case 4: bad = check<4>(bin, f32, rows, cols, rb); break;
            case 5: bad = check<5>(bin, f32, rows, cols, rb); break;
            case 6: bad = check<6>(bin, f32, rows, cols, rb); break;
            case 7: bad = check<7>(bin, f32, rows, cols, rb); break;
            case 8: bad = check<8>(bin, f32, rows, cols, rb); break;
            case 9: bad = check<9>(bin, f32, rows, cols, rb); break;
            case 10: bad = check<10>(bin, f32, rows, cols, rb); break;
            case 11: bad = check<11>(bin, f32, rows, cols, rb); break;
            case 12: bad = check<12>(bin, f32, rows, cols, rb); break;
            case 13: bad = check<13>(bin, f32, rows, cols, rb); break;
        }
        std::printf("format %d [%d, %d]: %ld values differ\n", id, rows, cols, bad);
        failed += bad != 0;
    }
    return failed;
}
"#;

/// A C++ compiler on this machine, if any.
fn cxx() -> Option<&'static str> {
    ["c++", "g++", "clang++"].into_iter().find(|c| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_kernels_dequantization_compiled_for_the_host_matches_pagoda_kernels_bit_for_bit() {
    let Some(cxx) = cxx() else {
        eprintln!(
            "skipped: no C++ compiler (c++, g++ or clang++) to run quant.cu's dequant8 on the host"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("quant.cu"), QUANT.source).expect("write quant.cu");
    std::fs::write(path("harness.cpp"), HOST_HARNESS).expect("write harness");
    let mut list = String::new();
    for (case, &(format, ty, cols)) in CASES.iter().enumerate() {
        // Odd row counts; NF4_DQ rows of 7 blocks have an odd length (rows at odd offsets).
        let rows = 5;
        let (bytes, deq) = quantized(ty, rows, cols, 71 + case as u64);
        let (bin, f32s) = (path(&format!("{case}.bin")), path(&format!("{case}.f32")));
        std::fs::write(&bin, &bytes).expect("write blocks");
        let le: Vec<u8> = deq.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&f32s, le).expect("write values");
        let id = QuantFormat::ALL
            .iter()
            .position(|f| *f == format)
            .expect("a format id");
        list += &format!(
            "{id} {rows} {cols} {} {} {}\n",
            bytes.len() / rows,
            bin.display(),
            f32s.display()
        );
    }
    std::fs::write(path("cases.txt"), list).expect("write cases");
    let exe = path("harness");
    let built = std::process::Command::new(cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-Wno-unknown-pragmas",
            "-o",
        ])
        .arg(&exe)
        .arg(path("harness.cpp"))
        .output()
        .expect("run the C++ compiler");
    assert!(
        built.status.success(),
        "{cxx} could not build quant.cu for the host:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = std::process::Command::new(&exe)
        .arg(path("cases.txt"))
        .output()
        .expect("run the harness");
    let report = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "dequant8 differs from pagoda-kernels:\n{report}"
    );
    let clean = report
        .lines()
        .filter(|l| l.ends_with(": 0 values differ"))
        .count();
    assert_eq!(clean, CASES.len(), "{report}");
}

#[test]
fn quantized_matmul_matches_the_cpu_dequantize_then_multiply() {
    let Some(g) = gpu() else { return };
    let q = g.quant();
    for (case, &(format, ty, cols)) in CASES.iter().enumerate() {
        let rows = if cols > 4096 { 9 } else { ROWS };
        let what = format!("{format} ({ty}) [{rows}, {cols}]");
        let (bytes, deq) = quantized(ty, rows, cols, 11 + case as u64);
        let w = QuantizedMatrix::upload(g.stream(), format, rows, cols, &bytes).expect("upload");
        assert_eq!(
            w.bytes(),
            bytes.len(),
            "{what}: GPU bytes are the stored bytes"
        );
        let int8 = matches!(format, QuantFormat::Q8_0 | QuantFormat::Int8);
        let mut ws = QuantWorkspace::with_tile_limit(TILE_ROWS * cols);
        let mut rng = Rng(100 + case as u64);
        for m in [1, 3, 64] {
            // Block magnitudes differ, so a wrong activation scale would show.
            let x: Vec<f32> = rng
                .vec(m * cols)
                .iter()
                .enumerate()
                .map(|(j, v)| v * 0.1 * (1 + (j / 32) % 9) as f32)
                .collect();
            let x16: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let (xd, x16d) = (up(&g, &x), up(&g, &x16));
            let mut out = up(&g, &vec![f32::NAN; m * rows]);
            q.matmul(g.blas(), &w, &xd, &x16d, &mut out, m, &mut ws)
                .expect("matmul");
            let path = match (m <= GEMV_MAX_ROWS, int8) {
                (true, true) => Path::GemvInt8,
                (true, false) => Path::Gemv,
                (false, _) => Path::Gemm,
            };
            assert_product(&what, path, &down(&g, &out), &deq, &x, m, rows, cols);
            if path == Path::GemvInt8 {
                // The f32 GEMV works on every format, the 8-bit ones included.
                let mut out = up(&g, &vec![f32::NAN; m * rows]);
                q.gemv(&w, &xd, &mut out, m).expect("gemv");
                assert_product(&what, Path::Gemv, &down(&g, &out), &deq, &x, m, rows, cols);
            }
        }
    }
}

#[test]
fn dequantized_tiles_are_the_cpu_values_in_bf16() {
    let Some(g) = gpu() else { return };
    for (case, &(format, ty, cols)) in CASES.iter().enumerate() {
        let rows = if cols > 4096 { 9 } else { ROWS };
        let (bytes, deq) = quantized(ty, rows, cols, 31 + case as u64);
        let w = QuantizedMatrix::upload(g.stream(), format, rows, cols, &bytes).expect("upload");
        let (r0, nrows) = (2, rows - 5);
        let mut out = up(&g, &vec![bf16::from_f32(f32::NAN); nrows * cols]);
        g.quant()
            .dequantize(&w, r0, nrows, &mut out)
            .expect("dequantize");
        let got = down(&g, &out);
        for (j, (gv, cv)) in got.iter().zip(&deq[r0 * cols..]).enumerate() {
            let want = bf16::from_f32(*cv).to_f32();
            let err = (gv.to_f32() - want).abs();
            assert!(
                err <= DEQUANT_TOLERANCE * want.abs(),
                "{format} ({ty}): value {j} of rows {r0}..: {gv} vs {want} (cpu f32 {cv})"
            );
        }
    }
}

#[test]
fn quantized_embedding_looks_up_dequantized_rows() {
    let Some(g) = gpu() else { return };
    for (case, &(format, ty, cols)) in CASES.iter().enumerate() {
        let vocab = 23;
        let (bytes, deq) = quantized(ty, vocab, cols, 51 + case as u64);
        let w = QuantizedMatrix::upload(g.stream(), format, vocab, cols, &bytes).expect("upload");
        let tokens: Vec<u32> = vec![3, 0, 22, 3, 99, 17];
        let mut out = up(&g, &vec![0.0f32; tokens.len() * cols]);
        g.quant()
            .embed(&w, &up(&g, &tokens), &mut out, tokens.len(), 0.5)
            .expect("embed");
        let got = down(&g, &out);
        for (r, &t) in tokens.iter().enumerate() {
            let row = &got[r * cols..(r + 1) * cols];
            if t as usize >= vocab {
                assert!(
                    row.iter().all(|v| v.is_nan()),
                    "{format}: token {t} is not NaN"
                );
                continue;
            }
            for (c, &v) in row.iter().enumerate() {
                let want = deq[t as usize * cols + c] * 0.5;
                assert!(
                    (v - want).abs() <= EMBED_TOLERANCE * want.abs().max(1.0),
                    "{format} ({ty}): token {t} value {c}: {v} vs {want}"
                );
            }
        }
    }
}

#[test]
fn bad_sizes_are_refused_before_anything_is_launched() {
    let Some(g) = gpu() else { return };
    let q = g.quant();
    let (rows, cols) = (5, 64);
    let (bytes, _) = quantized(GgmlType::Q8_0, rows, cols, 7);
    let shape = |r: Result<(), CudaError>, what: &str| match r {
        Err(CudaError::Shape { .. }) => {}
        other => panic!("{what}: {other:?}"),
    };
    shape(
        QuantizedMatrix::upload(g.stream(), QuantFormat::Q8_0, rows, cols, &bytes[1..]).map(|_| ()),
        "short bytes",
    );
    shape(
        QuantizedMatrix::upload(g.stream(), QuantFormat::Q8_0, rows, 48, &bytes).map(|_| ()),
        "partial block",
    );
    let w =
        QuantizedMatrix::upload(g.stream(), QuantFormat::Q8_0, rows, cols, &bytes).expect("upload");
    let x = up(&g, &vec![0.0f32; 16 * cols]);
    let x16 = up(&g, &vec![bf16::ZERO; 16 * cols]);
    let mut out = up(&g, &vec![0.0f32; 16 * rows]);
    let mut tile = up(&g, &vec![bf16::ZERO; cols]);
    let mut ws = QuantWorkspace::new();
    shape(
        q.gemv(&w, &x, &mut out, GEMV_MAX_ROWS + 1),
        "too many GEMV rows",
    );
    shape(
        q.gemv(&w, &x.slice(0..cols), &mut out, 2),
        "x shorter than two rows",
    );
    shape(
        q.gemv(&w, &x.slice(1..), &mut out, 1),
        "x not 16-byte aligned",
    );
    shape(
        q.gemv(&w, &x, &mut out.slice_mut(0..rows - 1), 1),
        "out too short",
    );
    shape(q.dequantize(&w, 3, 3, &mut tile), "rows past the end");
    shape(
        q.gemv_int8(&w, &x, &mut out, GEMV_MAX_ROWS + 1, &mut ws),
        "too many int8 GEMV rows",
    );
    let (q4, _) = quantized(GgmlType::Q4_0, rows, cols, 8);
    let w4 =
        QuantizedMatrix::upload(g.stream(), QuantFormat::Q4_0, rows, cols, &q4).expect("upload");
    shape(
        q.gemv_int8(&w4, &x, &mut out, 1, &mut ws),
        "the int8 GEMV of a 4-bit format",
    );
    let mut small = QuantWorkspace::with_tile_limit(cols - 1);
    q.matmul(g.blas(), &w, &x, &x16, &mut out, 16, &mut small)
        .expect("a tile limit under one row still takes one row per tile");
    g.synchronize().expect("synchronize");
}
