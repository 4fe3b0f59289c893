//! Grids for group-wise weight quantization, and the quantized matrix they produce.
//!
//! A grid maps a real value `w` to a code `q ∈ [0, maxq]` (`maxq = 2^bits - 1`) and back to
//! `scale * (q - zero)`. Two kinds ([`GridKind`]), chosen by the format the codes go to:
//! - [`GridKind::IntegerZero`] (GPTQ's and AWQ's checkpoints, Q4_0, Q8_0): `zero` is an integer
//!   code, `q = clamp(round(w / scale) + zero, 0, maxq)`. Asymmetric grids span `[min, max]`
//!   of the values they cover, always including 0 (as GPTQ's reference does); symmetric grids
//!   span `[-absmax, absmax]` with the zero point fixed in the middle (`(maxq + 1) / 2`).
//! - [`GridKind::FloatMin`] (Q4_1's `d · q + m`): asymmetric, the grid starts at the group's
//!   minimum (0 need not be on it), `m` = the minimum rounded to f16 and `d = (max − m) / maxq`
//!   rounded to f16, exactly what a Q4_1 block can hold; `q = clamp(round((w − m) / d), 0,
//!   maxq)`. `zero` is then `−m / d`, a real number in code units (a constant group gets the
//!   smallest positive f16 step, so `zero` stays finite and code 0 is still `m`).
//!
//! [`GroupQuantized`] holds one matrix: codes row-major `[rows, cols]`, one (scale, zero) per
//! (row, group), and the group of every input column (`g_idx`, GPTQ's name): consecutive
//! columns share a group unless act-order permuted them.
//!
//! Invariants: `2 <= bits <= 8`; every code is `<= maxq`; `scales.len() == zeros.len() ==
//! rows * groups`; `g_idx.len() == cols` and every entry `< groups`; an `IntegerZero` grid's
//! zeros are integers in `[0, maxq]`; a `FloatMin` spec is asymmetric, its scales and
//! `−scale · zero` are f16 values.

use half::f16;

use crate::CompressError;

/// Where a grid's zero sits (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GridKind {
    /// An integer zero-point code: GPTQ/AWQ checkpoints (`qzeros`), Q4_0, Q8_0.
    #[default]
    IntegerZero,
    /// A float minimum (f16) and an f16 step: Q4_1 blocks. Asymmetric only.
    FloatMin,
}

/// How a matrix is quantized: bits per weight, columns per group, grid shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSpec {
    pub bits: u8,
    /// Columns per group; `None` = one group per row (per-channel).
    pub group_size: Option<usize>,
    pub symmetric: bool,
    /// Integer zero point or float minimum; pick it from the output format.
    pub grid: GridKind,
    /// Search each group's clipping range (GPTQ's `mse` option): the range `[p·min, p·max]`,
    /// `p` in `CLIP_RATIOS`, whose grid gives the group the least squared rounding error,
    /// instead of the full `[min, max]`. Outliers then cost a little clipping instead of a
    /// coarser step for every other weight of the group.
    pub clip_search: bool,
}

/// Shrink factors of the clipping search: 1.00, 0.99, ..., 0.80 (AutoGPTQ's `maxshrink`).
const CLIP_RATIOS: std::ops::RangeInclusive<u32> = 80..=100;

impl GroupSpec {
    /// Checks the combination against a matrix of `cols` columns.
    pub fn validate(&self, cols: usize) -> Result<(), CompressError> {
        if !(2..=8).contains(&self.bits) {
            return Err(CompressError::InvalidInput(format!(
                "{} bits is not supported: use 2 to 8 (4 or 8 for GGUF/GPTQ/AWQ output)",
                self.bits
            )));
        }
        if self.grid == GridKind::FloatMin && self.symmetric {
            return Err(CompressError::InvalidInput(
                "a float-minimum grid (Q4_1) is asymmetric; drop --sym, or use the integer \
                 zero-point grid"
                    .into(),
            ));
        }
        if let Some(g) = self.group_size {
            if g == 0 || !cols.is_multiple_of(g) {
                return Err(CompressError::InvalidInput(format!(
                    "group size {g} does not divide the {cols} columns of the matrix; use a \
                     divisor of {cols} (32, 64 and 128 are usual) or per-channel groups"
                )));
            }
        }
        Ok(())
    }

    pub fn maxq(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    /// Groups per row for `cols` columns.
    pub fn groups(&self, cols: usize) -> usize {
        self.group_size.map_or(1, |g| cols.div_ceil(g.max(1)))
    }
}

/// The (scale, zero) of one group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub scale: f32,
    /// In code units; an integer for [`GridKind::IntegerZero`].
    pub zero: f32,
    pub maxq: u32,
    pub kind: GridKind,
}

impl Grid {
    /// The grid of `values` under `spec`: GPTQ's `find_params` min/max rule for integer zero
    /// points, Q4_1's f16 minimum and step for float minima; with `clip_search`, the shrunk
    /// range whose grid has the least squared error on `values` (ties: the widest).
    pub fn fit(values: &[f32], spec: &GroupSpec) -> Grid {
        let full = Self::fit_shrunk(values, spec, 1.0);
        if !spec.clip_search {
            return full;
        }
        let error = |g: &Grid| -> f64 {
            values
                .iter()
                .map(|&v| f64::from(v - g.snap(v)).powi(2))
                .sum()
        };
        let (mut best, mut best_err) = (full, error(&full));
        for pct in CLIP_RATIOS.rev().skip(1) {
            let g = Self::fit_shrunk(values, spec, pct as f32 / 100.0);
            let e = error(&g);
            if e < best_err {
                (best, best_err) = (g, e);
            }
        }
        best
    }

    /// [`Grid::fit`] on the range `[p·min, p·max]` of `values`.
    fn fit_shrunk(values: &[f32], spec: &GroupSpec, p: f32) -> Grid {
        let maxq = spec.maxq();
        if spec.grid == GridKind::FloatMin {
            let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
            for &v in values {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            if !(lo.is_finite() && hi.is_finite()) {
                (lo, hi) = (0.0, 0.0);
            }
            let (lo, hi) = (lo * p, hi * p);
            let m = f16::from_f32(lo).to_f32();
            // A constant group gets the smallest f16 step rather than 0, so `zero` stays finite
            // and code 0 is still `m`.
            let scale = f16::from_f32((hi - m) / maxq as f32)
                .to_f32()
                .max(f16::from_bits(1).to_f32());
            return Grid {
                scale,
                zero: -m / scale,
                maxq,
                kind: GridKind::FloatMin,
            };
        }
        let (mut lo, mut hi) = (0.0f32, 0.0f32);
        for &v in values {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        (lo, hi) = (lo * p, hi * p);
        if spec.symmetric {
            let m = hi.max(-lo);
            lo = -m;
            hi = m;
        }
        if lo == 0.0 && hi == 0.0 {
            lo = -1.0;
            hi = 1.0;
        }
        let scale = (hi - lo) / maxq as f32;
        let zero = if spec.symmetric {
            (maxq as f32 + 1.0) / 2.0
        } else {
            (-lo / scale).round()
        };
        Grid {
            scale,
            zero,
            maxq,
            kind: GridKind::IntegerZero,
        }
    }

    /// The value of code 0 (`m` of a Q4_1 block).
    #[inline]
    pub fn min(&self) -> f32 {
        -self.scale * self.zero
    }

    #[inline]
    pub fn code(&self, w: f32) -> u8 {
        let q = match self.kind {
            GridKind::IntegerZero => (w / self.scale).round() + self.zero,
            GridKind::FloatMin => (w / self.scale + self.zero).round(),
        };
        q.clamp(0.0, self.maxq as f32) as u8
    }

    #[inline]
    pub fn value(&self, q: u8) -> f32 {
        self.scale * (q as f32 - self.zero)
    }

    /// `w` snapped to the grid.
    #[inline]
    pub fn snap(&self, w: f32) -> f32 {
        self.value(self.code(w))
    }
}

/// A matrix in group-wise integer form.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupQuantized {
    pub rows: usize,
    pub cols: usize,
    pub spec: GroupSpec,
    /// `[rows, cols]` codes.
    pub codes: Vec<u8>,
    /// `[rows, groups]`.
    pub scales: Vec<f32>,
    /// `[rows, groups]`, in code units.
    pub zeros: Vec<f32>,
    /// `[cols]`: the group of each input column.
    pub g_idx: Vec<u32>,
}

impl GroupQuantized {
    pub fn groups(&self) -> usize {
        self.spec.groups(self.cols)
    }

    /// The grid of (row, group).
    pub fn grid(&self, row: usize, group: usize) -> Grid {
        let i = row * self.groups() + group;
        Grid {
            scale: self.scales[i],
            zero: self.zeros[i],
            maxq: self.spec.maxq(),
            kind: self.spec.grid,
        }
    }

    /// The dequantized matrix `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        for r in 0..self.rows {
            for c in 0..self.cols {
                let g = self.grid(r, self.g_idx[c] as usize);
                out[r * self.cols + c] = g.value(self.codes[r * self.cols + c]);
            }
        }
        out
    }
}

/// Round-to-nearest: every group gets its min/max grid, every weight its nearest code.
pub fn rtn(
    w: &[f32],
    rows: usize,
    cols: usize,
    spec: GroupSpec,
) -> Result<GroupQuantized, CompressError> {
    spec.validate(cols)?;
    check_shape(w, rows, cols)?;
    let gs = spec.group_size.unwrap_or(cols);
    let groups = spec.groups(cols);
    let mut q = GroupQuantized {
        rows,
        cols,
        spec,
        codes: vec![0; rows * cols],
        scales: vec![0.0; rows * groups],
        zeros: vec![0.0; rows * groups],
        g_idx: (0..cols).map(|c| (c / gs) as u32).collect(),
    };
    for r in 0..rows {
        for g in 0..groups {
            let (c0, c1) = (g * gs, ((g + 1) * gs).min(cols));
            let row = &w[r * cols + c0..r * cols + c1];
            let grid = Grid::fit(row, &spec);
            q.scales[r * groups + g] = grid.scale;
            q.zeros[r * groups + g] = grid.zero;
            for (c, &v) in (c0..c1).zip(row) {
                q.codes[r * cols + c] = grid.code(v);
            }
        }
    }
    Ok(q)
}

pub(crate) fn check_shape(w: &[f32], rows: usize, cols: usize) -> Result<(), CompressError> {
    if rows.checked_mul(cols) != Some(w.len()) || cols == 0 {
        return Err(CompressError::InvalidInput(format!(
            "a {rows}x{cols} matrix needs {} values, got {}",
            rows.saturating_mul(cols),
            w.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(bits: u8, symmetric: bool) -> GroupSpec {
        GroupSpec {
            bits,
            group_size: None,
            symmetric,
            grid: GridKind::IntegerZero,
            clip_search: false,
        }
    }

    #[test]
    fn asymmetric_grid_covers_min_and_max_within_half_a_step() {
        let v = [-0.7f32, -0.1, 0.0, 0.3, 1.3];
        let g = Grid::fit(&v, &spec_of(4, false));
        for &x in &v {
            assert!((g.snap(x) - x).abs() <= g.scale / 2.0 + 1e-6, "{x}");
        }
    }

    #[test]
    fn symmetric_grid_is_centred() {
        let g = Grid::fit(&[-2.0, 1.0], &spec_of(4, true));
        assert_eq!(g.zero, 8.0);
        assert!((g.snap(0.0)).abs() < 1e-7);
    }

    /// Heavy-tailed groups (Laplace, as trained weights are) are where clipping pays: the
    /// searched grid is never worse than the full range on any group and clearly better in
    /// total.
    #[test]
    fn clip_search_never_loses_to_the_full_range_and_wins_on_heavy_tails() {
        let mut state = 7u32;
        let mut uniform = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((state >> 8) as f32 + 0.5) / (1u32 << 24) as f32
        };
        for kind in [GridKind::IntegerZero, GridKind::FloatMin] {
            let (mut total_full, mut total_clip) = (0.0, 0.0);
            for trial in 0..200 {
                let v: Vec<f32> = (0..32)
                    .map(|_| {
                        let (u, sign) = (uniform(), uniform());
                        let magnitude = -u.ln() * 0.02;
                        if sign < 0.5 {
                            -magnitude
                        } else {
                            magnitude
                        }
                    })
                    .collect();
                let full = GroupSpec {
                    bits: 4,
                    group_size: None,
                    symmetric: false,
                    grid: kind,
                    clip_search: false,
                };
                let searched = GroupSpec {
                    clip_search: true,
                    ..full
                };
                let err =
                    |g: Grid| -> f64 { v.iter().map(|&x| f64::from(x - g.snap(x)).powi(2)).sum() };
                let (e_full, e_clip) = (err(Grid::fit(&v, &full)), err(Grid::fit(&v, &searched)));
                assert!(
                    e_clip <= e_full,
                    "{kind:?} trial {trial}: {e_clip} > {e_full}"
                );
                total_full += e_full;
                total_clip += e_clip;
            }
            assert!(
                total_clip < 0.97 * total_full,
                "{kind:?}: clipping gained only {:.1} %",
                100.0 * (1.0 - total_clip / total_full)
            );
        }
    }

    #[test]
    fn all_zero_groups_do_not_divide_by_zero() {
        let g = Grid::fit(&[0.0; 8], &spec_of(4, false));
        assert!(g.scale.is_finite() && g.scale > 0.0);
        assert_eq!(g.snap(0.0), 0.0);
    }

    #[test]
    fn rtn_round_trip_error_is_bounded_by_half_a_step() {
        let (rows, cols) = (3, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let spec = GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: false,
            grid: GridKind::IntegerZero,
            clip_search: false,
        };
        let q = rtn(&w, rows, cols, spec).unwrap();
        let d = q.dequantize();
        for r in 0..rows {
            for c in 0..cols {
                let g = q.grid(r, c / 32);
                assert!((d[r * cols + c] - w[r * cols + c]).abs() <= g.scale / 2.0 + 1e-5);
            }
        }
    }

    #[test]
    fn float_min_grid_spans_min_to_max_with_f16_step_and_minimum() {
        let spec = GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: false,
            grid: GridKind::FloatMin,
            clip_search: false,
        };
        // All positive: an integer zero point would have to put 0 on the grid.
        let v: Vec<f32> = (0..32).map(|i| 0.3 + i as f32 * 0.0137).collect();
        let g = Grid::fit(&v, &spec);
        assert_eq!(f16::from_f32(g.scale).to_f32(), g.scale);
        assert_eq!(f16::from_f32(g.min()).to_f32(), g.min());
        assert!((g.value(0) - 0.3).abs() < 1e-3 && (g.value(15) - v[31]).abs() < 1e-3);
        let int = Grid::fit(
            &v,
            &GroupSpec {
                grid: GridKind::IntegerZero,
                ..spec
            },
        );
        let worst = |g: &Grid| v.iter().map(|&x| (g.snap(x) - x).abs()).fold(0.0, f32::max);
        assert!(worst(&g) <= g.scale / 2.0 + 1e-6);
        assert!(worst(&g) < worst(&int), "{} vs {}", worst(&g), worst(&int));
        // A constant group is exact and finite.
        let c = Grid::fit(&[0.25; 32], &spec);
        assert!(c.zero.is_finite());
        assert_eq!(c.snap(0.25), 0.25);
        // Symmetric float-minimum grids do not exist.
        assert!(GroupSpec {
            symmetric: true,
            ..spec
        }
        .validate(32)
        .is_err());
    }

    #[test]
    fn bad_specs_are_refused_with_a_way_out() {
        let spec = |bits, g| GroupSpec {
            bits,
            group_size: g,
            symmetric: true,
            grid: GridKind::IntegerZero,
            clip_search: false,
        };
        assert!(spec(4, Some(48)).validate(64).is_err());
        assert!(spec(1, None).validate(64).is_err());
        assert!(spec(9, None).validate(64).is_err());
        assert!(spec(4, Some(0)).validate(64).is_err());
        assert!(spec(8, Some(64)).validate(128).is_ok());
        let e = rtn(&[0.0; 10], 2, 4, spec(4, None)).unwrap_err();
        assert!(e.to_string().contains("needs 8 values"), "{e}");
    }
}
