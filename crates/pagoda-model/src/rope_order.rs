//! llama.cpp's row order for the Q and K projections of Llama models, and its inverse.
//!
//! `convert_hf_to_gguf.py` (`LlamaModel.permute`) reorders the rows of each head of a Llama
//! Q or K matrix so that the two RoPE halves of a head are interleaved in pairs: with `hd`
//! rows per head and `half = hd / 2`, row `2i + s` of a head in the GGUF file is row
//! `s·half + i` of that head in the Hugging Face checkpoint. Pagoda computes on the GGUF
//! order (interleaved RoPE), so everything that crosses between the two worlds — LoRA
//! adapters made on Hugging Face weights, GGUF written from a Hugging Face folder, Hugging
//! Face folders written from a GGUF, merged adapters — uses the orders here.
//!
//! Invariants: an order is a permutation of `0..rows`; [`gguf_row_order`] and
//! [`hf_row_order`] are each other's inverse; both are `None` when the rows do not split into
//! `n_head` heads of an even number of rows (the caller reports the shape error).

use crate::config::{Architecture, ModelConfig};
use pagoda_kernels::ops::RopeStyle;

/// Whether a model's Q/K rows are stored in llama.cpp's interleaved order when it comes from
/// a GGUF file: a family whose GGUF files rotate interleaved pairs (Llama, SmolLM3; Qwen and
/// Gemma keep the Hugging Face order), read with interleaved RoPE.
pub fn gguf_permutes_qk(cfg: &ModelConfig) -> bool {
    family_permutes_in_gguf(cfg.arch) && cfg.rope_style == RopeStyle::Interleaved
}

/// Whether llama.cpp's converter permutes this family's Q/K rows when it writes GGUF (what a
/// GGUF writer of an HF folder must do too).
pub fn family_permutes_in_gguf(arch: Architecture) -> bool {
    arch.family().gguf_rope_style == RopeStyle::Interleaved
}

/// Row `r` of the GGUF order takes row `order[r]` of the Hugging Face order (llama.cpp's
/// `permute`), for a Q or K matrix of `rows` rows in `n_head` heads.
pub fn gguf_row_order(rows: usize, n_head: usize) -> Option<Vec<usize>> {
    let (hd, half) = head_split(rows, n_head)?;
    let mut order = Vec::with_capacity(rows);
    for h in 0..n_head {
        for i in 0..half {
            for s in 0..2 {
                order.push(h * hd + s * half + i);
            }
        }
    }
    Some(order)
}

/// Row `r` of the Hugging Face order takes row `order[r]` of the GGUF order: the inverse of
/// [`gguf_row_order`].
pub fn hf_row_order(rows: usize, n_head: usize) -> Option<Vec<usize>> {
    let (hd, half) = head_split(rows, n_head)?;
    let mut order = Vec::with_capacity(rows);
    for h in 0..n_head {
        for s in 0..2 {
            for i in 0..half {
                order.push(h * hd + i * 2 + s);
            }
        }
    }
    Some(order)
}

/// `[rows, cols]` row-major `w` with its rows in `order` (row `r` of the result is row
/// `order[r]` of `w`).
///
/// # Panics
/// If `order` indexes past the rows of `w` (orders come from the functions above).
pub fn reorder_rows<T: Copy>(w: &[T], cols: usize, order: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(order.len() * cols);
    for &src in order {
        out.extend_from_slice(&w[src * cols..(src + 1) * cols]);
    }
    out
}

/// Rows per head and half of it, when `rows` splits into `n_head` heads of an even size.
fn head_split(rows: usize, n_head: usize) -> Option<(usize, usize)> {
    if n_head == 0 || rows == 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0 {
        return None;
    }
    let hd = rows / n_head;
    Some((hd, hd / 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_llama_cpp_permute() {
        // llama.cpp: w.reshape(n_head, 2, hd / 2, cols).swapaxes(1, 2).reshape(rows, cols).
        // Two heads of 4 rows: [h0: 0 1 2 3, h1: 4 5 6 7] -> [0 2 1 3, 4 6 5 7].
        let w: Vec<u32> = (0..8).collect();
        let order = gguf_row_order(8, 2).unwrap();
        assert_eq!(reorder_rows(&w, 1, &order), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        // Columns move with their row.
        let w2: Vec<i32> = (0..8).flat_map(|v| [v, -v]).collect();
        let p = reorder_rows(&w2, 2, &gguf_row_order(8, 1).unwrap());
        assert_eq!(&p[..6], &[0, 0, 4, -4, 1, -1]);
    }

    #[test]
    fn shapes_that_do_not_split_into_even_heads_have_no_order() {
        assert!(gguf_row_order(6, 4).is_none());
        assert!(hf_row_order(6, 0).is_none());
        assert!(hf_row_order(12, 4).is_none()); // 3 rows per head
        assert!(gguf_row_order(0, 1).is_none());
    }

    proptest! {
        #[test]
        fn the_two_orders_are_inverse_permutations(n_head in 1usize..9, half in 1usize..17) {
            let rows = n_head * half * 2;
            let to_gguf = gguf_row_order(rows, n_head).unwrap();
            let to_hf = hf_row_order(rows, n_head).unwrap();
            let mut sorted = to_gguf.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..rows).collect::<Vec<_>>());
            // HF -> GGUF -> HF and back are identities.
            let round: Vec<usize> = to_hf.iter().map(|&r| to_gguf[r]).collect();
            prop_assert_eq!(round, (0..rows).collect::<Vec<_>>());
            let round: Vec<usize> = to_gguf.iter().map(|&r| to_hf[r]).collect();
            prop_assert_eq!(round, (0..rows).collect::<Vec<_>>());
        }
    }
}
