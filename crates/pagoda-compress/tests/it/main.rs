//! Integration tests of pagoda-compress, one binary: online quantization of whole weight
//! sets (error bounds per format, identity for the type a tensor already has, bad input), of
//! the tiny golden Llama (logits against its F32 forward pass), evaluation against
//! references we did not write, and pruning (Wanda / SparseGPT against a NumPy reference from
//! the papers; the tiny Llama pruned end to end).

mod common;
mod eval_golden;
mod hf_export_tiny_llama;
mod hf_gguf;
mod merge_lora;
mod offline_tiny_llama;
mod prune_golden;
mod prune_structured;
mod prune_tiny_llama;
mod quantize_bad_input;
mod quantize_bounds;
mod quantize_tiny_llama;
