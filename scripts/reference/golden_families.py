#!/usr/bin/env python3
"""Goldens for the model families of crates/pagoda-model/src/family/: for each family, a tiny
random-weight Hugging Face folder (transformers writes it and computes its logits) and the GGUF
that llama.cpp's own converter (`convert_hf_to_gguf.py` of the vendored llama.cpp, with its
gguf-py) makes of that folder, with llama.cpp's logits and greedy continuations on it.

CI never runs this script: its outputs are committed (tests/golden/tiny-FAMILY/ with
logits.json, and tests/golden/tiny-FAMILY.gguf + tiny-FAMILY.llamacpp.json). The Rust test
crates/pagoda-model/tests/it/families.rs loads both and compares.

    bash scripts/reference/setup.sh
    /root/.venvs/pagoda-ref/bin/python scripts/reference/golden_families.py [FAMILY ...]

Families: qwen3 (QK-norm, head_dim != hidden/heads), smollm3 (every 4th layer without RoPE),
mistral3 (Ministral 3: YaRN with its own attention factor, Llama 4 query temperature),
phi3 (Phi-4-mini-like: fused QKV and gate/up, partial rotary, LongRoPE),
llama31 (the existing tiny-llama folder with Llama 3 RoPE scaling, through llama.cpp's
converter, which carries the scaling as rope_freqs.weight),
gemma4 (Gemma 4 E2B/E4B-like: sliding layers with head_dim 32 and full layers with
global_head_dim 64 and proportional RoPE (a quarter of the dims rotated), per-layer embeddings,
the last 2 layers reusing earlier layers' K/V, double-wide MLPs on those, per-layer
layer_scalar, final logit softcapping, norms that scale by w),
gemma4-keqv (Gemma 4 31B-like: full layers without v_proj, V = the K projection, and their own
K/V head count num_global_key_value_heads; no per-layer embeddings, no K/V sharing),
qwen3moe (Qwen3-30B-A3B-like: Qwen3 attention with QK-norm per head, every layer a sparse MoE
of 8 experts, top-2, softmax then top-k, the chosen weights renormalized: norm_topk_prob),
olmoe (OLMoE-1B-7B-like: QK-norm over the whole q/k projection (one weight of hidden_size, not
per head), 8 experts, top-2, softmax then top-k without renormalizing; multi-head attention
(llama.cpp's olmoe loader wants attn_k_norm of n_embd, so K/V heads = heads) and rms_norm_eps
1e-5 (the converter writes 1e-5 whatever the config says)),
qwen2moe (Qwen1.5-MoE-A2.7B / Qwen2-57B-A14B-like: Qwen2 attention with q/k/v biases, head_dim
16; 3 layers, every one a sparse MoE of 8 experts 32 wide, top-2, softmax then top-k NOT
renormalized (norm_topk_prob false; llama.cpp's qwen2moe graph calls build_moe_ffn with norm_w
false whatever the GGUF says, so it could not represent true), plus a shared expert 48 wide
(shared_expert_intermediate_size; intermediate_size 128 is used by no layer) times
sigmoid(shared_expert_gate x) (llama.cpp: silu(g) / g), the gate weight scaled so the sigmoid
spans ~0..1; logits.json records how far the logits move renormalized, without the shared
expert, ungated and with the gate at 0.5. No dense layer: llama.cpp's qwen2moe requires the MoE
and shared-expert tensors in every layer (QWEN2MOE_DENSE_NOTE); untied output),
gpt-oss (gpt-oss-20b/120b-like: alternating sliding (window 8) / full layers, attention sinks,
biases on q/k/v/o, router and experts, 8 experts top-2 with softmax over the chosen logits,
the clamped SwiGLU (alpha 1.702, limit 7, (up + 1)) on fused interleaved gate/up experts in f32
(the converter splits them into ffn_gate_exps / ffn_up_exps), YaRN factor 32 over 4096 with
truncate false; logits.json records how far the logits move without sinks and without the
clamp; llama.cpp ignores truncate false, so its logits are ~1e-2 from transformers' and
~1e-5 from transformers' with truncate true (YARN_TRUNCATE_NOTE)),
gpt-oss-mxfp4 (gpt-oss as released: the experts in MXFP4 as openai/gpt-oss-20b stores them,
`mlp.experts.{gate_up,down}_proj_{blocks,scales}` (uint8; scripts/reference/mxfp4.py has the
format) and `quantization_config` {quant_method: mxfp4}; the other tensors f32 as in every tiny
folder (the released files keep them in bf16). The expert weights are quantized once when the
model is made (decisive routing is checked on the quantized model) and transformers loads the
folder with Mxfp4Config(dequantize=True); expert width 96 (3 blocks per row of down_proj, 2 of
gate_up_proj); 2 layers (sliding, full) to keep the files small. llama.cpp's converter repacks the blocks into GGML MXFP4 (type 39) without
dequantizing; ggml-cpu multiplies MXFP4 by activations it quantizes to Q8_0 (Q8_ACTIVATION_NOTE)).
Also `mxfp4-blocks`: tests/golden/mxfp4_blocks.json (mxfp4.py's `blocks_golden`).
Hybrid families (recurrent layers beside attention; HYBRID_KINDS):
qwen35 (Qwen3.5 dense, Qwen3_5ForCausalLM, llama.cpp arch qwen35: 3 gated DeltaNet layers, then
a gated full-attention layer; DeltaNet with 2 key heads / 4 value heads (grouped: the converter
reorders value heads to ggml's tiled order), head dims 16, causal conv kernel 4, decays spread
so the state is carried across chunks; attention with per-head output gate, QK-norm, partial
interleaved MRoPE; (1 + w) norms; the released Qwen3.5 tokenizer's added tokens and the
Qwen3.5-4B chat template), qwen35moe (Qwen3.5-35B-A3B-like: the same with every MLP a MoE of 8
experts top-2, always renormalized, plus a sigmoid-gated shared expert; experts fused as the
released checkpoints store them), lfm2 (LFM2-1.2B-like: its first 6 layers, double-gated short
convolutions of kernel 3 and attention with QK-norm; the derived FFN width; LFM2's specials and
the LFM2.5 instruct template), lfm2moe (LFM2-8B-A1B-like: the lfm2 layer pattern, the first
num_dense_layers 2 with a dense SwiGLU of intermediate_size 96 as written, then MoE layers of 8
experts 32 wide top-2 with bias-corrected sigmoid routing: the experts chosen on sigmoid(W x) +
expert_bias, weighted by the unbiased sigmoids renormalized (norm_topk_prob) times
routed_scaling_factor 1.0 (the converter does not carry another value: LFM2MOE_NOTE); expert_bias
is a buffer saved in model.safetensors as model.layers.N.feed_forward.expert_bias, in the GGUF
blk.N.exp_probs_b.bias (LFM2MOE_GGUF_NOTE), ~N(0, 0.2^2) so that it changes the chosen experts
of ~60% of the (token, layer) routings; logits.json records that fraction and how far the
logits move with the bias ignored, with weights from the biased scores and without
renormalizing; the LFM2-8B-A1B template), granite4h (Granite 4.0-H-micro/-1B-like, arch
granitehybrid: layers mamba, mamba, attention, mamba; every FFN the dense shared MLP
(num_local_experts 0, shared_intermediate_size = intermediate_size 128: llama.cpp sizes it by
the latter); Mamba-2 with 8 heads of 16, n_groups 2, d_state 16, conv kernel 4 with bias,
mamba_chunk_size 32 (the 180 ids cross 5 chunk boundaries in transformers' torch
mamba2_chunk_scan; llama.cpp scans token by token); attention without RoPE
(position_embedding_type nope) scaled by attention_multiplier 0.5; embedding_multiplier 3,
residual_multiplier 0.5, logits_scaling 2 (logits.json records how far the logits move with
each ignored, the code paths that ran, the decays, and that dropping the state at chunk
boundaries moves them); tied embeddings, out-projections scaled (GRANITE4H_OUT_SCALE) so the
layers decide the argmax; config.json keeps the released layer_types names "mamba" /
"attention" (llama.cpp's converter knows no other); Granite 4.0's specials and chat template;
GRANITE4H_GGUF_NOTE, LLAMACPP_MAMBA2_NOTE). Their logits are taken on 180 seeded ids (past the DeltaNet chunk
boundaries at 64 and 128; full rows at HYBRID_LOGIT_POSITIONS, argmax and largest logit at every
position: logits_fields) and a fourth greedy prompt decodes across position 128. logits.json
records how far transformers' one-token-at-a-time decode, its recurrent rule and a float64 run
are from its logits and that dropping the state at chunk boundaries moves them; the llama.cpp
json records the agreement with transformers per chunk and with float64, and that every GGUF
tensor is the folder's transformed as documented (QWEN35_GGUF_NOTE, LFM2_GGUF_NOTE).
MoE routers are scaled so routing is decisive (ROUTER_STD, ROUTER_MIN_GAP): logits.json records
the smallest top-k gap met, and how much the logits move when norm_topk_prob is flipped.
Gemma 4 folders use a Gemma-4-like tokenizer (BPE on raw UTF-8, `▁` for spaces, byte fallback:
what the converter reads with LlamaHfVocab and writes as tokenizer model "gemma4"); their
llama.cpp logits differ from transformers' by ~1e-2 because ggml-cpu's GELU is an f16 lookup
table (GELU_NOTE).

llama.cpp recipe: llama-cpp-python 0.3.36 (setup.sh), F32 weights, F32 K/V cache
(type_k/type_v = GGML_TYPE_F32), no flash attention, one llama_decode over the prompt with
logits for every position. The converter checks a tokenizer's pre-tokenizer by hashing its
output on a fixed text; the tiny folders' byte-level BPE is not in its table, so the family's
real pre-tokenizer name is written instead (the goldens feed token ids, not text).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_goldens as mg  # noqa: E402
import mxfp4  # noqa: E402

ROOT = mg.ROOT
GOLDEN = mg.GOLDEN
SDIST = Path(os.environ.get("PAGODA_LLAMA_SDIST",
                            "/work/cache/sdist/llama_cpp_python-0.3.36")) / "vendor" / "llama.cpp"

# Prompts for greedy continuations: token ids of the tiny vocabulary (320 entries).
PROMPTS = [[5, 77, 120, 33, 250, 9], [300, 12, 12, 47], list(range(40, 58))]
CONTINUE = 12

PRE = {"qwen3": "qwen2", "smollm3": "llama-bpe", "llama31": "llama-bpe", "mistral3": "tekken",
       "phi3": "gpt-2",
       "gemma4": "gemma4", "gemma4-keqv": "gemma4", "qwen3moe": "qwen2", "olmoe": "olmo",
       "gpt-oss": "gpt-4o", "gpt-oss-mxfp4": "gpt-4o",
       "qwen35": "qwen35", "qwen35moe": "qwen35", "lfm2": "lfm2", "qwen2moe": "qwen2",
       "lfm2moe": "lfm2", "granite4h": "dbrx"}

# Extra converter arguments: the tiny Qwen3.5 folders have no multi-token-prediction layers
# (the released checkpoints keep one under mtp.*), and without --no-mtp the converter asserts
# it found some.
CONVERT_ARGS = {"qwen35": ["--no-mtp"], "qwen35moe": ["--no-mtp"]}

# Hybrid kinds (recurrent layers beside attention layers): their logits are taken on a longer
# sequence of HYBRID_LEN token ids (seeded, ids HYBRID_IDS), which passes the DeltaNet chunk
# boundaries at 64 and 128 (transformers' torch_chunk_gated_delta_rule and llama.cpp's unfused
# graph, build_delta_net_chunking, use chunks of DELTANET_CHUNK tokens; llama.cpp on CPU runs
# its fused token-by-token op instead: LLAMACPP_DELTANET_NOTE). Full logits rows are stored at
# HYBRID_LOGIT_POSITIONS only (each side of 64 and 128, the first and last positions); the
# argmax and the largest logit at every position. A fourth greedy prompt, the first
# HYBRID_LONG_PROMPT ids of that sequence, decodes across position 128.
HYBRID_KINDS = ("qwen35", "qwen35moe", "lfm2", "lfm2moe", "granite4h")
# The LFM2 kinds (short convolutions beside attention; LFM2's tokenizer and final norm).
LFM2_KINDS = ("lfm2", "lfm2moe")
DELTANET_CHUNK = 64
HYBRID_LEN = 180
HYBRID_SEED = 4242
HYBRID_IDS = (32, 320)
HYBRID_LONG_PROMPT = 120
HYBRID_LOGIT_POSITIONS = [0, 1, 2, 3, 31, 62, 63, 64, 65, 66, 100, 126, 127, 128, 129, 130, 150,
                          177, 178, 179]
HYBRID_LOGITS_NOTE = (
    "token_ids has HYBRID_LEN ids; logits_at_positions[i] is the full logits row at position "
    "logit_positions[i]; argmax[p] and max_logit[p] are given for every position p; "
    "argmax_margin_min is the smallest gap between the largest and second largest logit over "
    "all positions (an engine's argmax can only differ where its logits differ by more)"
)

# Qwen3.5's added tokens in their real order (ids 248044.. in the released 248320-entry
# vocabulary; here ids 0..25): <|endoftext|> pads, <|im_end|> ends a turn.
QWEN35_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                   "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                   "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                   "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                   "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                   "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                   "<think>", "</think>"]

# LFM2's first 14 ids as in LiquidAI's vocabulary (<|pad|> 0, <|startoftext|> 1 = BOS,
# <|im_end|> 7 = EOS of the instruct models).
LFM2_SPECIALS = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>",
                 "<|fim_suf|>", "<|im_start|>", "<|im_end|>", "<|tool_list_start|>",
                 "<|tool_list_end|>", "<|tool_call_start|>", "<|tool_call_end|>",
                 "<|tool_response_start|>", "<|tool_response_end|>"]

# Granite 4.0's added tokens in the order of their real ids where known (<|pad|> 100256,
# <|end_of_text|> 100257 = BOS = EOS, not prepended; the fim / file tokens 100258..100263,
# <|start_of_role|> 100264, <|end_of_role|> 100265, <|tool_call|> 100266, cite tokens; <|unk|>
# 100269): here ids 0..13. The Granite 4.0 tokenizer is cl100k-like (llama.cpp pre-tokenizer
# "dbrx", the Llama 3 split: LFM2_SPLIT).
GRANITE4_SPECIALS = ["<|pad|>", "<|end_of_text|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                     "<|fim_pad|>", "<|filename|>", "<|reponame|>", "<|start_of_role|>",
                     "<|end_of_role|>", "<|tool_call|>", "<|start_of_cite|>", "<|end_of_cite|>",
                     "<|unk|>"]

# Granite 4.0-H: the out-projections of every layer (Mamba-2 out_proj, attention o_proj, the
# shared MLP's output_linear) are scaled by this on top of randomize_weights, so that with the
# tied embedding (std TIED_EMBED_STD, times embedding_multiplier) the layers, not the token's own
# embedding, decide the argmax (unscaled, greedy mostly repeats the input token).
GRANITE4H_OUT_SCALE = 3.0

# The pre-tokenizer splits (before byte-level BPE) that llama.cpp applies for tokenizer.ggml.pre
# "qwen35" (Qwen3.5's tokenizer.json: letters with their combining marks, single digits) and
# "lfm2" (the Llama 3 split: digits in runs of up to 3).
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LFM2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3.5's DeltaNet decay: per value head A = exp(A_log) log-spaced over [DECAY_A_MIN,
# DECAY_A_MAX], so the per-token state decay exp(-A * softplus(a + dt_bias)) spans ~0.999
# (state carried across chunks) to ~0.3 (the released init, A ~ U(0.01, 16), forgets almost
# at once with random projections).
DECAY_A_MIN = 0.002
DECAY_A_MAX = 1.0

# Hybrid kinds: std of a tied token embedding (hybrid_weights), and the smallest gap between the
# largest and second largest logit that the golden ids and greedy decisions must show (the seed
# is bumped otherwise; decision_margin), so that float noise cannot flip an argmax.
TIED_EMBED_STD = 0.25
ARGMAX_MIN_MARGIN = 1e-3

# Mixture-of-experts kinds: routers scaled so router logits have std ~ROUTER_STD, and every
# token of the golden sequences must separate its k-th and (k+1)-th router logit by more than
# ROUTER_MIN_GAP in every layer (else the seed is bumped), so float noise between engines
# cannot flip an expert choice.
MOE_KINDS = ("qwen3moe", "olmoe", "gpt-oss", "gpt-oss-mxfp4", "qwen35moe", "qwen2moe", "lfm2moe")
ROUTER_STD = 3.0
ROUTER_MIN_GAP = 1e-3

# LFM2-MoE chooses experts on sigmoid(router logits) + expert_bias (values in (0, 1) plus the
# bias, not logits): its routers are scaled to std LFM2MOE_ROUTER_STD (sigmoids spread, not
# saturated), expert_bias ~ N(0, LFM2MOE_BIAS_STD^2) per layer (large enough to change the chosen
# experts of many tokens), and the k-th and (k+1)-th biased scores must differ by more than
# LFM2MOE_MIN_GAP (float32 noise in a score is below ~1e-6: the sigmoid's slope is at most 1/4).
LFM2MOE_ROUTER_STD = 1.0
LFM2MOE_BIAS_STD = 0.2
LFM2MOE_MIN_GAP = 2e-5

# gpt-oss (o200k_harmony) specials, in the order of their real ids (199998 <|startoftext|>,
# 199999 <|endoftext|>, 200002 <|return|>, 200003 <|constrain|>, 200005 <|channel|>,
# 200006 <|start|>, 200007 <|end|>, 200008 <|message|>, 200012 <|call|>): here ids 0..8.
GPT_OSS_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                    "<|start|>", "<|end|>", "<|message|>", "<|call|>"]

# The harmony conversation format in small (openai/gpt-oss-*'s template also renders the
# system preamble, developer instructions, tools and the analysis channel).
GPT_OSS_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{% else %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)

# gpt-oss: scale of the fused gate/up expert weights (on top of 1/sqrt(fan_in)), so that some
# gate/up values pass the SwiGLU clamp (swiglu_limit 7) on the golden tokens, and the std of the
# attention sinks (N(0, SINK_STD^2)), so that the sinks move the logits.
GPT_OSS_GATE_UP_SCALE = 3.0
SINK_STD = 1.0

# Gemma's special ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3) and Gemma 4's turn markers.
GEMMA4_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]

# Gemma 4's conversation format in small (google/gemma-4-*-it's template also handles a system
# turn, tools and thinking; the goldens need only a template that renders).
GEMMA4_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\\n' + message['content'] | trim + '<turn|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}"
)


def gemma4_tokenizer(vocab_size: int):
    """A Gemma-4-like tokenizer: BPE on raw UTF-8 with spaces as `▁`, split only into runs of
    newlines and runs of anything else, byte fallback to the 256 `<0xNN>` tokens (the layout
    that llama.cpp's converter reads with `LlamaHfVocab` and writes as tokenizer model
    "gemma4"). Ids: the specials first (<pad> 0, <eos> 1, <bos> 2, ...), then the byte tokens,
    then the trained pieces (deterministic: a fixed corpus)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    def shell(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("[^\\n]+|[\\n]+"), behavior="isolated")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
        return tok

    n_bytes = 256
    trained = shell(models.BPE(byte_fallback=True))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_bytes, min_frequency=2,
                                  special_tokens=GEMMA4_SPECIALS, limit_alphabet=30,
                                  show_progress=False)
    trained.train_from_iterator(mg.TINY_CORPUS.splitlines(keepends=True), trainer=trainer)
    spec = json.loads(trained.to_str())
    pieces = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    n_special = len(GEMMA4_SPECIALS)
    assert [p for p, _ in pieces[:n_special]] == GEMMA4_SPECIALS
    order = ([p for p, _ in pieces[:n_special]] + [f"<0x{b:02X}>" for b in range(n_bytes)]
             + [p for p, _ in pieces[n_special:]])
    assert len(order) == len(set(order)) == vocab_size, len(order)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    tok = shell(models.BPE({p: i for i, p in enumerate(order)}, merges, byte_fallback=True))
    tok.add_special_tokens(GEMMA4_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    return tok


def split_bpe_tokenizer(specials: list[str], vocab_size: int, bos: str | None, split: str):
    """A byte-level BPE tokenizer laid out as the Qwen3.5 and LFM2 tokenizer.json files are: a
    regex Split (`split`, isolated) then ByteLevel without its own regex; trained on the fixed
    corpus (deterministic), the specials first. Prepends `bos` when given."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(mg.TINY_CORPUS.splitlines(keepends=True), trainer=trainer)
    assert [tok.token_to_id(t) for t in specials] == list(range(len(specials)))
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def golden_ids(kind: str) -> list[int]:
    """The token ids whose logits the goldens record: the last greedy prompt, or for a hybrid
    kind HYBRID_LEN seeded ids (past two DeltaNet chunk boundaries)."""
    import random

    if kind in HYBRID_KINDS:
        return random.Random(HYBRID_SEED).choices(range(*HYBRID_IDS), k=HYBRID_LEN)
    return prompts_of(kind)[-1]


def logits_fields(kind: str, logits) -> dict:
    """The logits entries of a golden json: every row, or for a hybrid kind the rows at
    HYBRID_LOGIT_POSITIONS with the argmax and largest logit of every position."""
    import numpy as np

    if kind not in HYBRID_KINDS:
        return {"logits": [mg.f32_list(row) for row in logits],
                "argmax": [int(i) for i in logits.argmax(-1)]}
    assert logits.shape[0] == HYBRID_LEN, logits.shape
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return {
        "logits_note": HYBRID_LOGITS_NOTE,
        "logit_positions": HYBRID_LOGIT_POSITIONS,
        "logits_at_positions": [mg.f32_list(logits[p]) for p in HYBRID_LOGIT_POSITIONS],
        "argmax": [int(i) for i in logits.argmax(-1)],
        "max_logit": mg.f32_list(logits.max(-1)),
        "argmax_margin_min": float((top2[:, 1] - top2[:, 0]).min()),
    }


def hybrid_weights(model, kind: str, seed: int):
    """A hybrid kind's weights on top of randomize_weights: Qwen3.5's (qwen35_weights), and a
    tied token embedding at std TIED_EMBED_STD (at std 1 the residual stream is mostly the
    token's own embedding, which the tied output matrix then predicts: greedy repeats it)."""
    import torch

    if kind == "granite4h":
        granite4h_weights(model, seed)
    elif kind not in LFM2_KINDS:
        qwen35_weights(model, seed)
    if model.config.tie_word_embeddings:
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(TIED_EMBED_STD)


def qwen35_weights(model, seed: int):
    """Qwen3.5 weights on top of randomize_weights (which puts every norm's w around 1): the
    norms that scale by (1 + w) get w ~ N(0, 0.2^2), the same scales as the other kinds; the
    gated norm of the linear attention (scales by w) keeps w ~ 1 + N(0, 0.2^2). Per DeltaNet
    layer, A_log gives the value heads decays log-spaced over [DECAY_A_MIN, DECAY_A_MAX] in a
    seeded order, dt_bias ~ N(0, 0.5^2)."""
    import math
    import torch

    g = torch.Generator().manual_seed(seed + 300)
    with torch.no_grad():
        for module in model.modules():
            name = type(module).__name__
            if name in ("Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm"):
                module.weight.sub_(1.0)
            elif name.endswith("GatedDeltaNet"):
                n = module.num_v_heads
                a = torch.logspace(math.log10(DECAY_A_MIN), math.log10(DECAY_A_MAX), n)
                module.A_log.copy_(a[torch.randperm(n, generator=g)].log())
                module.dt_bias.copy_(0.5 * torch.randn(n, generator=g))


def granite4h_weights(model, seed: int):
    """Granite 4.0-H weights on top of randomize_weights: per Mamba-2 layer, A_log gives the
    heads decays log-spaced over [DECAY_A_MIN, DECAY_A_MAX] in a seeded order (per token
    exp(-A * softplus(dt + dt_bias)): ~0.999 carries the state across chunks), dt_bias ~ N(0,
    0.5^2), D ~ 1 + N(0, 0.2^2); the out-projections times GRANITE4H_OUT_SCALE."""
    import math
    import torch

    g = torch.Generator().manual_seed(seed + 500)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.mamba is not None:
                m = layer.mamba
                n = m.num_heads
                a = torch.logspace(math.log10(DECAY_A_MIN), math.log10(DECAY_A_MAX), n)
                m.A_log.copy_(a[torch.randperm(n, generator=g)].log())
                m.dt_bias.copy_(0.5 * torch.randn(n, generator=g))
                m.D.copy_(1.0 + 0.2 * torch.randn(n, generator=g))
                m.out_proj.weight.mul_(GRANITE4H_OUT_SCALE)
            else:
                layer.self_attn.o_proj.weight.mul_(GRANITE4H_OUT_SCALE)
            layer.shared_mlp.output_linear.weight.mul_(GRANITE4H_OUT_SCALE)


def write_fused_experts(folder: Path, model):
    """Rewrites `folder`'s model.safetensors with each layer's experts fused as the released
    Qwen3.5 MoE checkpoints store them (`mlp.experts.gate_up_proj` [E, 2 * ffn, hidden], gate
    rows first, and `mlp.experts.down_proj` [E, hidden, ffn], no `.weight` suffix), where
    save_pretrained splits them into per-expert gate_proj / up_proj / down_proj tensors."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        written = set(f.keys())
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    fused = {k for k in state if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))}
    split = {k for k in written if ".mlp.experts." in k}
    assert fused and split and written - split == set(state) - fused, (written ^ set(state))
    path.unlink()
    save_file(state, str(path), metadata={"format": "pt"})


def tiny_folder(kind: str) -> Path:
    import numpy as np
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = 320
    common = dict(vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, max_position_embeddings=256, rms_norm_eps=1e-6)
    if kind == "qwen3":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        bos, eos, pad, template = None, "<|im_end|>", "<|endoftext|>", mg.CHATML_TEMPLATE
        cfg = transformers.Qwen3Config(
            **common, num_hidden_layers=2, head_dim=32,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True, use_sliding_window=False, attention_bias=False,
            bos_token_id=None, eos_token_id=2, pad_token_id=0, hidden_act="silu",
        )
        legacy = {"rope_theta": 1000000.0, "rope_scaling": None}
        cls, seed = transformers.Qwen3ForCausalLM, 11
    elif kind == "smollm3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
        bos, eos, pad, template = None, "<|im_end|>", "<|end_of_text|>", mg.CHATML_TEMPLATE
        cfg = transformers.SmolLM3Config(
            **common, num_hidden_layers=4, no_rope_layer_interval=4,
            rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
            tie_word_embeddings=False, use_sliding_window=False, attention_bias=False, mlp_bias=False,
            bos_token_id=None, eos_token_id=3, pad_token_id=1, hidden_act="silu",
        )
        legacy = {"rope_theta": 2000000.0, "rope_scaling": None}
        cls, seed = transformers.SmolLM3ForCausalLM, 12
    elif kind == "mistral3":
        # YaRN with mscale == mscale_all_dim (attention factor 1) and Llama 4's query
        # temperature from position 16 on (the prompts reach position 30). transformers warns
        # that factor * original context (64) is not max_position_embeddings (256, long enough
        # for the engine's batching tests); it uses the explicit factor, as llama.cpp does.
        specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
        bos, eos, pad, template = "<s>", "</s>", "<unk>", mg.LLAMA_TEMPLATE
        rope = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
        cfg = transformers.Ministral3Config(
            **common, num_hidden_layers=2, head_dim=16, rope_parameters=rope,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            hidden_act="silu",
        )
        legacy = {}
        cls, seed = transformers.Ministral3ForCausalLM, 13
    elif kind == "phi3":
        # Phi-4-mini's shape in small: partial rotary (3/4 of a head), LongRoPE with an
        # original context of 16, so every golden prompt (longer than 16 tokens: transformers
        # switches to the long factors by sequence length, llama.cpp by its context size)
        # runs with the long factors in both references.
        # llama.cpp's vocabulary loader looks up <unk>, <s> and </s> in models named "phi3".
        specials = ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"]
        bos, eos, pad, template = None, "<|end|>", "<|endoftext|>", mg.CHATML_TEMPLATE
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "original_max_position_embeddings": 16,
                "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0],
                "short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.5]}
        cfg = transformers.Phi3Config(
            **common, num_hidden_layers=2, rope_parameters=rope, partial_rotary_factor=0.75,
            original_max_position_embeddings=16, sliding_window=None, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=6, pad_token_id=3, hidden_act="silu",
        )
        legacy = {}
        cls, seed = transformers.Phi3ForCausalLM, 14
    elif kind in ("gemma4", "gemma4-keqv"):
        specials = GEMMA4_SPECIALS
        bos, eos, pad, template = "<bos>", "<eos>", "<pad>", GEMMA4_TEMPLATE
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}}
        S, F = "sliding_attention", "full_attention"
        if kind == "gemma4":
            # E2B/E4B in small: per-layer embeddings (PLE), the last 2 layers reuse the K/V of
            # the last earlier layer of their type (4 <- 2, 5 <- 3), and those 2 layers' MLPs
            # are twice as wide (use_double_wide_mlp). transformers takes each type's last
            # earlier layer; llama.cpp hard-codes the 2 layers before the first shared one
            # (the one just before full, the one before that sliding, as in E2B and E4B), so
            # the layout keeps both readings the same. Every role is present: layer 0 sliding
            # and 1 full own their K/V, 2 and 3 produce the shared K/V, 4 and 5 reuse it.
            shape = dict(num_key_value_heads=2, num_hidden_layers=6, layer_types=[S, F, S, F, S, F],
                         hidden_size_per_layer_input=16, vocab_size_per_layer_input=vocab,
                         num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=False)
            global_kv = None
            seed = 15
        else:
            # 31B in small: full layers have no v_proj (V is the K projection, before k_norm:
            # V gets v_norm only) and their own K/V head count; no PLE, no KV sharing.
            shape = dict(num_key_value_heads=2, num_hidden_layers=5, layer_types=[S, S, F, S, F],
                         hidden_size_per_layer_input=0, vocab_size_per_layer_input=vocab,
                         num_kv_shared_layers=0, use_double_wide_mlp=False, attention_k_eq_v=True,
                         num_global_key_value_heads=1)
            global_kv = 1
            seed = 16
        cfg = transformers.Gemma4TextConfig(
            **{**common, **shape}, head_dim=32, global_head_dim=64, sliding_window=8,
            rope_parameters=rope, final_logit_softcapping=30.0,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
            bos_token_id=2, eos_token_id=1, pad_token_id=0,
        )
        # Hub checkpoints carry these two keys (transformers 5.25 folds them into
        # per_layer_config, which it also writes): both are written, consistent.
        legacy = {"global_head_dim": 64, "num_global_key_value_heads": global_kv}
        cls = transformers.Gemma4ForCausalLM
    elif kind == "qwen3moe":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        bos, eos, pad, template = None, "<|im_end|>", "<|endoftext|>", mg.CHATML_TEMPLATE
        cfg = transformers.Qwen3MoeConfig(
            **common, num_hidden_layers=3, head_dim=32,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
            use_sliding_window=False, attention_bias=False,
            bos_token_id=None, eos_token_id=2, pad_token_id=0, hidden_act="silu",
        )
        legacy = {"rope_theta": 1000000.0, "rope_scaling": None}
        cls, seed = transformers.Qwen3MoeForCausalLM, 17
    elif kind == "olmoe":
        # OLMoE-1B-7B's tokenizer specials (GPT-NeoX: <|endoftext|> ends, <|padding|> pads).
        specials = ["<|endoftext|>", "<|padding|>", "<|im_start|>", "<|im_end|>"]
        bos, eos, pad, template = None, "<|endoftext|>", "<|padding|>", mg.CHATML_TEMPLATE
        cfg = transformers.OlmoeConfig(
            # OlmoeConfig has no moe_intermediate_size: intermediate_size is each expert's width.
            **{**common, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "intermediate_size": 32},
            num_hidden_layers=3,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None,
            tie_word_embeddings=False, attention_bias=False,
            bos_token_id=None, eos_token_id=0, pad_token_id=1, hidden_act="silu",
        )
        legacy = {"rope_theta": 10000.0, "rope_scaling": None}
        cls, seed = transformers.OlmoeForCausalLM, 18
    elif kind in ("gpt-oss", "gpt-oss-mxfp4"):
        # gpt-oss-20b/120b in small: alternating sliding (window 8) / full attention layers
        # (layer 0 sliding), attention sinks (one learned logit per head), biases on q/k/v/o,
        # the router and the experts, 8 experts top-2 with softmax over the top-k logits, the
        # clamped SwiGLU (alpha 1.702, limit 7) with (up + 1), fused interleaved gate/up experts,
        # YaRN as in the real config (factor 32 over 4096, beta 32/1, truncate false), head_dim
        # 32 so that heads * head_dim (128) != hidden (64) as in the real models (64 * 64 vs
        # 2880). max_position_embeddings 256 (real: 131072 = 32 * 4096; transformers warns, and
        # uses the explicit factor, as llama.cpp does). MXFP4: experts 96 wide (3 blocks of 32 per
        # row of down_proj, 2 per row of gate_up_proj; no expert matrix square, so a transposed
        # read shows in the shapes) and 2 layers (one sliding, one full), to keep the files small.
        mx = kind == "gpt-oss-mxfp4"
        n_layers = 2 if mx else 4
        specials = GPT_OSS_SPECIALS
        bos, eos, pad, template = "<|startoftext|>", "<|return|>", "<|endoftext|>", GPT_OSS_TEMPLATE
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}
        cfg = transformers.GptOssConfig(
            **{**common, "intermediate_size": 96 if mx else 32, "rms_norm_eps": 1e-5},
            num_hidden_layers=n_layers, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"] * (n_layers // 2),
            rope_parameters=rope,
            attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=2, pad_token_id=1, hidden_act="silu",
        )
        cfg._experts_implementation = "eager"
        legacy = {}
        cls, seed = transformers.GptOssForCausalLM, 20 if mx else 19
    elif kind in ("qwen35", "qwen35moe"):
        # Qwen3.5 in small (the text model, Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM): 3 gated
        # DeltaNet layers then 1 gated full-attention layer (full_attention_interval 4), as
        # every Qwen3.5. Linear attention: 2 key heads and 4 value heads (the real 16 / 32),
        # key and value head dims equal (16; real 128: llama.cpp requires them equal), conv
        # kernel 4. Full attention: head_dim 32 with heads * head_dim (256) != hidden (64), as
        # the 4B's 16 * 256 vs 2560; q_proj twice as wide (query and output gate per head),
        # QK-norm, partial rotary 0.25 (8 of 32 dims) as interleaved MRoPE with mrope_section
        # [2, 1, 1] (real [11, 11, 10]: sums to rotary_dim / 2). Dense: 8 heads / 2 K/V heads
        # (the 4B/9B's 4:1), embeddings tied (as the smaller models). MoE: 8 heads / 1 K/V head (the
        # 35B-A3B's 16 / 2), 8 experts top-2 (softmax, top-k, always renormalized), a shared
        # expert behind a sigmoid gate, experts fused [E, 2 * ffn, hidden] as the released
        # checkpoints store them, embeddings untied. Norms are (1 + w) except the gated norm.
        moe = kind == "qwen35moe"
        specials = QWEN35_SPECIALS
        bos, eos, pad = None, "<|im_end|>", "<|endoftext|>"
        template = (SDIST / "models" / "templates" / "Qwen3.5-4B.jinja").read_text()
        rope = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                "mrope_interleaved": True, "mrope_section": [2, 1, 1]}
        L, F = "linear_attention", "full_attention"
        shape = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=4, layer_types=[L, L, L, F],
                     num_attention_heads=8, num_key_value_heads=1 if moe else 2, head_dim=32,
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=16, linear_conv_kernel_dim=4,
                     max_position_embeddings=256, rms_norm_eps=1e-6, rope_parameters=rope,
                     attention_bias=False, hidden_act="silu", tie_word_embeddings=not moe,
                     bos_token_id=None, eos_token_id=2, pad_token_id=0)
        if moe:
            cfg = transformers.Qwen3_5MoeTextConfig(
                **shape, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=16)
            cfg._experts_implementation = "eager"
            cls, seed = transformers.Qwen3_5MoeForCausalLM, 22
        else:
            cfg = transformers.Qwen3_5TextConfig(**shape, intermediate_size=128)
            cls, seed = transformers.Qwen3_5ForCausalLM, 21
        legacy = {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "full_attention_interval": 4}
    elif kind == "qwen2moe":
        # Qwen1.5-MoE-A2.7B / Qwen2-57B-A14B in small: Qwen2 attention (biases on q/k/v, none on
        # o; head_dim = hidden / heads = 16), every layer a sparse MoE of 8 experts 32 wide, top-2,
        # softmax then top-k WITHOUT renormalizing (norm_topk_prob false, as the released configs;
        # llama.cpp's qwen2moe graph never renormalizes: build_moe_ffn(norm_w = false)), plus a
        # shared expert 48 wide (shared_expert_intermediate_size, not the experts' 32 nor
        # intermediate_size 128, which no layer uses) times sigmoid(shared_expert_gate x). No dense
        # layer: llama.cpp's qwen2moe loader wants ffn_gate_inp / *_exps / *_shexp in every layer
        # (QWEN2MOE_DENSE_NOTE).
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        bos, eos, pad, template = None, "<|im_end|>", "<|endoftext|>", mg.CHATML_TEMPLATE
        cfg = transformers.Qwen2MoeConfig(
            **common, num_hidden_layers=3,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, norm_topk_prob=False, decoder_sparse_step=1,
            mlp_only_layers=[], qkv_bias=True, tie_word_embeddings=False, use_sliding_window=False,
            bos_token_id=None, eos_token_id=2, pad_token_id=0, hidden_act="silu",
        )
        legacy = {"rope_theta": 1000000.0, "rope_scaling": None}
        cls, seed = transformers.Qwen2MoeForCausalLM, 24
    elif kind == "lfm2":
        # LFM2 (LiquidAI/LFM2-1.2B / LFM2.5-1.2B) in small: its first 6 layers (conv, conv,
        # attention, conv, conv, attention), double-gated short convolutions of kernel 3
        # (conv_L_cache), attention with QK-norm, 4 heads / 2 K/V heads, head_dim 16, RMSNorm
        # eps 1e-5, the final norm named embedding_norm, embeddings tied. The FFN width is
        # derived as the real config does (block_auto_adjust_ff_dim): intermediate_size 136 ->
        # int(2 * 136 / 3) = 90 -> rounded up to block_multiple_of 32 -> 96.
        specials = LFM2_SPECIALS
        bos, eos, pad = "<|startoftext|>", "<|im_end|>", "<|pad|>"
        template = (SDIST / "models" / "templates" / "LFM2.5-Instruct.jinja").read_text()
        C, F = "conv", "full_attention"
        cfg = transformers.Lfm2Config(
            vocab_size=vocab, hidden_size=64, intermediate_size=136, num_hidden_layers=6,
            layer_types=[C, C, F, C, C, F], full_attn_idxs=[2, 5], num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            conv_L_cache=3, conv_bias=False, block_auto_adjust_ff_dim=True,
            block_ffn_dim_multiplier=1.0, block_multiple_of=32, tie_word_embeddings=True,
            bos_token_id=1, eos_token_id=7, pad_token_id=0,
        )
        # LiquidAI's config.json keys: block_ff_dim (= intermediate_size), tie_embedding,
        # rope_theta.
        legacy = {"rope_theta": 1000000.0, "block_ff_dim": 136, "tie_embedding": True}
        cls, seed = transformers.Lfm2ForCausalLM, 23
    elif kind == "lfm2moe":
        # LFM2-8B-A1B in small: the lfm2 layer pattern (conv, conv, attention, conv, conv,
        # attention: the real model's first 6), the first num_dense_layers 2 with a dense SwiGLU
        # of intermediate_size 96 (as written: LFM2-MoE has no block_auto_adjust_ff_dim), the
        # others a MoE of 8 experts 32 wide, top-2, chosen on sigmoid(router logits) +
        # expert_bias, weighted by the unbiased sigmoids renormalized (norm_topk_prob) times
        # routed_scaling_factor 1.0 (llama.cpp's converter does not write it: LFM2MOE_NOTE).
        # Attention as lfm2 (QK-norm, 4 heads / 2 K/V heads, head_dim 16), norm eps 1e-5,
        # embeddings tied, LFM2's specials, the LFM2-8B-A1B template.
        specials = LFM2_SPECIALS
        bos, eos, pad = "<|startoftext|>", "<|im_end|>", "<|pad|>"
        template = (SDIST / "models" / "templates" / "LFM2-8B-A1B.jinja").read_text()
        C, F = "conv", "full_attention"
        cfg = transformers.Lfm2MoeConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=6, layer_types=[C, C, F, C, C, F], num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            conv_L_cache=3, conv_bias=False, num_dense_layers=2, num_experts=8,
            num_experts_per_tok=2, use_expert_bias=True, routed_scaling_factor=1.0,
            norm_topk_prob=True, tie_word_embeddings=True,
            bos_token_id=1, eos_token_id=7, pad_token_id=0,
        )
        cfg._experts_implementation = "eager"
        legacy = {"rope_theta": 1000000.0, "tie_embedding": True}
        cls, seed = transformers.Lfm2MoeForCausalLM, 25
    elif kind == "granite4h":
        # Granite 4.0-H-micro / -1B in small (the dense hybrids: num_local_experts 0, every layer's
        # FFN the shared MLP, shared_intermediate_size 128 = intermediate_size as in the released
        # configs: llama.cpp sizes the dense FFN by feed_forward_length = intermediate_size,
        # GRANITE4H_NOTE): layers mamba, mamba, attention, mamba; Mamba-2 with 8 heads of 16
        # (d_inner = expand 2 * hidden 64 = 128; llama.cpp supports expand 2 only), n_groups 2,
        # d_state 16, conv kernel 4 with bias, chunk size 32 (the 180 golden ids cross 5 chunk
        # boundaries); attention 4 heads / 2 K/V heads of 16 without RoPE
        # (position_embedding_type "nope", as the H models), scaled by attention_multiplier 0.5
        # (not 1/sqrt(16)); embedding_multiplier 3, residual_multiplier 0.5, logits_scaling 2
        # (all != 1: logits.json records how far the logits move when each is ignored); RMSNorm
        # eps 1e-5; embeddings tied. config.json keeps layer_types as the released configs
        # write them ("mamba" / "attention"): llama.cpp's converter finds attention layers by
        # the name "attention" only (transformers 5 would write "full_attention" /
        # "linear_attention", which the converter reads as all-Mamba).
        specials = GRANITE4_SPECIALS
        bos, eos, pad = "<|end_of_text|>", "<|end_of_text|>", "<|pad|>"
        template = (SDIST / "models" / "templates" / "ibm-granite-granite-4.0.jinja").read_text()
        M, A = "mamba", "attention"
        layer_types = [M, M, A, M]
        cfg = transformers.GraniteMoeHybridConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, shared_intermediate_size=128,
            num_hidden_layers=4, layer_types=layer_types, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
            position_embedding_type="nope",
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attention_bias=False,
            embedding_multiplier=3.0, attention_multiplier=0.5, residual_multiplier=0.5,
            logits_scaling=2.0, num_local_experts=0, num_experts_per_tok=0,
            mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_head=16, mamba_d_conv=4,
            mamba_expand=2, mamba_chunk_size=32, mamba_conv_bias=True, mamba_proj_bias=False,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=1, pad_token_id=0,
            hidden_act="silu",
        )
        legacy = {"rope_theta": 10000.0, "layer_types": layer_types}
        cls, seed = transformers.GraniteMoeHybridForCausalLM, 26
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager"
    gemma4 = kind.startswith("gemma4")
    gpt_oss = kind.startswith("gpt-oss")
    # gpt-oss's tokenizer names <|startoftext|> but does not prepend it.
    if gemma4:
        tok = gemma4_tokenizer(vocab)
    elif kind in HYBRID_KINDS:
        # Granite names <|end_of_text|> BOS but does not prepend it.
        tok = split_bpe_tokenizer(specials, vocab, None if kind == "granite4h" else bos,
                                  QWEN35_SPLIT if kind.startswith("qwen35") else LFM2_SPLIT)
    else:
        tok = mg.build_tokenizer(specials, vocab, None if gpt_oss else bos)
    assert tok.get_vocab_size() == vocab or not gemma4, tok.get_vocab_size()
    if kind in MOE_KINDS:
        # Routing decisive on the long logits sequence too.
        routed = prompts_of(kind) + ([golden_ids(kind)] if kind in HYBRID_KINDS else [])
        model, seed, min_gap = decisive_moe(cls, cfg, seed, routed,
                                            mxfp4_experts=kind == "gpt-oss-mxfp4", kind=kind)
    elif kind in HYBRID_KINDS:
        model, seed = decisive_hybrid(cls, cfg, kind, seed)
    else:
        model = cls(cfg).eval()
        # Gemma 4's RMSNorm scales by w (not 1 + w): norms are randomized around 1 as for the
        # others.
        mg.randomize_weights(model, seed=seed, gemma=False)
    if gemma4:
        # layer_scalar is a buffer (default 1.0) that scales the whole residual stream at the end
        # of each layer: varied values, so a loader that drops it fails the goldens.
        # The token embedding (tied to the output, scaled by sqrt(hidden) on input) at std 0.25:
        # at std 1 the residual stream is the token's own embedding and greedy repeats it.
        g = torch.Generator().manual_seed(seed + 100)
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(0.25)
            for layer in model.model.layers:
                layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
    model = model.to(torch.float32)

    folder = GOLDEN / f"tiny-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*"):
        old.unlink()
    model.save_pretrained(folder, safe_serialization=True)
    extra_specials = {}
    if kind.startswith("gemma4"):
        extra_specials = dict(unk_token="<unk>", extra_special_tokens=GEMMA4_SPECIALS[4:])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   pad_token=pad, model_max_length=256, **extra_specials)
    fast.chat_template = template
    fast.save_pretrained(folder)
    mg.legacy_config_keys(folder, legacy, template)
    if kind == "phi3":
        # Phi-4-mini's tokenizer class: llama.cpp's converter then reads tokenizer.json as
        # GPT-2 BPE (else it wants a SentencePiece tokenizer.model).
        tc_path = folder / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        tc["tokenizer_class"] = "GPT2Tokenizer"
        tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    for extra in ("generation_config.json", "special_tokens_map.json"):
        if (folder / extra).exists():
            (folder / extra).unlink()
    mx_doc = write_mxfp4_experts(folder, model) if kind == "gpt-oss-mxfp4" else None
    if kind == "qwen35moe":
        write_fused_experts(folder, model)

    load_kw = load_kwargs(kind)
    model2, info = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32,
                                       output_loading_info=True, **load_kw)
    model2 = model2.eval()
    if mx_doc is not None or kind in HYBRID_KINDS:
        # Every tensor of the folder read, none left to its initializer.
        assert not any(info.values()), f"transformers did not read the folder as written: {info}"
    prompts = prompts_of(kind)
    ids = golden_ids(kind)
    with torch.no_grad():
        logits = model2(torch.tensor([ids])).logits[0].float().numpy()
        logits_mem = model(torch.tensor([ids])).logits[0].float().numpy()
    assert np.allclose(logits, logits_mem, atol=1e-5), "reload changed the model"
    if mx_doc is not None:
        mx_doc.update(mxfp4_reload_checks(folder, model, model2, ids, logits, logits_mem))
    assert logits.shape == (len(ids), vocab)
    assert float(logits.std()) > 0.5, "logits too flat"
    greedy = []
    for p in prompts:
        with torch.no_grad():
            out = model2.generate(torch.tensor([p]), max_new_tokens=CONTINUE, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
        greedy.append([int(t) for t in out[0][len(p):]])
    moe = {}
    if gpt_oss:
        moe = gpt_oss_checks(model2, ids, logits, greedy, prompts, min_gap, seed)
    elif kind == "qwen35moe":
        moe = qwen35moe_checks(model2, ids, logits, min_gap, seed)
    elif kind == "qwen2moe":
        moe = qwen2moe_checks(model2, ids, logits, min_gap, seed)
    elif kind == "lfm2moe":
        moe = lfm2moe_checks(model2, ids, logits, min_gap, seed)
    elif kind in MOE_KINDS:
        # Same tokens, routing weights renormalized or not: the goldens tell the two apart.
        routers = [router_of(layer) for layer in model2.model.layers]
        for r in routers:
            r.norm_topk_prob = not r.norm_topk_prob
        with torch.no_grad():
            flipped = model2(torch.tensor([ids])).logits[0].float().numpy()
        for r in routers:
            r.norm_topk_prob = not r.norm_topk_prob
        flip_diff = float(np.abs(flipped - logits).max())
        assert flip_diff > 0.1, f"norm_topk_prob barely matters ({flip_diff})"
        print(f"{kind}: norm_topk_prob={cfg.norm_topk_prob}; flipping it moves logits by {flip_diff:.3f}")
        moe = {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
               "norm_topk_prob": cfg.norm_topk_prob,
               "norm_topk_prob_flipped_max_abs_diff": flip_diff,
               "router_min_topk_gap": min_gap, "weights_seed": seed,
               "router_note": "router logits of every token of greedy_prompts + greedy, every "
                              "layer: the k-th and (k+1)-th differ by at least router_min_topk_gap"}
    if mx_doc is not None:
        # What an engine that multiplies the MXFP4 experts as ggml-cpu does (Q8_0 activations)
        # computes on this folder (YaRN as the folder says: truncate false).
        q8_0_expert_activations(model2)
        q8_logits = logits_of(model2, ids)
        q8_diff = float(np.abs(q8_logits - logits).max())
        print(f"gpt-oss-mxfp4: Q8_0 expert activations move the logits by {q8_diff:.3f}")
        mx_doc["q8_0_expert_activations"] = {
            "note": "transformers on this folder with the inputs of both expert matmuls quantized "
                    "to Q8_0 and back as ggml-cpu does for MXFP4 weights (golden_families.py "
                    "q8_0_expert_activations; the llama.cpp golden agrees with it to ~1e-5 once "
                    "YaRN is truncated as llama.cpp does); not a reference we did not write",
            "logits": [mg.f32_list(row) for row in q8_logits],
            "greedy": greedy_of(model2, prompts),
            "max_abs_diff_vs_logits": q8_diff,
        }
    mg.write_json(folder / "logits.json", {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention",
        "model_class": cls.__name__,
        "token_ids": ids,
        "vocab_size": vocab,
        **logits_fields(kind, logits),
        "greedy_prompts": prompts,
        "greedy": greedy,
        **({"layer_types": cfg.layer_types, "sliding_window": cfg.sliding_window,
            "kv_sharing_modes": cfg.kv_sharing_modes,
            "layer_scalar": [float(layer.layer_scalar) for layer in model2.model.layers],
            "sliding_window_semantics": "query i attends key j iff 0 <= i - j < sliding_window (itself included)"}
           if kind.startswith("gemma4") else {}),
        **moe,
        **({"mxfp4": mx_doc} if mx_doc is not None else {}),
        **(hybrid_checks(model2, kind, ids, logits, seed) if kind in HYBRID_KINDS else {}),
    })
    print(f"wrote {folder.relative_to(ROOT)}")
    return folder


# What the float64 figures are (hybrid kinds).
FLOAT64_NOTE = (
    "float64_*: against the same transformers model run in float64 throughout (golden_families.py "
    "float64_logits: a float64 copy whose modeling module's float32 casts are made float64, RoPE "
    "frequencies recomputed in float64; its prefill and its one-token-at-a-time decode agree to "
    "float64_prefill_vs_stepwise_max_abs_diff), the exact answer to float32 noise: how far a float32 "
    "reference is from it is the noise an engine's float32 logits may also carry"
)

# How transformers computes the hybrid layers on CPU (recorded in logits.json).
HYBRID_KERNEL_NOTE = (
    "flash-linear-attention (fla) and causal-conv1d are not installed: transformers falls back to "
    "its PyTorch paths (it says so in its log): torch_chunk_gated_delta_rule (chunks of 64, a "
    "triangular solve per chunk, the state carried between chunks) for a prompt, "
    "torch_recurrent_gated_delta_rule for one-token decode steps, F.conv1d for the causal "
    "depthwise convolutions (causal_conv1d_fn / causal_conv1d_update), all in float32"
)


GRANITE4H_KERNEL_NOTE = (
    "mamba-ssm and causal-conv1d are not installed: transformers runs its PyTorch paths of "
    "GraniteMoeHybridMambaLayer (checked by counting calls): causal_conv1d_fn (F.conv1d) and "
    "mamba2_chunk_scan (the chunked SSD scan, chunks of mamba_chunk_size, the state carried "
    "between chunks) for a prompt, causal_conv1d_update and mamba2_selective_state_update (the "
    "recurrence) for one-token decode steps, all in float32"
)


LFM2_KERNEL_NOTE = (
    "causal-conv1d is not installed: transformers computes the short convolutions with F.conv1d "
    "(causal_conv1d_fn for a prompt, causal_conv1d_update for one-token decode steps), in float32"
)


def decode_stepwise(model, ids: list[int]):
    """`model`'s logits for `ids` fed one token at a time through its cache."""
    import numpy as np
    import torch

    rows, cache = [], None
    with torch.no_grad():
        for t in ids:
            out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = out.cache
            rows.append(out.logits[0, -1].float().numpy())
    return np.stack(rows)


class _Float64Torch:
    """`torch` as a modeling module sees it inside float64_logits: float32 (and float) mean
    float64, so the module's explicit float32 casts keep float64."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return self._torch.float64 if name in ("float32", "float") else getattr(self._torch, name)


def float64_logits(model, ids: list[int], stepwise: bool = False):
    """`model`'s logits for `ids` computed in float64 throughout: a float64 copy, its modeling
    module's float32 casts (the DeltaNet rules, the norms, the attention softmax) and
    Tensor.float() made float64 while it runs, RoPE inverse frequencies recomputed in float64.
    With `stepwise` one token at a time through the cache (a check that nothing is left in
    float32: prefill and stepwise then agree to ~1e-12)."""
    import copy
    import sys

    import numpy as np
    import torch

    m64 = copy.deepcopy(model).double()
    mods = {sys.modules[type(x).__module__] for x in m64.modules()
            if type(x).__module__.startswith("transformers.models.")}
    saved_float = torch.Tensor.float
    try:
        for mod in mods:
            mod.torch = _Float64Torch(torch)
        torch.Tensor.float = lambda self, *a, **k: self.double()
        for x in m64.modules():
            if hasattr(x, "compute_default_rope_parameters") and hasattr(x, "inv_freq"):
                assert x.rope_type == "default", x.rope_type
                x.inv_freq = type(x).compute_default_rope_parameters(x.config)[0]
                assert x.inv_freq.dtype == torch.float64
        if stepwise:
            out = decode_stepwise(m64, ids)
        else:
            with torch.no_grad():
                out = m64(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    finally:
        torch.Tensor.float = saved_float
        for mod in mods:
            mod.torch = torch
    assert out.dtype == np.float64, out.dtype
    return out


def hybrid_checks(model, kind: str, ids: list[int], logits, seed: int) -> dict:
    """What logits.json records for a hybrid kind: the layer types, which transformers code
    paths ran, how far a one-token-at-a-time decode through the cache is from the prefill, and
    for Qwen3.5 the DeltaNet facts: the decay and beta the golden tokens meet, how far
    transformers' own recurrent rule is from its chunked one, and how much the logits move
    when the state is not carried across chunk boundaries (so the goldens test that)."""
    import importlib.util
    import sys

    import numpy as np
    import torch

    assert importlib.util.find_spec("fla") is None and importlib.util.find_spec("causal_conv1d") is None
    assert importlib.util.find_spec("mamba_ssm") is None
    cfg = model.config

    def prefill():
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    assert np.array_equal(prefill(), logits)
    step_diff = float(np.abs(decode_stepwise(model, ids) - logits).max())
    exact = float64_logits(model, ids)
    exact_check = float(np.abs(float64_logits(model, ids, stepwise=True) - exact).max())
    assert exact_check < 1e-9, exact_check
    exact_diff = float(np.abs(logits - exact).max())
    margin = decision_margin(model, kind)
    assert margin > ARGMAX_MIN_MARGIN, margin
    doc = {"layer_types": cfg.layer_types,
           **({} if kind in MOE_KINDS else {"weights_seed": seed}),
           "transformers_paths": (LFM2_KERNEL_NOTE if kind in LFM2_KINDS else GRANITE4H_KERNEL_NOTE
                                  if kind == "granite4h" else HYBRID_KERNEL_NOTE),
           "decision_margin_min": margin,
           "decision_margin_note": "smallest gap between the largest and second largest logit over "
                                   "every position of token_ids and every greedy decision (the "
                                   f"weights' seed is bumped until it exceeds {ARGMAX_MIN_MARGIN})",
           "stepwise_decode_max_abs_diff": step_diff,
           "float64_max_abs_diff": exact_diff,
           "float64_note": FLOAT64_NOTE,
           "float64_prefill_vs_stepwise_max_abs_diff": exact_check}
    print(f"{kind}: transformers one token at a time vs prefill {step_diff:.2e}; vs float64 {exact_diff:.2e} "
          f"(float64 prefill vs stepwise {exact_check:.1e})")
    if kind == "lfm2":
        ff = model.model.layers[0].feed_forward.w1.out_features
        assert ff == 96, ff
        doc.update({"feed_forward_width": ff,
                    "feed_forward_width_note": "block_auto_adjust_ff_dim: int(2 * intermediate_size / 3) "
                                               "(90) rounded up to a multiple of block_multiple_of (96)",
                    "conv_kernel": cfg.conv_L_cache})
        return doc
    if kind == "granite4h":
        doc.update(granite4h_checks(model, ids, logits))
        return doc
    if kind == "lfm2moe":
        doc.update({"conv_kernel": cfg.conv_L_cache, "num_dense_layers": cfg.num_dense_layers,
                    "dense_feed_forward_width": cfg.intermediate_size,
                    "dense_feed_forward_width_note": "LFM2-MoE's dense layers are intermediate_size "
                                                     "wide as written (no block_auto_adjust_ff_dim)"})
        return doc

    layers = [layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn")]
    mod = sys.modules[type(layers[0]).__module__]
    chunked = mod.torch_chunk_gated_delta_rule
    seen = []

    def recording(*args, **kwargs):
        seen.append((kwargs["g"].exp()[0], kwargs["beta"][0]))
        return chunked(*args, **kwargs)

    def recurrent(query, key, value, g, beta, chunk_size=64, **kwargs):
        return mod.torch_recurrent_gated_delta_rule(query, key, value, g=g, beta=beta, **kwargs)

    def state_dropped(query, key, value, g, beta, chunk_size=64, initial_state=None, **kwargs):
        outs = []
        for s in range(0, query.shape[1], chunk_size):
            part = slice(s, s + chunk_size)
            out, _ = chunked(query[:, part], key[:, part], value[:, part], g=g[:, part],
                             beta=beta[:, part], chunk_size=chunk_size, initial_state=None, **kwargs)
            outs.append(out)
        return torch.cat(outs, dim=1), None

    moved = {}
    try:
        for label, fn in (("recording", recording), ("recurrent", recurrent), ("dropped", state_dropped)):
            mod.torch_chunk_gated_delta_rule = fn
            moved[label] = np.abs(prefill() - logits).max(axis=-1)
    finally:
        mod.torch_chunk_gated_delta_rule = chunked
    assert moved["recording"].max() == 0.0 and len(seen) == len(layers)
    dropped = moved["dropped"]
    assert dropped[:DELTANET_CHUNK].max() == 0.0 and dropped[DELTANET_CHUNK:].max() > 1.0, dropped
    decay = [[[round(float(v), 4) for v in (d[:, h].min(), d[:, h].mean(), d[:, h].max())]
              for h in range(d.shape[1])] for d, _ in seen]
    print(f"{kind}: chunked vs recurrent rule {moved['recurrent'].max():.2e}; state dropped at chunk "
          f"boundaries moves logits by {dropped.max():.2f}")
    doc.update({
        "deltanet_chunk_size": DELTANET_CHUNK,
        "recurrent_rule_max_abs_diff": float(moved["recurrent"].max()),
        "recurrent_rule_note": "transformers with torch_recurrent_gated_delta_rule (token by token) "
                               "in place of the chunked rule for the whole prompt, against logits",
        "state_dropped_at_chunk_boundaries_max_abs_diff": float(dropped.max()),
        "state_dropped_note": "the chunked rule run on each 64-token chunk from a zero state: the "
                              "logits from position 64 on move by this much (before 64: not at all)",
        "decay_per_token_min_mean_max": decay,
        "decay_note": "exp(g) = exp(-exp(A_log) * softplus(a + dt_bias)) over the golden tokens, "
                      "per linear-attention layer and value head (the folder's head order)",
        "beta_mean": [round(float(b.mean()), 4) for _, b in seen],
    })
    return doc


def granite4h_checks(model, ids: list[int], logits) -> dict:
    """What logits.json records for Granite 4.0-H: the code paths that ran (counted), how far
    the logits move when the Mamba-2 state is dropped at each chunk boundary and when the whole
    prompt is one chunk, the per-token decays met, and how far they move when each Granite
    multiplier is ignored (1; the attention scale 1/sqrt(head_dim))."""
    import math
    import sys

    import numpy as np
    import torch

    cfg = model.config
    layers = model.model.layers
    mamba = [layer.mamba for layer in layers if layer.mamba is not None]
    mod = sys.modules[type(mamba[0]).__module__]
    chunk = cfg.mamba_chunk_size

    def run():
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    names = ("causal_conv1d_fn", "mamba2_chunk_scan", "causal_conv1d_update",
             "mamba2_selective_state_update")
    originals = {n: getattr(mod, n) for n in names}
    calls = dict.fromkeys(names, 0)
    seen_dt = []

    def counting(name):
        def call(*args, **kwargs):
            calls[name] += 1
            if name == "mamba2_chunk_scan":
                dt = args[1] + kwargs["dt_bias"]
                seen_dt.append(torch.nn.functional.softplus(dt)[0])
            return originals[name](*args, **kwargs)
        return call

    def dropped(hidden_states, dt, A, B, C, chunk_size, initial_states=None, **kwargs):
        outs = [originals["mamba2_chunk_scan"](hidden_states[:, a:a + chunk_size], dt[:, a:a + chunk_size],
                                               A, B[:, a:a + chunk_size], C[:, a:a + chunk_size],
                                               chunk_size, initial_states=None, **kwargs)
                for a in range(0, hidden_states.shape[1], chunk_size)]
        return torch.cat(outs, dim=1)

    def one_chunk(hidden_states, dt, A, B, C, chunk_size, **kwargs):
        return originals["mamba2_chunk_scan"](hidden_states, dt, A, B, C, 256, **kwargs)

    moved = {}
    try:
        for n in names:
            setattr(mod, n, counting(n))
        assert np.array_equal(run(), logits)
        prefill_calls = dict(calls)
        decode_stepwise(model, ids[:3])
        for label, fn in (("dropped", dropped), ("one_chunk", one_chunk)):
            mod.mamba2_chunk_scan = fn
            moved[label] = np.abs(run() - logits).max(axis=-1)
    finally:
        for n, f in originals.items():
            setattr(mod, n, f)
    assert prefill_calls["causal_conv1d_fn"] == len(mamba) == prefill_calls["mamba2_chunk_scan"], prefill_calls
    assert prefill_calls["causal_conv1d_update"] == 0 == prefill_calls["mamba2_selective_state_update"]
    assert calls["causal_conv1d_update"] > 0 and calls["mamba2_selective_state_update"] > 0, calls
    assert moved["dropped"][:chunk].max() == 0.0 and moved["dropped"][chunk:].max() > 1.0, moved["dropped"]
    assert moved["one_chunk"].max() < 1e-4, moved["one_chunk"].max()
    decay = []
    for m, dt in zip(mamba, seen_dt):
        d = torch.exp(-torch.exp(m.A_log.detach()) * dt)
        decay.append([[round(float(v), 4) for v in (d[:, h].min(), d[:, h].mean(), d[:, h].max())]
                      for h in range(d.shape[1])])

    # Each multiplier ignored.
    multipliers = {}
    saved = (model.model.embedding_multiplier, [layer.residual_multiplier for layer in layers],
             [layer.self_attn.scaling for layer in layers if layer.self_attn is not None],
             cfg.logits_scaling)
    try:
        model.model.embedding_multiplier = 1.0
        multipliers["embedding_multiplier"] = float(np.abs(run() - logits).max())
        model.model.embedding_multiplier = saved[0]
        for layer in layers:
            layer.residual_multiplier = 1.0
        multipliers["residual_multiplier"] = float(np.abs(run() - logits).max())
        for layer, r in zip(layers, saved[1]):
            layer.residual_multiplier = r
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        for layer in layers:
            if layer.self_attn is not None:
                layer.self_attn.scaling = 1.0 / math.sqrt(head_dim)
        multipliers["attention_multiplier"] = float(np.abs(run() - logits).max())
        for layer, a in zip([la for la in layers if la.self_attn is not None], saved[2]):
            layer.self_attn.scaling = a
        cfg.logits_scaling = 1.0
        multipliers["logits_scaling"] = float(np.abs(run() - logits).max())
    finally:
        model.model.embedding_multiplier = saved[0]
        for layer, r in zip(layers, saved[1]):
            layer.residual_multiplier = r
        for layer, a in zip([la for la in layers if la.self_attn is not None], saved[2]):
            layer.self_attn.scaling = a
        cfg.logits_scaling = saved[3]
    assert np.array_equal(run(), logits)
    assert min(multipliers.values()) > 0.1, multipliers
    echo = float(np.mean(logits.argmax(-1) == np.array(ids)))
    print(f"granite4h: paths {prefill_calls} (prefill), {calls} (with 3 decode steps); state dropped at "
          f"chunk boundaries moves logits by {moved['dropped'].max():.2f}, one chunk by "
          f"{moved['one_chunk'].max():.1e}; ignoring each multiplier moves them by {multipliers}; "
          f"argmax = input token at {echo:.0%} of positions")
    return {
        "mamba_chunk_size": chunk,
        "mamba2_paths_called_in_prefill": prefill_calls,
        "state_dropped_at_chunk_boundaries_max_abs_diff": float(moved["dropped"].max()),
        "state_dropped_note": f"mamba2_chunk_scan run on each {chunk}-token chunk from a zero state: "
                              f"the logits from position {chunk} on move by this much (before: not at all)",
        "one_chunk_max_abs_diff": float(moved["one_chunk"].max()),
        "one_chunk_note": "the whole prompt as one chunk of 256 (no inter-chunk state passing), "
                          "against logits: the chunked scan is exact up to float32 rounding",
        "decay_per_token_min_mean_max": decay,
        "decay_note": "exp(-exp(A_log) * softplus(dt + dt_bias)) over the golden tokens, per Mamba-2 "
                      "layer and head",
        "multiplier_ignored_max_abs_diff": multipliers,
        "multiplier_note": "how far the logits move with each multiplier ignored: embedding_multiplier "
                           "1, residual_multiplier 1, the attention scale 1/sqrt(head_dim) in place of "
                           "attention_multiplier, logits_scaling 1",
        "argmax_equals_input_fraction": echo,
        "out_projection_scale": GRANITE4H_OUT_SCALE,
        "attention_rope": "none: position_embedding_type nope (llama.cpp: granitehybrid.rope.scaling."
                          "finetuned false switches RoPE off)",
    }


def qwen35moe_checks(model, ids: list[int], logits, min_gap: float, seed: int) -> dict:
    """What logits.json records for the Qwen3.5 MoE: routing facts, and how far the logits move
    when the top-k weights are not renormalized, when the shared expert's sigmoid gate is 0.5
    (gate weight 0) and without the shared expert."""
    import types

    import numpy as np
    import torch
    import torch.nn.functional as F

    layers = model.model.layers
    cfg = model.config

    def run():
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    def softmax_topk(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight)
        probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        return router_logits, top.to(router_logits.dtype), index

    for layer in layers:
        layer.mlp.gate.forward = types.MethodType(softmax_topk, layer.mlp.gate)
    not_renormalized = run()
    for layer in layers:
        del layer.mlp.gate.forward
    diffs = {"renorm": float(np.abs(not_renormalized - logits).max())}
    for label, param in (("gate", lambda mlp: mlp.shared_expert_gate.weight),
                         ("shared", lambda mlp: mlp.shared_expert.down_proj.weight)):
        saved = [param(layer.mlp).detach().clone() for layer in layers]
        with torch.no_grad():
            for layer in layers:
                param(layer.mlp).zero_()
        diffs[label] = float(np.abs(run() - logits).max())
        with torch.no_grad():
            for layer, s in zip(layers, saved):
                param(layer.mlp).copy_(s)
    assert np.array_equal(run(), logits)
    assert min(diffs.values()) > 0.1, diffs
    print(f"qwen35moe: logits move by {diffs['renorm']:.3f} without renormalizing, "
          f"{diffs['gate']:.3f} with the shared gate at 0.5, {diffs['shared']:.3f} without the shared expert")
    return {
        "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
        "routing": "router logits = W x; softmax over all experts; top-k; the k weights divided by "
                   "their sum (always: Qwen3.5 has no norm_topk_prob switch); plus the shared "
                   "expert times sigmoid(shared_expert_gate x)",
        "not_renormalized_max_abs_diff": diffs["renorm"],
        "shared_gate_half_max_abs_diff": diffs["gate"],
        "shared_expert_removed_max_abs_diff": diffs["shared"],
        "router_min_topk_gap": min_gap, "weights_seed": seed,
        "router_note": "router logits of every token of greedy_prompts + greedy and of token_ids + "
                       "its greedy continuation, every layer: the k-th and (k+1)-th differ by at "
                       "least router_min_topk_gap",
        "experts_layout": "model.layers.N.mlp.experts.gate_up_proj [experts, 2 * moe_intermediate_size, "
                          "hidden] (gate rows, then up rows) and mlp.experts.down_proj [experts, hidden, "
                          "moe_intermediate_size], as Qwen/Qwen3.5-35B-A3B stores them",
    }


# Qwen2-MoE: the shared expert's gate weight is scaled by this on top of randomize_weights, so
# that sigmoid(shared_expert_gate x) spans most of (0, 1) over the golden tokens (a gate read as
# a plain factor, or dropped, then shows clearly).
QWEN2MOE_SHARED_GATE_SCALE = 2.0

# Why the tiny Qwen2-MoE has no dense layer.
QWEN2MOE_DENSE_NOTE = (
    "transformers' Qwen2-MoE can make layers dense (mlp_only_layers, decoder_sparse_step); "
    "llama.cpp's qwen2moe loader (src/models/qwen2moe.cpp) creates ffn_gate_inp, ffn_{gate,up,down}"
    "_exps and the ffn_*_shexp tensors for every layer (required) and its graph runs every layer "
    "as MoE + shared expert, so a GGUF of a folder with a dense layer does not load: every layer "
    "here is sparse (mlp_only_layers [], decoder_sparse_step 1), as in the released Qwen1.5-MoE "
    "and Qwen2-57B-A14B"
)


def qwen2moe_weights(model, seed: int):
    """Qwen2-MoE weights on top of randomize_weights: the shared expert gate times
    QWEN2MOE_SHARED_GATE_SCALE."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.shared_expert_gate.weight.mul_(QWEN2MOE_SHARED_GATE_SCALE)


def qwen2moe_checks(model, ids: list[int], logits, min_gap: float, seed: int) -> dict:
    """What logits.json records for Qwen2-MoE: routing facts, the shared expert's gate values
    over the golden tokens, and how far the logits move when the top-k weights are
    renormalized, without the shared expert, with the shared expert ungated (factor 1 in place
    of the sigmoid) and with its gate at 0.5 (gate weight 0)."""
    import types

    import numpy as np
    import torch

    layers = model.model.layers
    cfg = model.config

    def run():
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    def moe_forward(shared_factor):
        def forward(self, hidden_states):
            b, s, d = hidden_states.shape
            flat = hidden_states.view(-1, d)
            _, weights, chosen = self.gate(flat)
            out = self.experts(flat, chosen, weights)
            if shared_factor is not None:
                out = out + shared_factor(self, flat) * self.shared_expert(flat)
            return out.reshape(b, s, d)
        return forward

    gates = []
    hooks = [layer.mlp.shared_expert_gate.register_forward_hook(
        lambda _m, _i, out: gates.append(torch.sigmoid(out.detach()))) for layer in layers]
    try:
        assert np.array_equal(run(), logits)
    finally:
        for h in hooks:
            h.remove()
    variants = {"ungated": lambda self, x: 1.0,
                "half": lambda self, x: 0.5,
                "removed": None}
    diffs = {}
    for label, factor in variants.items():
        for layer in layers:
            layer.mlp.forward = types.MethodType(moe_forward(factor), layer.mlp)
        try:
            diffs[label] = float(np.abs(run() - logits).max())
        finally:
            for layer in layers:
                del layer.mlp.forward
    # The same forward with the real gate reproduces the logits (the variants differ only there).
    for layer in layers:
        layer.mlp.forward = types.MethodType(
            moe_forward(lambda self, x: torch.sigmoid(self.shared_expert_gate(x))), layer.mlp)
    try:
        assert np.allclose(run(), logits, atol=1e-6)
    finally:
        for layer in layers:
            del layer.mlp.forward
    routers = [layer.mlp.gate for layer in layers]
    for r in routers:
        r.norm_topk_prob = not r.norm_topk_prob
    try:
        diffs["renorm"] = float(np.abs(run() - logits).max())
    finally:
        for r in routers:
            r.norm_topk_prob = not r.norm_topk_prob
    assert np.array_equal(run(), logits)
    assert min(diffs.values()) > 0.1, diffs
    step_diff = float(np.abs(decode_stepwise(model, ids) - logits).max())
    assert step_diff < 1e-4, step_diff
    gate_range = [[round(float(g.min()), 4), round(float(g.mean()), 4), round(float(g.max()), 4)]
                  for g in gates]
    print(f"qwen2moe: logits move by {diffs['renorm']:.3f} renormalized, {diffs['removed']:.3f} without "
          f"the shared expert, {diffs['ungated']:.3f} with it ungated, {diffs['half']:.3f} with its gate "
          f"at 0.5; sigmoid gate min/mean/max per layer {gate_range}")
    return {
        "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
        "norm_topk_prob": cfg.norm_topk_prob,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
        "routing": "router logits = W x (mlp.gate.weight); softmax over all experts; top-k; the k "
                   "probabilities used as they are (norm_topk_prob false: not renormalized); plus "
                   "the shared expert (SwiGLU of width shared_expert_intermediate_size) times "
                   "sigmoid(shared_expert_gate x), a scalar per token",
        "norm_topk_prob_flipped_max_abs_diff": diffs["renorm"],
        "shared_expert_removed_max_abs_diff": diffs["removed"],
        "shared_expert_ungated_max_abs_diff": diffs["ungated"],
        "shared_gate_half_max_abs_diff": diffs["half"],
        "shared_gate_sigmoid_min_mean_max": gate_range,
        "shared_gate_note": "sigmoid(shared_expert_gate x) over token_ids per layer; shared_expert_"
                            "ungated: the shared expert added with factor 1 in place of the sigmoid",
        "dense_layers_note": QWEN2MOE_DENSE_NOTE,
        "stepwise_decode_max_abs_diff": step_diff,
        "stepwise_decode_note": "transformers fed token_ids one token at a time through its cache, "
                                "against logits",
        "router_min_topk_gap": min_gap, "weights_seed": seed,
        "router_note": "router logits of every token of greedy_prompts + greedy, every "
                       "layer: the k-th and (k+1)-th differ by at least router_min_topk_gap",
    }


# What llama.cpp computes for LFM2-MoE's routing (recorded in the llama.cpp json).
LFM2MOE_NOTE = (
    "llama.cpp's lfm2moe graph (src/models/lfm2.cpp, build_moe_feed_forward) calls build_moe_ffn "
    "(src/llama-graph.cpp) with exp_probs_b = blk.N.exp_probs_b.bias, norm_w = true, w_scale = "
    "hparams.expert_weights_scale (never read for lfm2moe: 0, no scaling) and gating sigmoid: "
    "probs = sigmoid(W x); selection_probs = probs + exp_probs_b; top-k by argsort of "
    "selection_probs; weights = the unbiased probs of the chosen experts, divided by their sum "
    "(clamped below at 6.1e-5; transformers adds 1e-6 to the sum instead). That is transformers' "
    "Lfm2MoeTopKRouter with routed_scaling_factor 1; a folder with another routed_scaling_factor "
    "would convert to a GGUF that drops it"
)


def lfm2moe_weights(model, seed: int):
    """LFM2-MoE weights on top of randomize_weights: each MoE layer's expert_bias (a buffer,
    zero at init) ~ N(0, LFM2MOE_BIAS_STD^2)."""
    import torch

    g = torch.Generator().manual_seed(seed + 400)
    with torch.no_grad():
        for layer in moe_layers(model):
            bias = layer.feed_forward.expert_bias
            bias.copy_(LFM2MOE_BIAS_STD * torch.randn(bias.shape, generator=g))


def lfm2moe_checks(model, ids: list[int], logits, min_gap: float, seed: int) -> dict:
    """What logits.json records for LFM2-MoE: the expert biases, how many (token, layer)
    routings of token_ids the bias changes, and how far the logits move when the bias is
    ignored, when the weights are taken from the biased scores, and when the top-k weights are
    not renormalized."""
    import types

    import numpy as np
    import torch
    import torch.nn.functional as F

    layers = moe_layers(model)
    cfg = model.config
    k = cfg.num_experts_per_tok

    def run():
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    seen = []
    hooks = [router_of(layer).register_forward_hook(lambda _m, _i, out: seen.append(out[0].detach()))
             for layer in layers]
    try:
        assert np.array_equal(run(), logits)
    finally:
        for h in hooks:
            h.remove()
    changed_per_layer = []
    for layer, router_logits in zip(layers, seen):
        probs = router_logits.sigmoid()
        biased = torch.topk(probs + layer.feed_forward.expert_bias, k, dim=-1).indices.sort(-1).values
        plain = torch.topk(probs, k, dim=-1).indices.sort(-1).values
        changed_per_layer.append(int((biased != plain).any(-1).sum()))
    fraction = sum(changed_per_layer) / (len(layers) * len(ids))

    def biased_weights(self, hidden_states, expert_bias=None):
        router_logits = F.linear(hidden_states, self.weight)
        scores = router_logits.sigmoid() + expert_bias
        weights, chosen = torch.topk(scores, k=self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        return router_logits, weights * self.routed_scaling_factor, chosen

    diffs = {}
    saved = [layer.feed_forward.expert_bias.clone() for layer in layers]
    with torch.no_grad():
        for layer in layers:
            layer.feed_forward.expert_bias.zero_()
    try:
        diffs["no_bias"] = float(np.abs(run() - logits).max())
    finally:
        with torch.no_grad():
            for layer, b in zip(layers, saved):
                layer.feed_forward.expert_bias.copy_(b)
    for layer in layers:
        router_of(layer).forward = types.MethodType(biased_weights, router_of(layer))
    try:
        diffs["biased_weights"] = float(np.abs(run() - logits).max())
    finally:
        for layer in layers:
            del router_of(layer).forward
    for layer in layers:
        router_of(layer).norm_topk_prob = not router_of(layer).norm_topk_prob
    try:
        diffs["renorm"] = float(np.abs(run() - logits).max())
    finally:
        for layer in layers:
            router_of(layer).norm_topk_prob = not router_of(layer).norm_topk_prob
    assert np.array_equal(run(), logits)
    assert fraction > 0.2 and min(diffs.values()) > 0.1, (fraction, diffs)
    print(f"lfm2moe: the expert bias changes {fraction:.1%} of the routings {changed_per_layer}; logits "
          f"move by {diffs['no_bias']:.3f} without it, {diffs['biased_weights']:.3f} with weights from the "
          f"biased scores, {diffs['renorm']:.3f} without renormalizing")
    return {
        "num_experts": cfg.num_experts, "num_experts_per_tok": k,
        "num_dense_layers": cfg.num_dense_layers, "moe_intermediate_size": cfg.moe_intermediate_size,
        "norm_topk_prob": cfg.norm_topk_prob, "routed_scaling_factor": cfg.routed_scaling_factor,
        "use_expert_bias": cfg.use_expert_bias,
        "routing": "p = sigmoid(W x) (feed_forward.gate.weight, no bias); the k experts with the largest "
                   "p + expert_bias are chosen; their weights are their p (without the bias) divided "
                   "by the sum of the k (norm_topk_prob; transformers adds 1e-6 to the sum) times "
                   "routed_scaling_factor",
        "expert_bias": [[float(v) for v in layer.feed_forward.expert_bias] for layer in layers],
        "expert_bias_note": "per MoE layer (layers num_dense_layers..), model.layers.N.feed_forward."
                            "expert_bias (a float32 buffer, saved in model.safetensors)",
        "bias_changed_routings_fraction": fraction,
        "bias_changed_routings_per_layer": changed_per_layer,
        "bias_changed_note": "(token, layer) pairs of token_ids whose chosen expert set with the bias "
                             "differs from the set without it (top-k of p alone), over "
                             f"{len(layers)} MoE layers x {len(ids)} tokens",
        "bias_ignored_max_abs_diff": diffs["no_bias"],
        "weights_from_biased_scores_max_abs_diff": diffs["biased_weights"],
        "norm_topk_prob_flipped_max_abs_diff": diffs["renorm"],
        "router_min_topk_gap": min_gap, "weights_seed": seed,
        "router_note": "the scores experts are chosen on, sigmoid(router logits) + expert_bias, of every "
                       "token of greedy_prompts + greedy and of token_ids + its greedy continuation, "
                       "every MoE layer: the k-th and (k+1)-th differ by at least router_min_topk_gap "
                       f"(> {LFM2MOE_MIN_GAP})",
    }


def router_of(layer):
    """The router (the module whose first output is the router logits) of a MoE layer; None
    for an LFM2-MoE dense layer."""
    if hasattr(layer, "feed_forward"):
        return getattr(layer.feed_forward, "gate", None)
    return layer.mlp.router if hasattr(layer.mlp, "router") else layer.mlp.gate


def moe_layers(model) -> list:
    """The layers of `model` that route (all, except LFM2-MoE's leading dense layers)."""
    return [layer for layer in model.model.layers if router_of(layer) is not None]


def gpt_oss_weights(model, seed: int):
    """gpt-oss weights on top of randomize_weights: experts at their real fan-in (the HF
    layout is transposed, [experts, in, out], which randomize_weights reads as fan-in = out),
    the fused gate/up GPT_OSS_GATE_UP_SCALE larger so that the SwiGLU clamp bites, and the
    attention sinks N(0, SINK_STD^2). Biases keep randomize_weights' N(0, 0.2^2)."""
    import math
    import torch

    g = torch.Generator().manual_seed(seed + 200)
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            n_exp, hidden, two_ff = ex.gate_up_proj.shape
            ex.gate_up_proj.copy_(GPT_OSS_GATE_UP_SCALE * torch.randn(ex.gate_up_proj.shape, generator=g)
                                  / math.sqrt(hidden))
            ex.down_proj.copy_(torch.randn(ex.down_proj.shape, generator=g) / math.sqrt(two_ff // 2))
            layer.self_attn.sinks.copy_(SINK_STD * torch.randn(layer.self_attn.sinks.shape, generator=g))


def gpt_oss_checks(model, ids: list[int], logits, greedy, prompts, min_gap: float, seed: int) -> dict:
    """What logits.json records for gpt-oss: that the sinks and the SwiGLU clamp matter (how
    far the logits move without them) and how often the clamp bites, plus the routing facts."""
    import numpy as np
    import torch

    layers = model.model.layers
    cfg = model.config

    def run():
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().numpy()

    # Clamp statistics over the golden tokens (the experts each token chose, every layer).
    seen = []
    originals = []
    for layer in layers:
        ex = layer.mlp.experts
        orig = ex._apply_gate
        originals.append(orig)

        def rec(gate_up, _orig=orig):
            seen.append(gate_up.detach().clone())
            return _orig(gate_up)
        ex._apply_gate = rec
    assert np.allclose(run(), logits, atol=1e-6)
    for layer, orig in zip(layers, originals):
        layer.mlp.experts._apply_gate = orig
    gu = torch.cat([t.reshape(-1, t.shape[-1]) for t in seen])
    gate, up = gu[:, ::2], gu[:, 1::2]
    limit = cfg.swiglu_limit
    n_gate_clamped = int((gate > limit).sum())
    n_up_clamped = int((up.abs() > limit).sum())
    assert n_gate_clamped > 0 and n_up_clamped > 0, (n_gate_clamped, n_up_clamped)

    # Without the clamp (limit +inf).
    for layer in layers:
        layer.mlp.experts.limit = float("inf")
    unclamped = run()
    for layer in layers:
        layer.mlp.experts.limit = limit
    # Sinks at 0 (still one extra exp(0) in each softmax denominator), and no sinks (-inf).
    saved = [layer.self_attn.sinks.detach().clone() for layer in layers]
    diffs = {}
    for label, value in (("zero", 0.0), ("none", float("-inf"))):
        with torch.no_grad():
            for layer in layers:
                layer.self_attn.sinks.fill_(value)
        diffs[label] = float(np.abs(run() - logits).max())
    with torch.no_grad():
        for layer, s in zip(layers, saved):
            layer.self_attn.sinks.copy_(s)
    assert np.allclose(run(), logits, atol=1e-6)
    clamp_diff = float(np.abs(unclamped - logits).max())
    assert clamp_diff > 0.1 and diffs["zero"] > 0.1 and diffs["none"] > 0.1, (clamp_diff, diffs)
    print(f"gpt-oss: clamp bites on {n_gate_clamped} gate / {n_up_clamped} up values of "
          f"{gate.numel()}; logits move by {clamp_diff:.3f} without it, by {diffs['zero']:.3f} "
          f"with sinks 0, by {diffs['none']:.3f} without sinks")
    return {
        "num_experts": cfg.num_local_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
        "routing": "router logits = W x + b; top-k of the logits; softmax over the k chosen logits",
        "router_min_topk_gap": min_gap, "weights_seed": seed,
        "router_note": "router logits of every token of greedy_prompts + greedy, every "
                       "layer: the k-th and (k+1)-th differ by at least router_min_topk_gap",
        "layer_types": cfg.layer_types, "sliding_window": cfg.sliding_window,
        "sliding_window_semantics": "query i attends key j iff 0 <= i - j < sliding_window (itself included)",
        "sinks": [[float(v) for v in layer.self_attn.sinks.detach()] for layer in layers],
        "swiglu": {"alpha": cfg.swiglu_alpha, "limit": limit,
                   "formula": "gate = min(gate, limit); up = clamp(up, -limit, limit); "
                              "out = gate * sigmoid(alpha * gate) * (up + 1); gate/up interleaved "
                              "in gate_up_proj's last dim (gate = [..., 0::2], up = [..., 1::2])",
                   "gate_values_above_limit": n_gate_clamped,
                   "up_values_beyond_limit": n_up_clamped,
                   "values_per_kind": int(gate.numel()),
                   "unclamped_max_abs_diff": clamp_diff},
        "sinks_zero_max_abs_diff": diffs["zero"],
        "sinks_removed_max_abs_diff": diffs["none"],
    }


# openai/gpt-oss-20b's and -120b's quantization_config: everything but the experts stays float.
GPT_OSS_MXFP4_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}
EXPERT_PROJS = ("gate_up_proj", "down_proj")


def load_kwargs(kind: str) -> dict:
    """from_pretrained's extra arguments for `kind`'s folder: gpt-oss's experts through the
    eager loop; MXFP4 experts dequantized on load (into the f32 parameters: exact; without
    dequantize transformers would want its Triton kernels from the Hub)."""
    if kind in ("qwen35moe", "lfm2moe"):
        return {"experts_implementation": "eager"}
    if not kind.startswith("gpt-oss"):
        return {}
    kw = {"experts_implementation": "eager"}
    if kind == "gpt-oss-mxfp4":
        from transformers import Mxfp4Config

        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    return kw


def mxfp4_round_trip(model):
    """Each gpt-oss expert weight replaced by its MXFP4 quantization, dequantized: blocks of 32
    along the input dimension, as the HF files store them (gate_up_proj [E, hidden, 2 * ffn]
    and down_proj [E, ffn, hidden] are x @ W, so rows of the transposes)."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            for proj in EXPERT_PROJS:
                p = getattr(layer.mlp.experts, proj)
                blocks, scales = mxfp4.quantize(p.detach().numpy().transpose(0, 2, 1))
                p.copy_(torch.from_numpy(mxfp4.dequantize(blocks, scales).transpose(0, 2, 1).copy()))


def write_mxfp4_experts(folder: Path, model) -> dict:
    """Rewrites `folder`'s model.safetensors with the experts as openai/gpt-oss-20b stores
    them (`*_blocks` uint8 [E, rows, in / 32, 16], `*_scales` uint8 [E, rows, in / 32], rows
    = 2 * ffn gate/up interleaved or hidden; biases as they were) and adds its
    quantization_config to config.json. The weights must already be MXFP4 values
    (`mxfp4_round_trip`). Returns what logits.json records about them."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    codes = np.zeros(16, dtype=np.int64)
    scales_seen = []
    shapes = {}
    for i, layer in enumerate(model.model.layers):
        for proj in EXPERT_PROJS:
            name = f"model.layers.{i}.mlp.experts.{proj}"
            rows = state.pop(name).numpy().transpose(0, 2, 1)  # [E, out, in]
            blocks, scales = mxfp4.quantize(rows)
            assert np.array_equal(mxfp4.dequantize(blocks, scales), rows), f"{name} is not MXFP4"
            mxfp4.check_against_references(rows, blocks, scales)
            state[f"{name}_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
            state[f"{name}_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
            codes += np.bincount(mxfp4.codes_of(blocks).ravel(), minlength=16)
            scales_seen.append(scales.ravel())
            if i == 0:
                shapes[f"{proj}_blocks"] = list(blocks.shape)
                shapes[f"{proj}_scales"] = list(scales.shape)
    (folder / "model.safetensors").unlink()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"] = GPT_OSS_MXFP4_CONFIG
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    scales_all = np.concatenate(scales_seen)
    assert codes[8] == 0 and (codes[np.arange(16) != 8] > 0).all(), codes
    print(f"gpt-oss-mxfp4: codes {codes.tolist()}, scale bytes {scales_all.min()}..{scales_all.max()}")
    return {
        "format": "model.layers.N.mlp.experts.{gate_up,down}_proj_{blocks,scales} as in "
                  "openai/gpt-oss-20b: blocks uint8 [experts, rows, in / 32, 16], scales uint8 "
                  "[experts, rows, in / 32]; gate_up rows are 2 * intermediate_size (gate even, up "
                  "odd), in = hidden_size; down rows are hidden_size, in = intermediate_size. Byte i "
                  "of a block: element 2i in the low nibble, 2i + 1 in the high nibble; value = "
                  "E2M1[code] * 2^(scale - 127). transformers dequantizes [E, rows, in] and "
                  "transposes to its [E, in, rows] parameter",
        "shapes_layer0": shapes,
        "quantizer": "scripts/reference/mxfp4.py quantize (= gguf-py's MXFP4 quantization, checked "
                     "on every expert tensor): scale = floor(log2(amax)) - 2 + 127, nearest code",
        "code_counts": codes.tolist(),
        "scale_byte_range": [int(scales_all.min()), int(scales_all.max())],
        "scale_byte_counts": {str(int(v)): int(c)
                              for v, c in zip(*np.unique(scales_all, return_counts=True))},
    }


def mxfp4_reload_checks(folder: Path, model, model2, ids: list[int], logits, logits_mem) -> dict:
    """That transformers dequantized the folder's MXFP4 experts into plain f32 experts equal to
    the in-memory model's, and how far its logits are from a plain float model: the in-memory
    one, and one built from the config without quantization_config and the folder's tensors
    dequantized by mxfp4.py."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    # The folder declares MXFP4; a dequantizing load drops the quantizer and the config entry.
    declared = AutoConfig.from_pretrained(folder).quantization_config
    assert declared == GPT_OSS_MXFP4_CONFIG, declared
    assert getattr(model2, "hf_quantizer", None) is None
    assert getattr(model2.config, "quantization_config", None) is None
    for l1, l2 in zip(model.model.layers, model2.model.layers):
        assert type(l2.mlp.experts) is GptOssExperts, type(l2.mlp.experts)
        for proj in EXPERT_PROJS:
            a, b = getattr(l1.mlp.experts, proj), getattr(l2.mlp.experts, proj)
            assert b.dtype == torch.float32 and torch.equal(a, b), proj

    tensors = load_file(str(folder / "model.safetensors"))
    state = {}
    for k, v in tensors.items():
        if k.endswith("_blocks"):
            base = k.removesuffix("_blocks")
            deq = mxfp4.dequantize(v, tensors[f"{base}_scales"]).transpose(0, 2, 1)
            state[base] = torch.from_numpy(np.ascontiguousarray(deq))
        elif not k.endswith("_scales"):
            state[k] = torch.from_numpy(v)
    assert getattr(model.config, "quantization_config", None) is None
    plain = type(model)(model.config).eval()
    plain.load_state_dict(state, strict=True)
    with torch.no_grad():
        plain_logits = plain(torch.tensor([ids])).logits[0].float().numpy()
    d_mem = float(np.abs(logits - logits_mem).max())
    d_plain = float(np.abs(logits - plain_logits).max())
    assert d_mem < 1e-6 and d_plain < 1e-6, (d_mem, d_plain)
    print(f"gpt-oss-mxfp4: transformers on the folder vs the float model in memory {d_mem:.2e}, "
          f"vs a float model of the dequantized file {d_plain:.2e}")
    return {
        "transformers_load": "from_pretrained(folder, quantization_config=Mxfp4Config(dequantize=True), "
                             "dtype=float32): every tensor read (no missing or unexpected keys: "
                             "gate_up_proj / down_proj come from the _blocks and _scales), experts "
                             "dequantized into plain GptOssExperts equal (bit for bit) to the model "
                             "the folder was written from",
        "vs_float_model_max_abs_diff": d_mem,
        "vs_float_model_of_dequantized_file_max_abs_diff": d_plain,
    }


def router_gaps(model, sequences: list[list[int]]):
    """(smallest gap between the k-th and (k+1)-th router logit over every token of
    `sequences` and every MoE layer, std of all router logits). For LFM2-MoE the gap is that of
    the scores the experts are chosen on, sigmoid(logits) + expert_bias."""
    import torch

    seen = []
    gaps = []
    k = model.config.num_experts_per_tok

    def hook(layer):
        def record(_m, _i, out):
            seen.append(out[0].detach())
            if hasattr(layer, "feed_forward"):
                scores = out[0].detach().sigmoid() + layer.feed_forward.expert_bias
                top = scores.sort(dim=-1, descending=True).values
                gaps.append(float((top[:, k - 1] - top[:, k]).min()))
        return record

    hooks = [router_of(layer).register_forward_hook(hook(layer)) for layer in moe_layers(model)]
    try:
        with torch.no_grad():
            for seq in sequences:
                model(torch.tensor([seq]))
    finally:
        for h in hooks:
            h.remove()
    all_logits = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])
    if gaps:
        return min(gaps), float(all_logits.std())
    top = all_logits.sort(dim=-1, descending=True).values
    return float((top[:, k - 1] - top[:, k]).min()), float(all_logits.std())


def decisive_moe(cls, cfg, seed: int, prompts: list[list[int]], mxfp4_experts: bool = False,
                 kind: str | None = None):
    """A random MoE model whose routing is decisive on the golden sequences (prompts and their
    greedy continuations): routers scaled to ROUTER_STD, seed bumped until the smallest top-k
    gap exceeds ROUTER_MIN_GAP. With `mxfp4_experts` the (gpt-oss) expert weights are replaced
    by their MXFP4 quantization first. A hybrid `kind` gets hybrid_weights and must also have
    decisive argmaxes (decision_margin). Returns (model, seed, gap)."""
    import torch

    for attempt in range(20):
        s = seed + 1000 * attempt
        model = cls(cfg).eval()
        mg.randomize_weights(model, seed=s, gemma=False)
        if cfg.model_type == "gpt_oss":
            gpt_oss_weights(model, s)
        if cfg.model_type == "qwen2_moe":
            qwen2moe_weights(model, s)
        if kind in HYBRID_KINDS:
            hybrid_weights(model, kind, s)
        if cfg.model_type == "lfm2_moe":
            lfm2moe_weights(model, s)
        if mxfp4_experts:
            mxfp4_round_trip(model)
        router_std = LFM2MOE_ROUTER_STD if kind == "lfm2moe" else ROUTER_STD
        with torch.no_grad():
            for layer in moe_layers(model):
                router_of(layer).weight.mul_(router_std)
        seqs = []
        for p in prompts:
            with torch.no_grad():
                out = model.generate(torch.tensor([p]), max_new_tokens=CONTINUE, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            seqs.append([int(t) for t in out[0]])
        gap, std = router_gaps(model, seqs)
        print(f"seed {s}: router logit std {std:.2f}, min top-{cfg.num_experts_per_tok} gap {gap:.2e}")
        if gap <= (LFM2MOE_MIN_GAP if kind == "lfm2moe" else ROUTER_MIN_GAP):
            continue
        if kind in HYBRID_KINDS:
            margin = decision_margin(model, kind)
            print(f"seed {s}: smallest argmax margin {margin:.2e}")
            if margin <= ARGMAX_MIN_MARGIN:
                continue
        return model, s, gap
    raise RuntimeError("no seed gives decisive routing")


def decisive_hybrid(cls, cfg, kind: str, seed: int):
    """A random model of the (dense) hybrid `kind` whose argmaxes are decisive: seed bumped until
    decision_margin exceeds ARGMAX_MIN_MARGIN. Returns (model, seed)."""
    for attempt in range(20):
        s = seed + 1000 * attempt
        model = cls(cfg).eval()
        mg.randomize_weights(model, seed=s, gemma=False)
        hybrid_weights(model, kind, s)
        margin = decision_margin(model, kind)
        print(f"seed {s}: smallest argmax margin {margin:.2e}")
        if margin > ARGMAX_MIN_MARGIN:
            return model, s
    raise RuntimeError("no seed gives decisive argmaxes")


def decision_margin(model, kind: str) -> float:
    """The smallest gap between the largest and second largest logit over every position of
    golden_ids(kind) and every greedy decision on prompts_of(kind)."""
    import numpy as np
    import torch

    margins = []
    for p in prompts_of(kind) + [golden_ids(kind)]:
        with torch.no_grad():
            seq = model.generate(torch.tensor([p]), max_new_tokens=CONTINUE, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0]
            logits = model(seq[None, :-1], use_cache=False).logits[0].float().numpy()
        # The prompt's own positions count only for the golden ids.
        rows = logits if len(p) == HYBRID_LEN else logits[len(p) - 1:]
        top2 = np.sort(rows, axis=-1)[:, -2:]
        margins.append(float((top2[:, 1] - top2[:, 0]).min()))
    return min(margins)


def prompts_of(kind: str) -> list[list[int]]:
    """The greedy prompts; the last one's logits are recorded at every position, except for a
    hybrid kind (golden_ids), whose last prompt is the first HYBRID_LONG_PROMPT of those ids."""
    if kind == "phi3":
        return [list(range(100, 125)), list(range(40, 58))]
    if kind in HYBRID_KINDS:
        return PROMPTS + [golden_ids(kind)[:HYBRID_LONG_PROMPT]]
    return PROMPTS


def convert(folder: Path, out: Path, pre: str, extra: list[str] | None = None):
    """llama.cpp's converter on `folder`, F32, with the tokenizer's pre-tokenizer named `pre`
    and `extra` arguments."""
    argv = ["convert_hf_to_gguf.py", str(folder), "--outfile", str(out), "--outtype", "f32", *(extra or [])]
    code = f"""
import sys
sys.path.insert(0, {str(SDIST / 'gguf-py')!r})
sys.path.insert(0, {str(SDIST)!r})
sys.argv = {argv!r}
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
import runpy
runpy.run_path({str(SDIST / 'convert_hf_to_gguf.py')!r}, run_name="__main__")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def llamacpp(gguf: Path, ids: list[int], prompts: list[list[int]]):
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    m = Llama(str(gguf), n_ctx=256, n_batch=256, n_threads=2, n_threads_batch=2, logits_all=True,
              verbose=False, seed=0, flash_attn=False,
              type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    m.reset()
    m.eval(ids)
    scores = np.array(m.scores[: len(ids)], dtype=np.float32)
    greedy = []
    for p in prompts:
        out = []
        m.reset()
        for tok in m.generate(p, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                              frequency_penalty=0.0, presence_penalty=0.0, reset=True):
            out.append(int(tok))
            if len(out) >= CONTINUE:
                break
        greedy.append(out)
    return scores, greedy, llama_cpp.__version__


# Why the Gemma 4 goldens' llama.cpp logits are ~1e-2 (not ~1e-5) from transformers'.
GELU_NOTE = (
    "ggml-cpu computes GELU (and GEGLU) through an f16 lookup table (GGML_GELU_FP16 in "
    "ggml-cpu/vec.h: y = f16(gelu_tanh(f16(x)))), so its FFN and per-layer-input activations carry "
    "~5e-4 relative error; transformers computes gelu_pytorch_tanh in f32. With that table "
    "emulated in transformers the first positions agree to < 1e-5 and the rest to ~1e-3 (f32 "
    "rounding then flips f16 roundings). Greedy continuations agree."
)


# Why the gpt-oss goldens' llama.cpp logits are ~1e-2 (not ~1e-5) from transformers'.
YARN_TRUNCATE_NOTE = (
    "gpt-oss's rope_parameters say truncate: false: transformers then uses the YaRN correction "
    "range [low, high] unrounded (low = d*ln(L/(2*pi*beta_fast))/(2*ln(theta)), high likewise with "
    "beta_slow; d = head_dim, L = original_max_position_embeddings). llama.cpp's converter drops "
    "the key and ggml_rope_yarn_corr_dims always floors low and ceils high (as truncate: true), so "
    "the inverse frequencies of the dims inside the ramp differ (here pairs 5..8 of 16: low 4.05 "
    "-> 4, high 8.66 -> 9). max_abs_diff_vs_transformers_truncated_yarn: transformers with "
    "truncate: true against these llama.cpp logits."
)


def truncated_yarn_model(folder: Path, kind: str):
    """transformers' model of `folder` with rope_parameters.truncate forced to true."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg.rope_parameters["truncate"] = True
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, config=cfg, attn_implementation="eager", dtype=torch.float32,
        **load_kwargs(kind)).eval()


def logits_of(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def greedy_of(model, prompts: list[list[int]]) -> list[list[int]]:
    import torch

    out = []
    for p in prompts:
        with torch.no_grad():
            seq = model.generate(torch.tensor([p]), max_new_tokens=CONTINUE, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        out.append([int(t) for t in seq[0][len(p):]])
    return out


# Why the gpt-oss MXFP4 goldens' llama.cpp logits are ~0.25 (not ~1e-5) from transformers'.
Q8_ACTIVATION_NOTE = (
    "ggml-cpu multiplies MXFP4 weights by activations quantized to Q8_0 (MXFP4's vec_dot_type): "
    "each 32 inputs of an expert matmul (the normed hidden state into gate/up, the SwiGLU output "
    "into down) become round(x * 127 / amax) times amax / 127 rounded to f16. transformers "
    "multiplies the dequantized weights by f32 activations. With that quantization emulated in "
    "transformers' experts (q8_0_expert_activations in golden_families.py) and YaRN truncate "
    "true, its logits agree with llama.cpp's (max_abs_diff_vs_transformers_truncated_yarn_q8_0_"
    "activations). Q8_0 rounding is discontinuous: float differences of ~1e-7 between engines can "
    "carry an activation across a rounding boundary and move later logits by ~1e-2..1e-1, so greedy "
    "continuations may part where two logits are close (greedy_equals_transformers_truncated_yarn_"
    "q8_0_activations). The weights are exact in both: the same MXFP4 values."
)


def q8_0_round_trip(x):
    """`x` [..., 32k] through ggml-cpu's Q8_0 activation quantization (x86 quantize_row_q8_0:
    per 32 values d = amax / 127 stored as f16, q = round-half-even(x * 127 / amax)),
    dequantized."""
    import torch

    blocks = x.reshape(-1, 32)
    amax = blocks.abs().max(dim=-1, keepdim=True).values
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv)
    d = (amax / 127.0).to(torch.float16).to(torch.float32)
    return (q * d).reshape(x.shape)


def q8_0_expert_activations(model):
    """Patches `model`'s gpt-oss experts so that the inputs of both expert matmuls go through
    `q8_0_round_trip`, as ggml-cpu computes MXFP4 matmuls."""
    import types
    import torch

    def forward(self, hidden_states, router_indices=None, routing_weights=None):
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            token_idx, top_k_pos = torch.where(router_indices == e)
            if token_idx.numel() == 0:
                continue
            x = q8_0_round_trip(hidden_states[token_idx])
            gated = self._apply_gate(x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e])
            y = q8_0_round_trip(gated) @ self.down_proj[e] + self.down_proj_bias[e]
            out.index_add_(0, token_idx, y * routing_weights[token_idx, top_k_pos, None])
        return out

    for layer in model.model.layers:
        layer.mlp.experts.forward = types.MethodType(forward, layer.mlp.experts)
    return model


def mxfp4_gguf_checks(gguf_path: Path, folder: Path) -> dict:
    """That llama.cpp's converter wrote every expert matrix as GGML MXFP4 (type 39), holding
    the folder's blocks moved into ggml's layout (mxfp4.to_ggml; gate/up de-interleaved), and
    everything else as F32."""
    import numpy as np
    from safetensors.numpy import load_file

    gguf = mxfp4.gguf_module()
    reader = gguf.GGUFReader(str(gguf_path))
    hf = load_file(str(folder / "model.safetensors"))
    types = {}
    n_exps = 0
    for t in reader.tensors:
        types.setdefault(t.tensor_type.name, 0)
        types[t.tensor_type.name] += 1
        if "_exps.weight" not in t.name:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, (t.name, t.tensor_type.name)
            continue
        assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4, (t.name, t.tensor_type.name)
        layer, which = int(t.name.split(".")[1]), t.name.split(".")[2]
        prefix = f"model.layers.{layer}.mlp.experts."
        proj = "down_proj" if which == "ffn_down_exps" else "gate_up_proj"
        blocks, scales = hf[prefix + proj + "_blocks"], hf[prefix + proj + "_scales"]
        if which != "ffn_down_exps":
            part = slice(0, None, 2) if which == "ffn_gate_exps" else slice(1, None, 2)
            blocks, scales = blocks[:, part], scales[:, part]
        want = mxfp4.to_ggml(blocks, scales)
        got = np.asarray(t.data, dtype=np.uint8).reshape(want.shape)
        assert np.array_equal(got, want), t.name
        n_exps += 1
    assert n_exps == 3 * len({t.name.split(".")[1] for t in reader.tensors if "_exps" in t.name})
    print(f"{gguf_path.name}: tensor types {types}; {n_exps} expert tensors are MXFP4 with the "
          "folder's blocks")
    return {"tensor_type_counts": types,
            "experts": "blk.N.ffn_{gate,up,down}_exps.weight are GGML MXFP4 (type 39), bytes equal to "
                       "the folder's blocks and scales in ggml's layout (gate = even rows of "
                       "gate_up_proj, up = odd rows); every other tensor F32"}


def hybrid_agreement(kind: str, folder: Path, gguf_path: Path, ids: list[int], scores, greedy,
                     hf: dict) -> dict:
    """llama.cpp's logits and greedy continuations of a hybrid kind against transformers' on
    the folder (recomputed: logits.json keeps only some rows), over every position and per
    DeltaNet chunk, plus the checks of the GGUF's layout (gguf_layout)."""
    import numpy as np
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, **load_kwargs(kind)).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    assert ref.argmax(-1).tolist() == hf["argmax"], "transformers' reload differs from logits.json"
    exact_diff = float(np.abs(float64_logits(model, ids) - scores).max())
    diff = np.abs(ref - scores).max(axis=-1)
    chunks = {f"{a}..{min(a + DELTANET_CHUNK, len(ids)) - 1}": float(diff[a:a + DELTANET_CHUNK].max())
              for a in range(0, len(ids), DELTANET_CHUNK)}
    argmax_same = bool((ref.argmax(-1) == scores.argmax(-1)).all())
    greedy_same = [a == b for a, b in zip(greedy, hf["greedy"])]
    # The long prompt's first greedy token is the argmax of the prefill at its last position.
    assert greedy[-1][0] == int(scores[HYBRID_LONG_PROMPT - 1].argmax()), "llama.cpp state reuse"
    if kind in LLAMACPP_CHECKED:
        assert diff.max() < LLAMACPP_TOLERANCE and argmax_same and all(greedy_same), (
            kind, float(diff.max()), argmax_same, greedy_same)
    print(f"{kind}: llama.cpp vs transformers max |diff| {diff.max():.2e} (position {int(diff.argmax())}; "
          f"per chunk {chunks}); argmax equal at every position {argmax_same}; greedy equal {greedy_same}; "
          f"llama.cpp vs float64 {exact_diff:.2e}")
    return {
        "max_abs_diff_vs_transformers": float(diff.max()),
        "max_abs_diff_vs_float64": exact_diff,
        "llamacpp_paths": (LLAMACPP_SHORTCONV_NOTE if kind in LFM2_KINDS else LLAMACPP_MAMBA2_NOTE
                           if kind == "granite4h" else LLAMACPP_DELTANET_NOTE),
        "float64_note": FLOAT64_NOTE + "; transformers' own float32 logits are float64_max_abs_diff "
                        "from it (logits.json)",
        "max_abs_diff_vs_transformers_position": int(diff.argmax()),
        "max_abs_diff_vs_transformers_per_chunk": chunks,
        "argmax_equals_transformers_every_position": argmax_same,
        "greedy_equals_transformers": greedy_same,
        "gguf_layout": gguf_layout(kind, gguf_path, folder),
    }


def qwen35_gguf_expected(hf: dict, cfg: dict) -> dict:
    """Each tensor llama.cpp's converter writes for a Qwen3.5 (MoE) folder, computed from the
    folder's tensors `hf` (numpy, HF shapes; GGUFReader gives the same shapes, ne reversed)."""
    import numpy as np

    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    kd = nk * dk

    def tiled(x, axis: int, head_dim: int):
        # V heads from grouped (k0v0 k0v1 k1v0 k1v1: value head h uses key head h // (nv/nk))
        # to tiled order (k0v0 k1v0 k0v1 k1v1: GGUF head g uses key head g % nk).
        x = np.moveaxis(x, axis, 0)
        shape = x.shape
        x = x.reshape(nk, nv // nk, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
        return np.moveaxis(x, 0, axis)

    one_plus = lambda w: (1.0 + w).astype(np.float32)  # noqa: E731
    want = {"token_embd.weight": hf["model.embed_tokens.weight"],
            "output_norm.weight": one_plus(hf["model.norm.weight"])}
    if "lm_head.weight" in hf:
        want["output.weight"] = hf["lm_head.weight"]
    for i, layer_type in enumerate(cfg["layer_types"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        want[b + "attn_norm.weight"] = one_plus(hf[p + "input_layernorm.weight"])
        want[b + "post_attention_norm.weight"] = one_plus(hf[p + "post_attention_layernorm.weight"])
        if layer_type == "linear_attention":
            la = p + "linear_attn."
            qkv, conv = hf[la + "in_proj_qkv.weight"], hf[la + "conv1d.weight"][:, 0, :]
            want.update({
                b + "attn_qkv.weight": np.concatenate([qkv[:2 * kd], tiled(qkv[2 * kd:], 0, dv)]),
                b + "attn_gate.weight": tiled(hf[la + "in_proj_z.weight"], 0, dv),
                b + "ssm_alpha.weight": tiled(hf[la + "in_proj_a.weight"], 0, 1),
                b + "ssm_beta.weight": tiled(hf[la + "in_proj_b.weight"], 0, 1),
                b + "ssm_a": -np.exp(tiled(hf[la + "A_log"], 0, 1)),
                b + "ssm_dt.bias": tiled(hf[la + "dt_bias"], 0, 1),
                b + "ssm_conv1d.weight": np.concatenate([conv[:2 * kd], tiled(conv[2 * kd:], 0, dv)]),
                b + "ssm_norm.weight": hf[la + "norm.weight"],
                b + "ssm_out.weight": tiled(hf[la + "out_proj.weight"], 1, dv),
            })
        else:
            sa = p + "self_attn."
            want.update({b + "attn_q.weight": hf[sa + "q_proj.weight"],
                         b + "attn_k.weight": hf[sa + "k_proj.weight"],
                         b + "attn_v.weight": hf[sa + "v_proj.weight"],
                         b + "attn_output.weight": hf[sa + "o_proj.weight"],
                         b + "attn_q_norm.weight": one_plus(hf[sa + "q_norm.weight"]),
                         b + "attn_k_norm.weight": one_plus(hf[sa + "k_norm.weight"])})
        m = p + "mlp."
        if m + "experts.gate_up_proj" in hf:
            gate_up = hf[m + "experts.gate_up_proj"]
            ff = gate_up.shape[1] // 2
            want.update({b + "ffn_gate_inp.weight": hf[m + "gate.weight"],
                         b + "ffn_gate_exps.weight": gate_up[:, :ff],
                         b + "ffn_up_exps.weight": gate_up[:, ff:],
                         b + "ffn_down_exps.weight": hf[m + "experts.down_proj"],
                         b + "ffn_gate_inp_shexp.weight": hf[m + "shared_expert_gate.weight"],
                         b + "ffn_gate_shexp.weight": hf[m + "shared_expert.gate_proj.weight"],
                         b + "ffn_up_shexp.weight": hf[m + "shared_expert.up_proj.weight"],
                         b + "ffn_down_shexp.weight": hf[m + "shared_expert.down_proj.weight"]})
        else:
            want.update({b + f"ffn_{w}.weight": hf[m + f"{w}_proj.weight"] for w in ("gate", "up", "down")})
    return want


def lfm2_gguf_expected(hf: dict, cfg: dict) -> dict:
    """Each tensor llama.cpp's converter writes for an LFM2 or LFM2-MoE folder, from the
    folder's tensors (LFM2-MoE: layers from num_dense_layers on are MoE, their per-expert
    w1 / w3 / w2 stacked into [experts, ...], expert_bias as exp_probs_b.bias)."""
    import numpy as np

    want = {"token_embd.weight": hf["model.embed_tokens.weight"],
            # LFM2's final norm (model.embedding_norm, applied after the last layer) keeps the
            # name of an embedding norm in GGUF.
            "token_embd_norm.weight": hf["model.embedding_norm.weight"]}
    n_dense = cfg.get("num_dense_layers", len(cfg["layer_types"]))
    for i, layer_type in enumerate(cfg["layer_types"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        ff = p + "feed_forward."
        want.update({b + "attn_norm.weight": hf[p + "operator_norm.weight"],
                     b + "ffn_norm.weight": hf[p + "ffn_norm.weight"]})
        if i < n_dense:
            want.update({b + "ffn_gate.weight": hf[ff + "w1.weight"],
                         b + "ffn_up.weight": hf[ff + "w3.weight"],
                         b + "ffn_down.weight": hf[ff + "w2.weight"]})
        else:
            stack = lambda w: np.stack([hf[ff + f"experts.{e}.{w}.weight"]  # noqa: E731
                                        for e in range(cfg["num_experts"])])
            want.update({b + "ffn_gate_inp.weight": hf[ff + "gate.weight"],
                         b + "exp_probs_b.bias": hf[ff + "expert_bias"],
                         b + "ffn_gate_exps.weight": stack("w1"),
                         b + "ffn_up_exps.weight": stack("w3"),
                         b + "ffn_down_exps.weight": stack("w2")})
        if layer_type == "conv":
            want.update({b + "shortconv.conv.weight": hf[p + "conv.conv.weight"][:, 0, :],
                         b + "shortconv.in_proj.weight": hf[p + "conv.in_proj.weight"],
                         b + "shortconv.out_proj.weight": hf[p + "conv.out_proj.weight"]})
        else:
            sa = p + "self_attn."
            want.update({b + "attn_q.weight": hf[sa + "q_proj.weight"],
                         b + "attn_k.weight": hf[sa + "k_proj.weight"],
                         b + "attn_v.weight": hf[sa + "v_proj.weight"],
                         b + "attn_output.weight": hf[sa + "out_proj.weight"],
                         b + "attn_q_norm.weight": hf[sa + "q_layernorm.weight"],
                         b + "attn_k_norm.weight": hf[sa + "k_layernorm.weight"]})
    return want


# How llama.cpp computes the hybrid layers on CPU (recorded in the llama.cpp json).
LLAMACPP_DELTANET_NOTE = (
    "ggml-cpu runs each gated DeltaNet layer as one fused op, ggml_gated_delta_net (llama_context "
    "sets fused_gdn_ch / fused_gdn_ar, not probed on CPU): per value head a token-by-token "
    "recurrence in float32 over the whole ubatch (here all the prompt's tokens in one), not "
    "chunked as transformers; the state of a head is kept transposed (s[j * S_v + i] = S[i][j] for "
    "transformers' S [key dim][value dim]); q and k L2-normalized as rms_norm(x, eps / n) / sqrt(n) "
    "= x / sqrt(sum x^2 + eps) with eps = rms_norm_eps (transformers: eps 1e-6 fixed; equal here); "
    "the 1 / sqrt(head_k_dim) scale applied to the output instead of q; value head g reads key "
    "head g % n_k_heads (the converter's tiled order); the causal conv is ggml_ssm_conv over the "
    "kernel-1 previous inputs kept as recurrent state followed by SiLU"
)
LLAMACPP_SHORTCONV_NOTE = (
    "ggml-cpu computes LFM2's short convolution with ggml_ssm_conv over the L - 1 = 2 previous "
    "inputs (B * x) kept as recurrent state, the attention layers with an F32 K/V cache"
)

# How llama.cpp's converter lays out a hybrid GGUF (recorded in the llama.cpp json).
QWEN35_GGUF_NOTE = (
    "Every GGUF tensor equals the folder's tensor transformed as follows (checked, numpy shapes = "
    "ggml ne reversed): norms that scale by (1 + w) are stored as 1 + w (attn_norm, "
    "post_attention_norm, attn_q_norm, attn_k_norm, output_norm), the gated DeltaNet norm ssm_norm "
    "as w; ssm_a = -exp(A_log); ssm_dt.bias = dt_bias; ssm_conv1d.weight [conv_dim, kernel] = "
    "conv1d.weight [conv_dim, 1, kernel] squeezed (ne [kernel, conv_dim]); attn_qkv = in_proj_qkv, "
    "attn_gate = in_proj_z, ssm_alpha = in_proj_a, ssm_beta = in_proj_b, ssm_out = out_proj. When "
    "linear_num_value_heads > linear_num_key_heads the value heads are reordered from grouped "
    "(HF: value head h reads key head h // (nv / nk)) to tiled (GGUF: value head g reads key head "
    "g % nk; g = i_r * nk + i_k holds HF head i_k * (nv / nk) + i_r) in the V rows of attn_qkv and "
    "ssm_conv1d, the rows of attn_gate, ssm_alpha, ssm_beta, the entries of ssm_a and ssm_dt, and "
    "the columns of ssm_out. Full attention: attn_q is q_proj unchanged (per head head_dim query "
    "rows then head_dim gate rows). MoE: ffn_gate_exps / ffn_up_exps = the first / second half of "
    "gate_up_proj's rows, ffn_down_exps = down_proj, ffn_gate_inp = mlp.gate, ffn_*_shexp = the "
    "shared expert, ffn_gate_inp_shexp = shared_expert_gate. Tied embeddings: no output.weight."
)
LFM2_GGUF_NOTE = (
    "Every GGUF tensor equals the folder's tensor, renamed (checked): the final norm "
    "model.embedding_norm is token_embd_norm.weight (applied after the last layer, as in "
    "transformers, despite both names); operator_norm -> attn_norm, feed_forward.w1/w3/w2 -> "
    "ffn_gate/up/down, conv.conv.weight [hidden, 1, L] squeezed -> shortconv.conv.weight (ne [L, "
    "hidden]), conv.in_proj (rows B, C, x) -> shortconv.in_proj, self_attn.out_proj -> attn_output, "
    "q/k_layernorm -> attn_q/k_norm; lfm2.attention.head_count_kv is per layer, 0 for the conv "
    "layers; lfm2.feed_forward_length is the derived width (96)."
)


def qwen2moe_gguf_expected(hf: dict, cfg: dict) -> dict:
    """Each tensor llama.cpp's converter writes for a Qwen2-MoE folder, from the folder's
    tensors (per-expert gate_proj / up_proj / down_proj stacked into [experts, ...])."""
    import numpy as np

    want = {"token_embd.weight": hf["model.embed_tokens.weight"],
            "output_norm.weight": hf["model.norm.weight"],
            "output.weight": hf["lm_head.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        sa, m = p + "self_attn.", p + "mlp."
        want.update({b + "attn_norm.weight": hf[p + "input_layernorm.weight"],
                     b + "ffn_norm.weight": hf[p + "post_attention_layernorm.weight"],
                     b + "attn_output.weight": hf[sa + "o_proj.weight"],
                     b + "ffn_gate_inp.weight": hf[m + "gate.weight"],
                     b + "ffn_gate_inp_shexp.weight": hf[m + "shared_expert_gate.weight"],
                     b + "ffn_gate_shexp.weight": hf[m + "shared_expert.gate_proj.weight"],
                     b + "ffn_up_shexp.weight": hf[m + "shared_expert.up_proj.weight"],
                     b + "ffn_down_shexp.weight": hf[m + "shared_expert.down_proj.weight"]})
        for w in ("q", "k", "v"):
            want[b + f"attn_{w}.weight"] = hf[sa + f"{w}_proj.weight"]
            want[b + f"attn_{w}.bias"] = hf[sa + f"{w}_proj.bias"]
        for w in ("gate", "up", "down"):
            want[b + f"ffn_{w}_exps.weight"] = np.stack(
                [hf[m + f"experts.{e}.{w}_proj.weight"] for e in range(cfg["num_experts"])])
    return want


QWEN2MOE_GGUF_NOTE = (
    "Every GGUF tensor equals the folder's tensor, renamed (checked): input_layernorm -> "
    "attn_norm, post_attention_layernorm -> ffn_norm, q/k/v_proj weight and bias -> attn_q/k/v "
    "weight and bias (no o_proj bias), mlp.gate -> ffn_gate_inp [experts, hidden], the per-expert "
    "mlp.experts.E.{gate,up,down}_proj stacked into ffn_{gate,up,down}_exps [experts, out, in], "
    "mlp.shared_expert.{gate,up,down}_proj -> ffn_{gate,up,down}_shexp, mlp.shared_expert_gate "
    "[1, hidden] -> ffn_gate_inp_shexp.weight as it is (ne [hidden, 1]; llama.cpp's loader "
    "asks for {n_embd} and accepts the trailing 1), model.norm -> output_norm, "
    "lm_head -> output. Metadata: qwen2moe.expert_feed_forward_length = moe_intermediate_size, "
    "qwen2moe.expert_shared_feed_forward_length = shared_expert_intermediate_size, "
    "qwen2moe.feed_forward_length = intermediate_size (unused by llama.cpp when the two are set)."
)

def granite4h_gguf_expected(hf: dict, cfg: dict) -> dict:
    """Each tensor llama.cpp's converter writes for a dense Granite 4.0-H folder, from the
    folder's tensors (q/k rows permuted as for RoPE, as the converter's LlamaModel does)."""
    import numpy as np

    def permute(w, n_head):
        # LlamaModel.permute: per head, the rotary pairs (i, i + d/2) made adjacent.
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    n_group, d_inner = cfg["mamba_n_groups"], cfg["mamba_expand"] * cfg["hidden_size"]
    ff = cfg["shared_intermediate_size"]
    want = {"token_embd.weight": hf["model.embed_tokens.weight"],
            "output_norm.weight": hf["model.norm.weight"]}
    for i, layer_type in enumerate(cfg["layer_types"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        gate_up = hf[p + "shared_mlp.input_linear.weight"]
        want.update({b + "attn_norm.weight": hf[p + "input_layernorm.weight"],
                     b + "ffn_norm.weight": hf[p + "post_attention_layernorm.weight"],
                     b + "ffn_gate.weight": gate_up[:ff], b + "ffn_up.weight": gate_up[ff:],
                     b + "ffn_down.weight": hf[p + "shared_mlp.output_linear.weight"]})
        if layer_type == "mamba":
            m = p + "mamba."
            want.update({b + "ssm_in.weight": hf[m + "in_proj.weight"],
                         b + "ssm_conv1d.weight": hf[m + "conv1d.weight"][:, 0, :],
                         b + "ssm_conv1d.bias": hf[m + "conv1d.bias"],
                         b + "ssm_dt.bias": hf[m + "dt_bias"],
                         b + "ssm_a": -np.exp(hf[m + "A_log"])[:, None],
                         b + "ssm_d": hf[m + "D"][:, None],
                         b + "ssm_norm.weight": hf[m + "norm.weight"].reshape(n_group, d_inner // n_group),
                         b + "ssm_out.weight": hf[m + "out_proj.weight"]})
        else:
            sa = p + "self_attn."
            want.update({b + "attn_q.weight": permute(hf[sa + "q_proj.weight"], cfg["num_attention_heads"]),
                         b + "attn_k.weight": permute(hf[sa + "k_proj.weight"], cfg["num_key_value_heads"]),
                         b + "attn_v.weight": hf[sa + "v_proj.weight"],
                         b + "attn_output.weight": hf[sa + "o_proj.weight"]})
    return want


GRANITE4H_GGUF_NOTE = (
    "Every GGUF tensor equals the folder's tensor transformed as follows (checked, numpy shapes = "
    "ggml ne reversed): input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm; the "
    "dense shared MLP (num_local_experts 0): shared_mlp.input_linear [2 * ff, hidden] split into "
    "ffn_gate (first ff rows) and ffn_up (last ff rows), shared_mlp.output_linear -> ffn_down; "
    "Mamba-2: in_proj -> ssm_in [hidden -> z (d_inner), xBC (d_inner + 2 * n_groups * d_state), dt "
    "(n_heads)], conv1d.weight [conv_dim, 1, 4] squeezed -> ssm_conv1d.weight (ne [4, conv_dim]), "
    "conv1d.bias -> ssm_conv1d.bias, dt_bias -> ssm_dt.bias, ssm_a = -exp(A_log) as [n_heads, 1] "
    "(ne [1, n_heads]), D -> ssm_d [n_heads, 1], the gated norm's weight [d_inner] -> ssm_norm.weight "
    "reshaped [n_groups, d_inner / n_groups] (ne [d_inner / n_groups, n_groups]: llama.cpp normalizes "
    "each group separately, as transformers' GraniteMoeHybridRMSNormGated), out_proj -> ssm_out; "
    "attention: attn_q / attn_k = q_proj / k_proj with each head's rows permuted as for llama RoPE "
    "(LlamaModel.permute: rows (i, i + d/2) made adjacent; harmless without RoPE, q and k alike), "
    "attn_v = v_proj, attn_output = o_proj; model.norm -> output_norm; tied: no output.weight. "
    "Metadata: granitehybrid.{embedding_scale, residual_scale, attention.scale, logit_scale} = "
    "embedding_multiplier, residual_multiplier, attention_multiplier, logits_scaling; "
    "granitehybrid.rope.scaling.finetuned false (no RoPE: a hybrid GraniteMoeHybrid always converts "
    "so, and context_length 2^20); granitehybrid.attention.head_count_kv per layer (0 = Mamba-2 "
    "layer); ssm.{conv_kernel, state_size, group_count, inner_size, time_step_rank = n_heads}; "
    "feed_forward_length = intermediate_size (the dense FFN's width in llama.cpp: must equal "
    "shared_intermediate_size), expert_shared_feed_forward_length = shared_intermediate_size, "
    "expert_count 0, expert_used_count 0."
)

# What llama.cpp computes for Granite 4.0-H (recorded in the llama.cpp json).
LLAMACPP_MAMBA2_NOTE = (
    "llama.cpp's granitehybrid graph (src/models/granite-hybrid.cpp, build_mamba2_layer in "
    "src/models/mamba-base.cpp): the embeddings times embedding_scale; per layer x + "
    "residual_scale * mixer(norm(x)), then + residual_scale * ffn(norm(.)); Mamba-2 as "
    "ggml_ssm_conv over the 3 previous xBC rows kept as state (+ bias, SiLU) and ggml_ssm_scan, a "
    "token-by-token recurrence in float32 over the whole ubatch (not chunked as transformers): "
    "dt = softplus(dt + dt_bias) (softplus(x) = x above 20), no dt clamp (transformers clamps to "
    "time_step_limit, (0, inf) here), head h reads B/C group h / (n_heads / n_groups) (= "
    "transformers' repeat_interleave), y + D x, times silu(z), RMS-normed per group of d_inner / "
    "n_groups; attention without RoPE, scaled by attention.scale; logits / logit_scale"
)

QWEN2MOE_LLAMACPP_NOTE = (
    "llama.cpp's qwen2moe graph (src/models/qwen2moe.cpp): build_moe_ffn with softmax gating and "
    "norm_w = false (the chosen probabilities are never renormalized; the GGUF has no key that "
    "could say otherwise) and no expert_weights_scale; the shared expert's gate as "
    "silu(g) / g = sigmoid(g), g = ffn_gate_inp_shexp . x; every layer MoE + shared expert"
)

LFM2MOE_GGUF_NOTE = LFM2_GGUF_NOTE.removesuffix(
    "; lfm2.feed_forward_length is the derived width (96).") + (
    ". LFM2-MoE (arch lfm2moe): the dense layers (blk.0, blk.1: lfm2moe.leading_dense_block_count "
    "= num_dense_layers) have ffn_gate/up/down = feed_forward.w1/w3/w2 (lfm2moe.feed_forward_length "
    "= intermediate_size, as written); the MoE layers have ffn_gate_inp.weight = feed_forward.gate "
    "[experts, hidden], the folder's per-expert feed_forward.experts.E.w1/w3/w2 (transformers "
    "saves its fused gate_up_proj / down_proj back in LiquidAI's per-expert layout) stacked into "
    "ffn_gate_exps / ffn_up_exps / ffn_down_exps [experts, out, in], and exp_probs_b.bias = the "
    "buffer feed_forward.expert_bias [experts] (saved in model.safetensors; the converter renames "
    "it .expert_bias.bias). Metadata: lfm2moe.expert_feed_forward_length = moe_intermediate_size, "
    "lfm2moe.expert_gating_func = 2 (sigmoid), lfm2moe.expert_count, lfm2moe.expert_used_count; no "
    "expert_weights_scale and no expert_weights_norm key (routed_scaling_factor is not written; "
    "llama.cpp's lfm2moe graph always renormalizes: build_moe_ffn(norm_w = true))."
)

# llama.cpp's converter output per kind: (expected tensors from the folder's, what they are).
GGUF_LAYOUT = {"qwen35": (qwen35_gguf_expected, QWEN35_GGUF_NOTE),
               "qwen35moe": (qwen35_gguf_expected, QWEN35_GGUF_NOTE),
               "lfm2": (lfm2_gguf_expected, LFM2_GGUF_NOTE),
               "qwen2moe": (qwen2moe_gguf_expected, QWEN2MOE_GGUF_NOTE),
               "lfm2moe": (lfm2_gguf_expected, LFM2MOE_GGUF_NOTE),
               "granite4h": (granite4h_gguf_expected, GRANITE4H_GGUF_NOTE)}

# Kinds whose llama.cpp logits must agree with transformers' within LLAMACPP_TOLERANCE (the
# goldens made after the check was written; the others record their agreement).
LLAMACPP_CHECKED = ("qwen2moe", "lfm2moe", "granite4h")
LLAMACPP_TOLERANCE = 1e-4


def gguf_layout(kind: str, gguf_path: Path, folder: Path) -> dict:
    """Checks that every tensor of the converter's GGUF is the folder's tensor transformed as
    the note returned says (exactly, or within 1 ulp where the converter computes in float32),
    and that the GGUF has no other tensor."""
    import numpy as np
    from safetensors.numpy import load_file

    hf = load_file(str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    expected, note = GGUF_LAYOUT[kind]
    want = expected(hf, cfg)
    reader = mxfp4.gguf_module().GGUFReader(str(gguf_path))
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for name, w in want.items():
        assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
        assert np.allclose(got[name], w, rtol=1e-6, atol=0), name
    print(f"{gguf_path.name}: all {len(got)} tensors are the folder's, transformed as documented")
    return {"tensors_checked": len(got), "note": note}


def gguf_golden(kind: str, folder: Path):
    import numpy as np

    out = GOLDEN / f"tiny-{kind}.gguf"
    convert(folder, out, PRE[kind], CONVERT_ARGS.get(kind))
    prompts = prompts_of(kind)
    ids = golden_ids(kind)
    scores, greedy, version = llamacpp(out, ids, prompts)
    hf = json.loads((folder / "logits.json").read_text()) if (folder / "logits.json").exists() else None
    doc = {
        "source": f"llama-cpp-python {version} (vendored llama.cpp), convert_hf_to_gguf.py --outtype f32, "
                  "F32 K/V cache, no flash attention",
        "gguf": out.name,
        "token_ids": ids,
        **(logits_fields(kind, scores) if kind in HYBRID_KINDS
           else {"logits": [mg.f32_list(row) for row in scores]}),
        "greedy_prompts": prompts,
        "greedy": greedy,
    }
    if kind.startswith("gemma4"):
        doc["note"] = GELU_NOTE
    if kind in HYBRID_KINDS:
        doc.update(hybrid_agreement(kind, folder, out, ids, scores, greedy, hf))
    elif hf is not None and hf.get("token_ids") == ids:
        diff = float(np.abs(np.array(hf["logits"], dtype=np.float32) - scores).max())
        doc["max_abs_diff_vs_transformers"] = diff
        print(f"{kind}: llama.cpp vs transformers max |diff| {diff:.2e}")
        if kind in LLAMACPP_CHECKED:
            assert diff < LLAMACPP_TOLERANCE, (kind, diff)
            same = [a == b for a, b in zip(greedy, hf["greedy"])]
            assert all(same), same
            doc["greedy_equals_transformers"] = same
        if kind in GGUF_LAYOUT:
            doc["gguf_layout"] = gguf_layout(kind, out, folder)
    if kind == "qwen2moe":
        doc["note"] = QWEN2MOE_LLAMACPP_NOTE
    if kind == "lfm2moe":
        doc["note"] = LFM2MOE_NOTE
        if kind.startswith("gpt-oss"):
            truncated = truncated_yarn_model(folder, kind)
            trunc = float(np.abs(logits_of(truncated, ids) - scores).max())
            doc["note"] = YARN_TRUNCATE_NOTE
            doc["max_abs_diff_vs_transformers_truncated_yarn"] = trunc
            print(f"{kind}: llama.cpp vs transformers with YaRN truncate max |diff| {trunc:.2e}")
        if kind == "gpt-oss-mxfp4":
            q8_0_expert_activations(truncated)
            q8 = float(np.abs(logits_of(truncated, ids) - scores).max())
            q8_greedy = greedy_of(truncated, prompts)
            same = [a == b for a, b in zip(q8_greedy, greedy)]
            print(f"{kind}: llama.cpp vs transformers with YaRN truncate and Q8_0 expert activations "
                  f"max |diff| {q8:.2e}; greedy equal per prompt {same}")
            assert q8 < 1e-4, q8
            doc["note"] = YARN_TRUNCATE_NOTE + " " + Q8_ACTIVATION_NOTE
            doc["max_abs_diff_vs_transformers_truncated_yarn_q8_0_activations"] = q8
            doc["greedy_equals_transformers"] = [a == b for a, b in zip(greedy, hf["greedy"])]
            doc["greedy_equals_transformers_truncated_yarn_q8_0_activations"] = same
    if kind == "gpt-oss-mxfp4":
        doc["mxfp4"] = mxfp4_gguf_checks(out, folder)
    mg.write_json(GOLDEN / f"tiny-{kind}.llamacpp.json", doc)
    print(f"wrote {out.relative_to(ROOT)} ({out.stat().st_size} bytes)")


def main(kinds):
    for kind in kinds or ["qwen3", "smollm3", "llama31", "mistral3", "phi3", "gemma4", "gemma4-keqv",
                          "qwen3moe", "olmoe", "gpt-oss", "gpt-oss-mxfp4", "mxfp4-blocks",
                          "qwen35", "qwen35moe", "lfm2", "qwen2moe", "lfm2moe", "granite4h"]:
        if kind == "mxfp4-blocks":
            mxfp4.blocks_golden(GOLDEN / "mxfp4_blocks.json")
            continue
        if kind == "llama31":
            folder = GOLDEN / "tiny-llama"
        else:
            folder = tiny_folder(kind)
        with tempfile.TemporaryDirectory():
            gguf_golden(kind, folder)


if __name__ == "__main__":
    main(sys.argv[1:])
