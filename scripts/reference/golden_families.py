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
gpt-oss (gpt-oss-20b/120b-like: alternating sliding (window 8) / full layers, attention sinks,
biases on q/k/v/o, router and experts, 8 experts top-2 with softmax over the chosen logits,
the clamped SwiGLU (alpha 1.702, limit 7, (up + 1)) on fused interleaved gate/up experts in f32
(the converter splits them into ffn_gate_exps / ffn_up_exps), YaRN factor 32 over 4096 with
truncate false; logits.json records how far the logits move without sinks and without the
clamp; llama.cpp ignores truncate false, so its logits are ~1e-2 from transformers' and
~1e-5 from transformers' with truncate true (YARN_TRUNCATE_NOTE)).
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
       "gpt-oss": "gpt-4o"}

# Mixture-of-experts kinds: routers scaled so router logits have std ~ROUTER_STD, and every
# token of the golden sequences must separate its k-th and (k+1)-th router logit by more than
# ROUTER_MIN_GAP in every layer (else the seed is bumped), so float noise between engines
# cannot flip an expert choice.
MOE_KINDS = ("qwen3moe", "olmoe", "gpt-oss")
ROUTER_STD = 3.0
ROUTER_MIN_GAP = 1e-3

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
    elif kind == "gpt-oss":
        # gpt-oss-20b/120b in small: alternating sliding (window 8) / full attention layers
        # (layer 0 sliding), attention sinks (one learned logit per head), biases on q/k/v/o,
        # the router and the experts, 8 experts top-2 with softmax over the top-k logits, the
        # clamped SwiGLU (alpha 1.702, limit 7) with (up + 1), fused interleaved gate/up experts,
        # YaRN as in the real config (factor 32 over 4096, beta 32/1, truncate false), head_dim
        # 32 so that heads * head_dim (128) != hidden (64) as in the real models (64 * 64 vs
        # 2880). max_position_embeddings 256 (real: 131072 = 32 * 4096; transformers warns, and
        # uses the explicit factor, as llama.cpp does).
        specials = GPT_OSS_SPECIALS
        bos, eos, pad, template = "<|startoftext|>", "<|return|>", "<|endoftext|>", GPT_OSS_TEMPLATE
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}
        cfg = transformers.GptOssConfig(
            **{**common, "intermediate_size": 32, "rms_norm_eps": 1e-5}, num_hidden_layers=4,
            head_dim=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2, rope_parameters=rope,
            attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=2, pad_token_id=1, hidden_act="silu",
        )
        cfg._experts_implementation = "eager"
        legacy = {}
        cls, seed = transformers.GptOssForCausalLM, 19
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager"
    gemma4 = kind.startswith("gemma4")
    # gpt-oss's tokenizer names <|startoftext|> but does not prepend it.
    tok = (gemma4_tokenizer(vocab) if gemma4
           else mg.build_tokenizer(specials, vocab, None if kind == "gpt-oss" else bos))
    assert tok.get_vocab_size() == vocab or not gemma4, tok.get_vocab_size()
    if kind in MOE_KINDS:
        model, seed, min_gap = decisive_moe(cls, cfg, seed, prompts_of(kind))
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

    load_kw = {"experts_implementation": "eager"} if kind == "gpt-oss" else {}
    model2 = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32,
                                 **load_kw).eval()
    prompts = prompts_of(kind)
    ids = prompts[-1]
    with torch.no_grad():
        logits = model2(torch.tensor([ids])).logits[0].float().numpy()
        logits_mem = model(torch.tensor([ids])).logits[0].float().numpy()
    assert np.allclose(logits, logits_mem, atol=1e-5), "reload changed the model"
    assert logits.shape == (len(ids), vocab)
    assert float(logits.std()) > 0.5, "logits too flat"
    greedy = []
    for p in prompts:
        with torch.no_grad():
            out = model2.generate(torch.tensor([p]), max_new_tokens=CONTINUE, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
        greedy.append([int(t) for t in out[0][len(p):]])
    moe = {}
    if kind == "gpt-oss":
        moe = gpt_oss_checks(model2, ids, logits, greedy, prompts, min_gap, seed)
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
    mg.write_json(folder / "logits.json", {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention",
        "model_class": cls.__name__,
        "token_ids": ids,
        "vocab_size": vocab,
        "logits": [mg.f32_list(row) for row in logits],
        "argmax": [int(i) for i in logits.argmax(-1)],
        "greedy_prompts": prompts,
        "greedy": greedy,
        **({"layer_types": cfg.layer_types, "sliding_window": cfg.sliding_window,
            "kv_sharing_modes": cfg.kv_sharing_modes,
            "layer_scalar": [float(layer.layer_scalar) for layer in model2.model.layers],
            "sliding_window_semantics": "query i attends key j iff 0 <= i - j < sliding_window (itself included)"}
           if kind.startswith("gemma4") else {}),
        **moe,
    })
    print(f"wrote {folder.relative_to(ROOT)}")
    return folder


def router_of(layer):
    """The router (the module whose first output is the router logits) of a MoE layer."""
    return layer.mlp.router if hasattr(layer.mlp, "router") else layer.mlp.gate


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


def router_gaps(model, sequences: list[list[int]]):
    """(smallest gap between the k-th and (k+1)-th router logit over every token of
    `sequences` and every MoE layer, std of all router logits)."""
    import torch

    seen = []
    hooks = [router_of(layer).register_forward_hook(lambda _m, _i, out: seen.append(out[0].detach()))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            for seq in sequences:
                model(torch.tensor([seq]))
    finally:
        for h in hooks:
            h.remove()
    k = model.config.num_experts_per_tok
    all_logits = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])
    top = all_logits.sort(dim=-1, descending=True).values
    return float((top[:, k - 1] - top[:, k]).min()), float(all_logits.std())


def decisive_moe(cls, cfg, seed: int, prompts: list[list[int]]):
    """A random MoE model whose routing is decisive on the golden sequences (prompts and their
    greedy continuations): routers scaled to ROUTER_STD, seed bumped until the smallest top-k
    gap exceeds ROUTER_MIN_GAP. Returns (model, seed, gap)."""
    import torch

    for attempt in range(20):
        s = seed + 1000 * attempt
        model = cls(cfg).eval()
        mg.randomize_weights(model, seed=s, gemma=False)
        if cfg.model_type == "gpt_oss":
            gpt_oss_weights(model, s)
        with torch.no_grad():
            for layer in model.model.layers:
                router_of(layer).weight.mul_(ROUTER_STD)
        seqs = []
        for p in prompts:
            with torch.no_grad():
                out = model.generate(torch.tensor([p]), max_new_tokens=CONTINUE, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            seqs.append([int(t) for t in out[0]])
        gap, std = router_gaps(model, seqs)
        print(f"seed {s}: router logit std {std:.2f}, min top-{cfg.num_experts_per_tok} gap {gap:.2e}")
        if gap > ROUTER_MIN_GAP:
            return model, s, gap
    raise RuntimeError("no seed gives decisive routing")


def prompts_of(kind: str) -> list[list[int]]:
    """The greedy prompts; the last one's logits are recorded at every position."""
    if kind == "phi3":
        return [list(range(100, 125)), list(range(40, 58))]
    return PROMPTS


def convert(folder: Path, out: Path, pre: str):
    """llama.cpp's converter on `folder`, F32, with the tokenizer's pre-tokenizer named `pre`."""
    code = f"""
import sys
sys.path.insert(0, {str(SDIST / 'gguf-py')!r})
sys.path.insert(0, {str(SDIST)!r})
sys.argv = ["convert_hf_to_gguf.py", {str(folder)!r}, "--outfile", {str(out)!r}, "--outtype", "f32"]
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


def truncated_yarn_logits(folder: Path, ids: list[int]):
    """transformers' logits on `folder` with rope_parameters.truncate forced to true."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg.rope_parameters["truncate"] = True
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, config=cfg, attn_implementation="eager", experts_implementation="eager",
        dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def gguf_golden(kind: str, folder: Path):
    import numpy as np

    out = GOLDEN / f"tiny-{kind}.gguf"
    convert(folder, out, PRE[kind])
    prompts = prompts_of(kind)
    ids = prompts[-1]
    scores, greedy, version = llamacpp(out, ids, prompts)
    hf = json.loads((folder / "logits.json").read_text()) if (folder / "logits.json").exists() else None
    doc = {
        "source": f"llama-cpp-python {version} (vendored llama.cpp), convert_hf_to_gguf.py --outtype f32, "
                  "F32 K/V cache, no flash attention",
        "gguf": out.name,
        "token_ids": ids,
        "logits": [mg.f32_list(row) for row in scores],
        "greedy_prompts": prompts,
        "greedy": greedy,
    }
    if kind.startswith("gemma4"):
        doc["note"] = GELU_NOTE
    if hf is not None and hf.get("token_ids") == ids:
        diff = float(np.abs(np.array(hf["logits"], dtype=np.float32) - scores).max())
        doc["max_abs_diff_vs_transformers"] = diff
        print(f"{kind}: llama.cpp vs transformers max |diff| {diff:.2e}")
        if kind == "gpt-oss":
            trunc = float(np.abs(truncated_yarn_logits(folder, ids) - scores).max())
            doc["note"] = YARN_TRUNCATE_NOTE
            doc["max_abs_diff_vs_transformers_truncated_yarn"] = trunc
            print(f"{kind}: llama.cpp vs transformers with YaRN truncate max |diff| {trunc:.2e}")
    mg.write_json(GOLDEN / f"tiny-{kind}.llamacpp.json", doc)
    print(f"wrote {out.relative_to(ROOT)} ({out.stat().st_size} bytes)")


def main(kinds):
    for kind in kinds or ["qwen3", "smollm3", "llama31", "mistral3", "phi3", "gemma4", "gemma4-keqv",
                          "qwen3moe", "olmoe", "gpt-oss"]:
        if kind == "llama31":
            folder = GOLDEN / "tiny-llama"
        else:
            folder = tiny_folder(kind)
        with tempfile.TemporaryDirectory():
            gguf_golden(kind, folder)


if __name__ == "__main__":
    main(sys.argv[1:])
