//! The reference the engine's outputs are compared against: the model's forward pass over
//! its contiguous KV cache and the sampler, one token at a time, with nothing of the engine
//! (no scheduler, block pool, batching or output processing). Generation runs through EOS
//! (the tests that use it set `ignore_eos`).

use pagoda_engine::{Sampler, SamplingParams};
use pagoda_model::arch::{Logits, LoraWeights, Model};

/// The first `max_tokens` tokens `sampling` picks after `prompt`.
pub fn decode(
    model: &Model,
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
    adapter: Option<&LoraWeights>,
) -> Vec<u32> {
    decode_with_kv(
        model,
        prompt,
        sampling,
        max_tokens,
        adapter,
        pagoda_model::KvDtype::F16,
    )
}

/// [`decode`] with the K/V cache in `kv_dtype` (an FP8 engine's answer alone).
pub fn decode_with_kv(
    model: &Model,
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
    adapter: Option<&LoraWeights>,
    kv_dtype: pagoda_model::KvDtype,
) -> Vec<u32> {
    let mut cache = model
        .try_new_cache(prompt.len() + max_tokens + 1, kv_dtype)
        .expect("a cache on the model's device");
    let mut logits = model
        .forward_adapted(prompt, 0, &mut cache, Logits::Last, adapter)
        .expect("prompt runs");
    let mut sampler = Sampler::new(sampling);
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let token = sampler
            .try_sample(&mut logits, prompt, &out)
            .expect("finite logits")
            .token;
        out.push(token);
        if out.len() == max_tokens {
            break;
        }
        logits = model
            .forward_adapted(&[token], cache.len(), &mut cache, Logits::Last, adapter)
            .expect("token runs");
    }
    out
}
