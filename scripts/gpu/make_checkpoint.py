#!/usr/bin/env python3
"""Makes a random-initialised Hugging Face checkpoint in a real model's shape, the prompts of
the GPU check, and transformers' reference logits for them (issue 21's correctness check).

Model files cannot travel to the GPU machine (it receives at most 64 MiB and downloads
nothing), so the checkpoint is made there, from a seed, with torch + transformers:

    python3 scripts/gpu/make_checkpoint.py --shape smollm2-135m --out /tmp/check/smollm2-135m
    python3 scripts/gpu/make_checkpoint.py --shape qwen2.5-1.5b --out /tmp/check/qwen2.5-1.5b
    python3 scripts/gpu/make_checkpoint.py --shape qwen2.5-1.5b --layers 2 --out /tmp/q2  # dry run
    python3 scripts/gpu/make_checkpoint.py --shape qwen2.5-1.5b --no-reference --out /tmp/q  # speed

Without torch (`--backend numpy`, chosen by itself when torch does not import) it writes the
same kind of checkpoint with numpy alone and no reference logits: check.sh's dry run then
compares the device against Pagoda on the CPU. The tiny-llama / tiny-qwen2 shapes are those
architectures at hidden size 256 (one K-quant
block) and 2 layers, for the CUDA interpreter.

OUT/ then holds:
  model/           config.json, model.safetensors (bf16; tied output head left out, as
                   transformers saves it), generation_config.json, tokenizer.json,
                   tokenizer_config.json: a folder `pagoda eval logits` loads like any HF model
  prompts.json     [[id, ...] x 4], 256 ids each: three seeded uniform-random prompts and one
                   that repeats a 32-token segment (so later positions depend on attention)
  reference.npy    transformers' logits for the prompts, float32 [4, 256, vocab]: the model
                   in bf16 (as Pagoda's CUDA path holds the weights), eager attention, all
                   positions, on CUDA when available (CPU otherwise)
  reference_f32.npy  the same bf16 weights run in float32 (the exact answer: how far
                   transformers' own bf16 arithmetic is from it is the noise floor)
  info.json        shape, parameter count, seed, device, timings, and the statistics that
                   show the logits are not degenerate (distinct top-1 tokens, top-1 margin)

The weights: transformers' own initialisation (normal, std = initializer_range = 0.02, the
default of both configs) from the seed, made directly in bf16 on the device; then norm weights
~ N(1, 0.2) and biases (Qwen2's q/k/v) ~ N(0, 0.5) instead of transformers' 1 and 0, so that a
forward pass that ignored them would fail the comparison, and q/k weights x4 (std 0.08) so
that attention scores are spread (std ~3-6) and attention picks positions: with the default
scores are ~0, attention is a uniform average, and a wrong RoPE would hardly show. Activations stay in the range of a real model's first layers (RMSNorm rescales each
layer's input), and the logits vary with position: the script fails if a prompt's top-1 token
is the same at every position, or if the logits are not finite.

The tokenizer: a byte-level BPE with the 256 byte symbols and four merges (so any text encodes,
about one token per byte: `pagoda bench` tokenizes its benchmark text with it), padded with unused
tokens to exactly the model's vocabulary size. Its content does not matter to the logits
comparison, which feeds token ids; it must only load in Pagoda.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

SHAPES = {
    # HuggingFaceTB/SmolLM2-135M's config.json
    "smollm2-135m": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    ),
    # Qwen/Qwen2.5-1.5B's config.json (q/k/v biases are built into Qwen2's attention)
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        hidden_act="silu",
        use_sliding_window=False,
    ),
    # Tiny shapes of the same two architectures, for dry runs (check.sh in interpret mode:
    # the CUDA interpreter runs a CUDA thread as a fiber, so full shapes take minutes there).
    "tiny-llama": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=512,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=2048,
        hidden_act="silu",
        # Logits of a real model's spread (std ~0.5) at hidden size 256.
        initializer_range=0.035,
        attention_bias=False,
        mlp_bias=False,
    ),
    "tiny-qwen2": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=768,
        vocab_size=640,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
        hidden_act="silu",
        # Logits of a real model's spread (std ~0.5) at hidden size 256.
        initializer_range=0.035,
        use_sliding_window=False,
    ),
}

# Multiplier on transformers' q_proj / k_proj initialisation (std 0.02 -> 0.08): see main().
QK_SCALE = 2.0

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# A few merges (their results follow the byte symbols): `pagoda quantize` to GGUF refuses a
# byte-level BPE without any (llama.cpp's loader needs them), which check.sh's quantized step does.
MERGES = [("\u0120", "t"), ("h", "e"), ("i", "n"), ("e", "r")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(vocab_size, folder):
    """A byte-level BPE tokenizer of exactly `vocab_size` tokens (ids 0-2 special, then the
    256 byte symbols, then unused fillers), saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    i = 0
    while len(vocab) < vocab_size:
        vocab[f"<unused_{i}>"] = len(vocab)
        i += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
                "model_max_length": 1 << 20,
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=2,
        )


def byte_level_alphabet():
    """GPT-2's byte-to-character map (tokenizers' `ByteLevel.alphabet()`): the 256 symbols."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1)]
    keep += range(ord("\u00ae"), ord("\u00ff") + 1)
    chars, extra = [chr(b) for b in keep], 0
    for b in range(256):
        if b not in keep:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tokenizer_json(vocab_size, folder):
    """The tokenizer of `build_tokenizer`, written as JSON without the `tokenizers` package."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in sorted(byte_level_alphabet()):
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    i = 0
    while len(vocab) < vocab_size:
        vocab[f"<unused_{i}>"] = len(vocab)
        i += 1
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, s in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [f"{a} {b}" for a, b in MERGES]},
    }
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
                "model_max_length": 1 << 20,
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=2,
        )


def to_bf16_bits(a):
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even (as torch does)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    """`tensors`: name -> (shape, uint16 bf16 bits), written as one BF16 safetensors file."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, bits) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for _, bits in tensors.values():
            f.write(bits.tobytes())


def numpy_checkpoint(args, shape, model_dir):
    """The checkpoint without torch (dry runs on machines without it): the same recipe as the
    torch path (normal with std initializer_range, q/k x QK_SCALE, norms ~ N(1, 0.2), biases
    ~ N(0, 0.5)) from numpy's generator, so the same seed gives other weights than torch. No
    reference logits: check.sh then compares the device against Pagoda on the CPU. Returns the
    parameter count."""
    rng = np.random.default_rng(args.seed)
    d, v, n_layers = shape["hidden_size"], shape["vocab_size"], shape["num_hidden_layers"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = shape.get("head_dim", d // heads)
    inter = shape["intermediate_size"]
    bias = shape["model_type"] == "qwen2" or shape.get("attention_bias", False)
    std = shape.get("initializer_range", 0.02)
    tensors = {}

    def put(name, *dims, kind="weight", scale=1.0):
        if kind == "norm":
            a = 1.0 + 0.2 * rng.standard_normal(dims)
        elif kind == "bias":
            a = 0.5 * rng.standard_normal(dims)
        else:
            a = std * scale * rng.standard_normal(dims)
        tensors[name] = (dims, to_bf16_bits(a.astype(np.float32)))

    put("model.embed_tokens.weight", v, d)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        put(p + "input_layernorm.weight", d, kind="norm")
        put(p + "self_attn.q_proj.weight", heads * hd, d, scale=QK_SCALE)
        put(p + "self_attn.k_proj.weight", kv_heads * hd, d, scale=QK_SCALE)
        put(p + "self_attn.v_proj.weight", kv_heads * hd, d)
        if bias:
            put(p + "self_attn.q_proj.bias", heads * hd, kind="bias")
            put(p + "self_attn.k_proj.bias", kv_heads * hd, kind="bias")
            put(p + "self_attn.v_proj.bias", kv_heads * hd, kind="bias")
        put(p + "self_attn.o_proj.weight", d, heads * hd)
        put(p + "post_attention_layernorm.weight", d, kind="norm")
        put(p + "mlp.gate_proj.weight", inter, d)
        put(p + "mlp.up_proj.weight", inter, d)
        put(p + "mlp.down_proj.weight", d, inter)
    put("model.norm.weight", d, kind="norm")
    if not shape["tie_word_embeddings"]:
        put("lm_head.weight", v, d)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors)
    config = {k: val for k, val in shape.items()}
    config.setdefault("initializer_range", 0.02)
    config.update(bos_token_id=0, eos_token_id=0, pad_token_id=0,
                  use_cache=False, torch_dtype="bfloat16", head_dim=hd)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}, f)
    write_tokenizer_json(v, model_dir)
    return sum(int(np.prod(dims)) for dims, _ in tensors.values())


def make_prompts(vocab_size, n, length, seed):
    """`n` prompts of `length` ids: uniform random over the non-special ids, and the last one a
    32-token random segment repeated (an induction pattern: attention decides its logits)."""
    rng = np.random.default_rng(seed + 1)
    lo = len(SPECIALS)
    prompts = [rng.integers(lo, vocab_size, size=length).tolist() for _ in range(n - 1)]
    segment = rng.integers(lo, vocab_size, size=32).tolist()
    prompts.append((segment * (length // 32 + 1))[:length])
    return prompts


def logit_stats(logits, prompts):
    """Statistics that show whether the logits are degenerate (float32 [n, T, V])."""
    top2 = np.partition(logits, -2, axis=-1)[..., -2:]
    margin = top2[..., 1] - top2[..., 0]
    top1 = logits.argmax(-1)
    ids = np.asarray(prompts)
    return {
        "finite": bool(np.isfinite(logits).all()),
        "logit_std": float(logits.std()),
        "logit_max_abs": float(np.abs(logits).max()),
        "top1_distinct_per_prompt": [int(len(set(r.tolist()))) for r in top1],
        "top1_is_input_token": float((top1 == ids).mean()),
        "top1_margin_mean": float(margin.mean()),
        "top1_margin_p10": float(np.percentile(margin, 10)),
        "top1_margin_min": float(margin.min()),
    }


def set_param_dtype(model, dtype):
    """Casts the parameters (weights, norms, biases) only, leaving buffers as they are."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)


def check_rope_buffers(model):
    """The RoPE frequencies must stay float32 (transformers makes them so)."""
    import torch

    for name, buf in model.named_buffers():
        if "inv_freq" in name and buf.dtype != torch.float32:
            raise SystemExit(f"error: {name} is {buf.dtype}, not float32")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True, help="output folder (model/, prompts.json, ...)")
    ap.add_argument("--layers", type=int, help="keep only the first N layers (dry runs)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument(
        "--attn", default="eager", choices=["eager", "sdpa"], help="transformers attention"
    )
    ap.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "torch", "numpy"],
        help="torch + transformers (reference logits); numpy: the weights only, for machines "
        "without torch (auto: torch when it imports)",
    )
    ap.add_argument(
        "--no-reference",
        action="store_true",
        help="write the checkpoint and prompts only (no reference logits: speed runs)",
    )
    args = ap.parse_args()
    if args.prompts < 2:
        ap.error("--prompts must be at least 2 (the last one is the repetitive prompt)")
    backend = args.backend
    if backend == "auto":
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401

            backend = "torch"
        except ImportError:
            backend = "numpy"
    if backend == "numpy":
        t0 = time.time()
        shape = dict(SHAPES[args.shape])
        if args.layers:
            shape["num_hidden_layers"] = args.layers
        model_dir = os.path.join(args.out, "model")
        os.makedirs(model_dir, exist_ok=True)
        n_params = numpy_checkpoint(args, shape, model_dir)
        prompts = make_prompts(shape["vocab_size"], args.prompts, args.positions, args.seed)
        with open(os.path.join(args.out, "prompts.json"), "w") as f:
            json.dump(prompts, f)
        info = {
            "shape": args.shape,
            "architecture": shape["architectures"][0],
            "layers": shape["num_hidden_layers"],
            "hidden_size": shape["hidden_size"],
            "vocab_size": shape["vocab_size"],
            "parameters": n_params,
            "seed": args.seed,
            "backend": "numpy",
            "reference": None,
            "dtype": "bfloat16",
            "prompts": len(prompts),
            "positions": args.positions,
            "seconds": {"init_and_save": round(time.time() - t0, 2)},
        }
        with open(os.path.join(args.out, "info.json"), "w") as f:
            json.dump(info, f, indent=2)
        print(json.dumps(info))
        return

    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.time()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # The float32 reference must be float32 on the GPU too (no TF32 in its matmuls).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    shape = dict(SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    model_type = shape.pop("model_type")
    shape.setdefault("initializer_range", 0.02)
    shape.update(
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        use_cache=False,
    )
    config = AutoConfig.for_model(model_type, **shape)
    config._attn_implementation = args.attn
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)

    torch.manual_seed(args.seed)
    if device == "cuda":
        torch.cuda.manual_seed_all(args.seed)
    # Made in bf16 on the device: the 1.5B shape initialises in about a second on the GPU.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    # Only the parameters are bf16. Never `model.to(torch.bfloat16)`: that also rounds the
    # rotary embedding's float32 `inv_freq` buffer to bf16, and the reference's RoPE angles
    # then drift from the exact ones in proportion to the position (found by this check: the
    # logits' difference grew linearly from 0 at position 0 to 0.27 at 255).
    set_param_dtype(model, torch.bfloat16)
    check_rope_buffers(model)
    # transformers initialises norms to 1 and biases to 0, which would leave Pagoda's use of
    # them untested (a forward pass that skipped Qwen2's q/k/v biases or a norm's weight would
    # pass). Give them values of a trained model's order: norm weights ~ N(1, 0.2), biases
    # ~ N(0, 0.5) (q/k projections here are of std ~0.5-0.8, and Qwen2.5's k biases are larger).
    # And with q/k weights of std 0.02 every attention score is ~0 and attention averages
    # uniformly over the prefix, so a wrong RoPE or a wrong mask barely moves the logits; q/k
    # weights x QK_SCALE give scores of std ~3-6, attention that picks positions, as in a
    # trained model.
    gen = torch.Generator(device=device).manual_seed(args.seed + 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(QK_SCALE)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, device=device))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, device=device))
    n_params = sum(p.numel() for p in model.parameters())
    t_init = time.time()

    model.save_pretrained(model_dir, safe_serialization=True)
    build_tokenizer(config.vocab_size, model_dir)
    t_save = time.time()

    prompts = make_prompts(config.vocab_size, args.prompts, args.positions, args.seed)
    with open(os.path.join(args.out, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    if args.no_reference:
        info = {"shape": args.shape, "layers": config.num_hidden_layers, "parameters": n_params,
                "seed": args.seed, "backend": "torch", "device": device, "reference": None,
                "seconds": {"init": round(t_init - t0, 2), "save": round(t_save - t_init, 2)}}
        with open(os.path.join(args.out, "info.json"), "w") as f:
            json.dump(info, f, indent=2)
        print(json.dumps(info))
        return
    with torch.no_grad():
        ids = torch.tensor(prompts, dtype=torch.long, device=device)
        logits = model(input_ids=ids).logits  # bf16 [n, T, V]
        logits = logits.float().cpu().numpy()
        np.save(os.path.join(args.out, "reference.npy"), np.ascontiguousarray(logits, np.float32))
        t_ref = time.time()
        # The same bf16 weights run in float32: how far transformers' own bf16 arithmetic is
        # from exact (the noise floor any bf16 implementation, Pagoda's CUDA path included,
        # is compared against).
        set_param_dtype(model, torch.float32)
        check_rope_buffers(model)
        logits32 = model(input_ids=ids).logits.float().cpu().numpy()
        np.save(os.path.join(args.out, "reference_f32.npy"), np.ascontiguousarray(logits32))
    if device == "cuda":
        torch.cuda.synchronize()
    t_ref32 = time.time()

    stats = logit_stats(logits, prompts)
    info = {
        "shape": args.shape,
        "architecture": shape["architectures"][0],
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "parameters": n_params,
        "seed": args.seed,
        "backend": "torch",
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "attn_implementation": args.attn,
        "dtype": "bfloat16",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prompts": len(prompts),
        "positions": args.positions,
        "seconds": {
            "init": round(t_init - t0, 2),
            "save": round(t_save - t_init, 2),
            "reference": round(t_ref - t_save, 2),
            "reference_f32": round(t_ref32 - t_ref, 2),
        },
        "stats": stats,
    }
    with open(os.path.join(args.out, "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(json.dumps(info))
    problems = []
    if not stats["finite"]:
        problems.append("reference logits are not all finite")
    if min(stats["top1_distinct_per_prompt"]) <= 1:
        problems.append(
            f"a prompt's top-1 token is the same at every position "
            f"({stats['top1_distinct_per_prompt']}): degenerate logits"
        )
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
