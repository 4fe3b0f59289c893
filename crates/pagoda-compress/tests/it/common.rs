//! Helpers shared by the tests: deterministic random matrices and tensor builders.

use pagoda_kernels::GgmlType;
use pagoda_model::weights::{TensorView, Weights};

/// A small deterministic generator (splitmix64), so failures reproduce without a seed file.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Roughly normal (sum of four uniforms, centred and scaled to unit variance).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3f32.sqrt()
    }
}

/// `rows x cols` values like a weight matrix: normal, each row with its own scale (0.005 to
/// 0.5), with a rare outlier ten times larger.
pub fn weight_like(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let scale = 0.005 * 100f32.powf(rng.uniform());
        for _ in 0..cols {
            let outlier = if rng.uniform() < 0.002 { 10.0 } else { 1.0 };
            out.push(rng.normal() * scale * outlier);
        }
    }
    out
}

/// An F32 tensor view over `values`.
pub fn f32_tensor(name: &str, shape: &[usize], values: &[f32]) -> TensorView {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    TensorView::owned(name, GgmlType::F32, shape.to_vec(), data).expect("valid f32 tensor")
}

/// `values` quantized to `ty` as a tensor view (rows of `shape.last()`).
pub fn typed_tensor(name: &str, ty: GgmlType, shape: &[usize], values: &[f32]) -> TensorView {
    let cols = *shape.last().expect("a shape");
    let row_bytes = ty.row_bytes(cols).expect("whole blocks");
    let mut data = vec![0u8; row_bytes * values.len() / cols];
    for (src, dst) in values.chunks(cols).zip(data.chunks_mut(row_bytes)) {
        pagoda_kernels::quantize_row(ty, src, dst).expect("quantizes");
    }
    TensorView::owned(name, ty, shape.to_vec(), data).expect("valid tensor")
}

/// Weights holding `views`.
pub fn weights(views: impl IntoIterator<Item = TensorView>) -> Weights {
    let mut w = Weights::new();
    for v in views {
        w.insert(v).expect("distinct names");
    }
    w
}
