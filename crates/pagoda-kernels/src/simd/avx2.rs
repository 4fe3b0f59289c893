//! AVX2 (+FMA, F16C) row kernels.
//!
//! Invariant: every function here is `#[target_feature]` and reached only through
//! [`kernel`], which the dispatcher calls only after `Isa::Avx2` was found available.

use super::RowKernel;
use crate::GgmlType;

/// The AVX2 kernel of `ty`, when there is one.
pub(crate) fn kernel(_ty: GgmlType) -> Option<RowKernel> {
    None
}
