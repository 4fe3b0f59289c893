//! AVX-512 (F/BW/VL, VNNI where present) row kernels.
//!
//! Invariant: every function here is `#[target_feature]` and reached only through
//! [`kernel`], which the dispatcher calls only after `Isa::Avx512` was found available.

use super::RowKernel;
use crate::GgmlType;

/// The AVX-512 kernel of `ty`, when there is one.
pub(crate) fn kernel(_ty: GgmlType) -> Option<RowKernel> {
    None
}
