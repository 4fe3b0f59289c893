#!/usr/bin/env python3
"""Random-weight GGUFs of real model shapes for speed benchmarks against llama.cpp (issue 38:
Llama-3.1-8B and Qwen3-8B; issue 39: the mixture-of-experts Qwen3-30B-A3B and gpt-oss-20b; then
the hybrid Qwen3.5-4B beside the same-size transformer Qwen3-4B, for long-context decode).
The dense, hybrid and Qwen3-30B-A3B shapes are written by gguf-py (the vendored llama.cpp's) in
F16 (or, with `--q8-intermediate`, their matrices in gguf-py's Q8_0: half the disk, and the
quantizer requantizes) and quantized to Q4_K_M by llama.cpp's own quantizer
(llama_model_quantize); gpt-oss-20b is written directly in the types of llama.cpp's MXFP4_MOE
file type (see below). Both engines read one file. Files are named `<shape>-q4_k_m.gguf`, with
`-<n>l` after the shape when `--layers` cuts the depth.

The tokenizer is the real one. The dense shapes and Qwen3 copy the sdist's tokenizer-only files
(models/ggml-vocab-llama-bpe.gguf for Llama 3, ggml-vocab-qwen2.gguf for Qwen3), so
`pagoda bench model` and llama.cpp tokenize the benchmark prompt as with the real model.
Weights: N(0, 1/fan_in) (norms 1), so activations stay in range; speed does not depend on
values. `--layers` cuts the depth (every layer has the real shape; the benchmark's per-token
work is then the cut model's, which the record must say).

Qwen3-4B (llama.cpp arch `qwen3`; Qwen/Qwen3-4B's config.json: width 2560, 36 layers, 32 query
and 8 KV heads of 128, FFN 9728, theta 1e6, tied embeddings, so no output.weight) is written
whole: 2.5 GB in Q4_K_M, made with `--q8-intermediate` (a 4.2 GB intermediate instead of 7.9 GB
of F16, on a disk with ~11 GB free).

Qwen3.5-4B (llama.cpp arch `qwen35`, the hybrid) is written whole (32 layers, 2.71 GB in Q4_K_M;
the released Q4_K_M files are ~2.6 GB). Its shape: width 2560, FFN 9216, 32 layers of which every
4th (3, 7, ..., 31) is gated full attention (16 query and 4 KV heads of 256, attn_q holding per
head the query rows then the output-gate rows, q/k norms, partial rotary 0.25: 64 dims, theta
1e7, interleaved MRoPE sections 11/11/10) and the other 24 gated DeltaNet (16 key heads and 32
value heads of 128: attn_qkv [8192, 2560], attn_gate [4096, 2560], ssm_conv1d kernel 4 over
8192 channels, ssm_alpha/ssm_beta [32, 2560], ssm_a and ssm_dt per value head, ssm_norm over
128, ssm_out [2560, 4096]), post-attention norms, tied embeddings, eps 1e-6, context 262144,
vocab 248320. The Hugging Face config.json itself was not reachable here; the values come from
public GGUF dumps of Qwen/Qwen3.5-4B (huggingface/candle PR #3821's tensor listing: ffn 9216,
attn_q [2560, 8192]; quantumaikr/quant.cpp issue 94: 16/4 heads of 256, rope dims 64 and base
1e7, 32 value / 16 key heads of 128, conv 4, vocab 248320, full_attention_interval 4),
model cards derived from it (width 2560, 32 layers, 262144 context, vocab 248320), and the
converter's default MRoPE sections (conversion/qwen.py). The GGUF keys and tensors are the
converter's (Qwen3NextModel / Qwen3_5TextModel: ssm.{conv_kernel, state_size, group_count,
time_step_rank, inner_size}, attention.recurrent_layers, full_attention_interval,
rope.dimension_sections) and llama.cpp's loader's (src/models/qwen35.cpp). Values are the ones
the GGUF holds after the converter's transforms (tests/golden/tiny-qwen35.llamacpp.json's
gguf_layout): the (1 + w) norms stored as 1 + w are 1, ssm_norm 1, ssm_a = -exp(A_log) with A
log-spaced over [0.002, 1] per layer in a random order (as golden_families.py's qwen35_weights),
so every head's per-token decay exp(-A * softplus(alpha + dt_bias)) is in (0, 1), ssm_dt.bias
N(0, 0.5^2), ssm_conv1d F32 N(0, 1/4); llama.cpp (the VNNI peer build) decodes it with finite
logits of spread ~1. The tokenizer is the sdist's ggml-vocab-qwen35.gguf: llama.cpp's
`qwen35` pre-tokenizer over Qwen2's 151936 tokens and merges (the sdist has no copy of
Qwen3.5's own 248k-token vocabulary), padded with `[PAD<id>]` tokens of type UNUSED to the
config's 248320 (as the converter pads), so the embedding and LM head have the real shape; both
engines tokenize prompts alike, though not exactly as the released model would.

The MoE shape (llama.cpp arch `qwen3moe`) writes per layer a router `ffn_gate_inp` (F32, as the
converter keeps it and the quantizer leaves it; N(0, 1/fan_in) so tokens route differently) and
the stacked experts `ffn_{gate,up}_exps` [n_embd, n_ff_exp, n_expert] and `ffn_down_exps`
[n_ff_exp, n_embd, n_expert] (ggml order), which llama.cpp quantizes like dense FFN tensors.
Tensors are generated one at a time while writing, so memory stays near one tensor (an expert
stack is 0.4 GB in F16) although the F16 intermediate of the 6-layer MoE cut is 8.7 GB; it is
written next to the output and deleted after quantizing (about 7 minutes on 2 cores; the
Q4_K_M file is 2.65 GB).

gpt-oss-20b (llama.cpp arch `gpt-oss`; openai/gpt-oss-20b's config: width 2880, 64 query and
8 KV heads of 64, 32 experts of width 2880 with 4 used, sliding window 128 on even layers and full
attention on odd ones (llama.cpp's default pattern 2), attention sinks, YaRN factor 32 over 4096
with theta 150000, biases on q/k/v/o, the router and the experts) is written directly in the
types that llama.cpp's LLAMA_FTYPE_MOSTLY_MXFP4_MOE gives (llama-quant.cpp): the 3-D expert stacks
MXFP4; every other quantizable matrix Q8_0, token_embd and output included; the router, norms,
sinks and all biases F32, as the converter writes them. That is what ggml-org/gpt-oss-20b-GGUF's
12.1 GB file size implies (0.45 GB a layer, 1.23 GB for embeddings and output). The bytes are
random: MXFP4 blocks of uniform 4-bit codes under an E8M0 exponent drawn from the two that
bracket N(0, 1/fan_in)'s spread, Q8_0 blocks of uniform int8 codes under an F16 scale giving that
spread (no quantizer pass: the 8-layer file takes about a minute and 1.3 GB of memory). The
tokenizer is o200k_harmony, built as llama.cpp's converter would from gpt-oss's tokenizer.json
(the sdist has no gpt-oss vocab file): OpenAI's o200k_base ranks (the tiktoken file, checked
against its published SHA-256; the tiktoken-rs crate ships it, and `cargo fetch` brings it into
cargo's cache when absent; $PAGODA_O200K_TIKTOKEN overrides), byte-level tokens, merges recovered
by running BPE on each token with the ranks below its own, and the harmony specials
199998..201087 as control tokens (<|startoftext|> BOS, <|return|> EOS, <|endoftext|> pad, BOS
not added), pre-tokenizer `gpt-4o`, and the vendored gpt-oss chat template. llama.cpp tokenizes
the benchmark prompt (3632 tokens) exactly as tiktoken's o200k_base does. The cut is 8 layers
(4 sliding, 4 full; 4.86 GB): llama.cpp's CPU build repacks the MXFP4 experts into a buffer of
its own (mxfp4_8x8) beside the mapped file, so its peak RSS is 8.1 GB for this cut (1.7 times the
file); the full 24 layers would take it near 21 GB alone, and 12 layers near 12 GB, which with
Pagoda's copy leaves this shared 24 GiB machine too little. 8 layers keep both engines near
13 GB together.

    PY=/root/.venvs/pagoda-ref/bin/python
    $PY scripts/reference/make_bench_models.py llama31-8b --layers 8 -o /root/models/bench
    $PY scripts/reference/make_bench_models.py qwen3-8b --layers 8 -o /root/models/bench
    $PY scripts/reference/make_bench_models.py qwen3-30b-a3b --layers 6 -o /root/models/bench
    $PY scripts/reference/make_bench_models.py gpt-oss-20b --layers 8 -o /root/models/bench
        # -> gpt-oss-20b-8l-mxfp4.gguf
    $PY scripts/reference/make_bench_models.py qwen35-4b -o /root/models/bench
        # -> qwen35-4b-q4_k_m.gguf (F16 intermediate 8.4 GB; ~12 minutes on the shared 2 cores)
    $PY scripts/reference/make_bench_models.py qwen3-4b --q8-intermediate -o /root/models/bench
        # -> qwen3-4b-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

SDIST = Path(os.environ.get("PAGODA_LLAMA_SDIST",
                            "/work/cache/sdist/llama_cpp_python-0.3.36")) / "vendor" / "llama.cpp"
sys.path.insert(0, str(SDIST / "gguf-py"))

import numpy as np  # noqa: E402
import gguf  # noqa: E402

SHAPES = {
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama31-8b": dict(arch="llama", vocab="llama-bpe", layers=32, hidden=4096, heads=32,
                       kv_heads=8, head_dim=128, ffn=14336, theta=500000.0, eps=1e-5,
                       ctx=131072, qk_norm=False, llama3_rope=True),
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": dict(arch="qwen3", vocab="qwen2", layers=36, hidden=4096, heads=32, kv_heads=8,
                     head_dim=128, ffn=12288, theta=1000000.0, eps=1e-6, ctx=40960,
                     qk_norm=True, llama3_rope=False),
    # Qwen/Qwen3-4B config.json (tied embeddings: no output.weight, as the converter writes)
    "qwen3-4b": dict(arch="qwen3", vocab="qwen2", layers=36, hidden=2560, heads=32, kv_heads=8,
                     head_dim=128, ffn=9728, theta=1000000.0, eps=1e-6, ctx=40960,
                     qk_norm=True, llama3_rope=False, tied=True),
    # Qwen/Qwen3.5-4B's text config (see the module doc for where the values come from): the
    # hybrid, gated DeltaNet layers with gated full attention every 4th layer; head_dim 256 of
    # which partial_rotary_factor 0.25 rotates (interleaved MRoPE sections 11/11/10); the
    # tokenizer padded to the real vocab_size
    "qwen35-4b": dict(arch="qwen35", vocab="qwen35", n_vocab=248320, layers=32, hidden=2560,
                      heads=16, kv_heads=4, head_dim=256, ffn=9216, theta=10000000.0, eps=1e-6,
                      ctx=262144, qk_norm=True, llama3_rope=False, tied=True, rope_dim=64,
                      rope_sections=[11, 11, 10, 0],
                      linear=dict(interval=4, k_heads=16, v_heads=32, k_dim=128, v_dim=128,
                                  conv=4)),
    # Qwen/Qwen3-30B-A3B config.json: `ffn` is the unused dense intermediate_size, the experts'
    # width is moe_intermediate_size (norm_topk_prob is true; llama.cpp's qwen3moe hardcodes it)
    "qwen3-30b-a3b": dict(arch="qwen3moe", vocab="qwen2", layers=48, hidden=2048, heads=32,
                          kv_heads=4, head_dim=128, ffn=6144, theta=1000000.0, eps=1e-6,
                          ctx=40960, qk_norm=True, llama3_rope=False,
                          moe=dict(experts=128, used=8, ffn_exp=768)),
    # openai/gpt-oss-20b config.json: intermediate_size is the experts' width (the converter
    # writes it as both feed_forward_length and expert_feed_forward_length); layer_types
    # alternate sliding (even) / full (odd); rope_scaling yarn, truncate false
    "gpt-oss-20b": dict(arch="gpt-oss", vocab="o200k_harmony", layers=24, hidden=2880,
                        heads=64, kv_heads=8, head_dim=64, ffn=2880, theta=150000.0, eps=1e-5,
                        ctx=131072, qk_norm=False, llama3_rope=False,
                        moe=dict(experts=32, used=4, ffn_exp=2880),
                        sliding_window=128,
                        yarn=dict(factor=32.0, orig_ctx=4096, beta_fast=32.0, beta_slow=1.0)),
}


def copy_vocab(w: gguf.GGUFWriter, vocab_file: Path, pad_to: int | None = None) -> int:
    """Copies the vocab file's `tokenizer.*` keys; `pad_to` appends `[PAD{id}]` tokens of type
    UNUSED up to that many, as llama.cpp's converter pads a config vocab_size larger than the
    tokenizer (never produced by tokenizing; they only give the embedding its real rows)."""
    r = gguf.GGUFReader(str(vocab_file))
    n_vocab = 0
    n_file = len(r.fields["tokenizer.ggml.tokens"].data)
    pad = [] if pad_to is None else range(n_file, pad_to)
    for field in r.fields.values():
        name = field.name
        if not name.startswith("tokenizer."):
            continue
        t = field.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape")
                        for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            if name == "tokenizer.ggml.tokens":
                vals += [f"[PAD{i}]" for i in pad]
            elif name == "tokenizer.ggml.token_type":
                vals += [int(gguf.TokenType.UNUSED)] * len(pad)
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            v = field.parts[field.data[0]].tolist()[0]
            {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
             gguf.GGUFValueType.BOOL: w.add_bool, gguf.GGUFValueType.FLOAT32: w.add_float32,
             gguf.GGUFValueType.UINT64: w.add_uint64}[t](name, v)
    return n_vocab


# OpenAI's o200k_base ranks (tiktoken's published SHA-256 of the file); gpt-oss's o200k_harmony
# is these 199998 ranks plus the specials below, 201088 tokens in all
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_N_RANKS = 199998
HARMONY_N_VOCAB = 201088
HARMONY_SPECIALS = {
    199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>",
    200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>",
    200008: "<|message|>", 200012: "<|call|>", 200018: "<|endofprompt|>",
}


def o200k_file() -> Path:
    """The o200k_base.tiktoken file: $PAGODA_O200K_TIKTOKEN, else the copy that the tiktoken-rs
    crate ships in cargo's registry cache, fetched there by `cargo fetch` if absent."""
    env = os.environ.get("PAGODA_O200K_TIKTOKEN")
    if env:
        return Path(env)
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    pattern = "registry/src/*/tiktoken-rs-*/assets/o200k_base.tiktoken"
    found = sorted(cargo_home.glob(pattern))
    if not found:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "src").mkdir()
            (Path(tmp) / "src" / "main.rs").write_text("fn main() {}\n")
            (Path(tmp) / "Cargo.toml").write_text(
                '[package]\nname = "o200k-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
                '[dependencies]\ntiktoken-rs = "0.12"\n')
            subprocess.run(["cargo", "fetch"], cwd=tmp, check=True)
        found = sorted(cargo_home.glob(pattern))
    if not found:
        raise SystemExit(f"no {pattern} under {cargo_home}; set PAGODA_O200K_TIKTOKEN")
    return found[-1]


def byte_level_chars() -> list[str]:
    """GPT-2's byte-to-unicode table (the byte-level BPE alphabet that llama.cpp's `gpt2` vocab
    type decodes)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def o200k_harmony_vocab(w: gguf.GGUFWriter) -> int:
    """Writes gpt-oss's tokenizer as the llama.cpp converter would from its tokenizer.json."""
    path = o200k_file()
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise SystemExit(f"{path}: sha256 {digest}, expected o200k_base's {O200K_SHA256}")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    by_rank = sorted(ranks, key=ranks.__getitem__)
    assert [ranks[t] for t in by_rank] == list(range(O200K_N_RANKS))

    def split_below(token: bytes, max_rank: int) -> list[bytes]:
        # tiktoken's BPE on the token's bytes using only merges of lower rank: it stops at the
        # two parts whose merge made this token
        parts = [bytes([b]) for b in token]
        while True:
            best, at = max_rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best:
                    best, at = r, i
            if at < 0:
                return parts
            parts[at:at + 2] = [parts[at] + parts[at + 1]]

    chars = byte_level_chars()

    def text(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    merges = []
    for rank, token in enumerate(by_rank):
        if len(token) > 1:
            left, right = split_below(token, rank)
            merges.append(f"{text(left)} {text(right)}")
    tokens = [text(t) for t in by_rank]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for i in range(O200K_N_RANKS, HARMONY_N_VOCAB):
        tokens.append(HARMONY_SPECIALS.get(i, f"<|reserved_{i}|>"))
        types.append(gguf.TokenType.CONTROL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(199998)
    w.add_eos_token_id(200002)
    w.add_pad_token_id(199999)
    w.add_add_bos_token(False)
    w.add_chat_template((SDIST / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text())
    return len(tokens)


def llama3_factors(head_dim: int, theta: float) -> np.ndarray:
    """Llama 3.1's rope_freqs (factor 8, low 1, high 4, original 8192), as the converter writes."""
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# Qwen3.5's DeltaNet decay rates A = exp(A_log), as golden_families.py gives its tiny models
# (the released init, A ~ U(0.01, 16), forgets almost at once with random projections), and the
# spread of dt_bias
DECAY_A_MIN = 0.002
DECAY_A_MAX = 1.0
DT_BIAS_STD = 0.5

# spread of a uniform int8 code in [-127, 127], and the RMS of a uniform E2M1 code (|v| in
# 0, .5, 1, 1.5, 2, 3, 4, 6): a block's scale is the wanted spread over these
Q8_0_CODE_STD = math.sqrt(127 * 128 / 3)
E2M1_CODE_RMS = math.sqrt((0 + .25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8)
Q8_0 = gguf.GGMLQuantizationType.Q8_0
MXFP4 = gguf.GGMLQuantizationType.MXFP4


class Plan:
    """Tensors to write, made while writing in the declared order so memory holds one at a time
    and the random stream is the declared order's. Each entry: (name, numpy shape (ggml's
    reversed; for a quantized type the byte shape, uint8), numpy dtype, ggml type when quantized
    (else None), maker)."""

    def __init__(self, rng: np.random.Generator, q8: bool = False) -> None:
        self.rng = rng
        self.q8 = q8  # the F16 matrices written as Q8_0 instead (the quantizer requantizes)
        self.items: list[tuple[str, tuple[int, ...], type,
                               gguf.GGMLQuantizationType | None, Callable[[], np.ndarray]]] = []

    def mat(self, name: str, rows: int, cols: int, dtype: type = np.float16) -> None:
        """A [rows, cols] matrix N(0, 1/cols) (F16, or F32 where the converter keeps F32; F16
        ones as gguf-py's Q8_0 when the plan says so)."""
        if self.q8 and dtype == np.float16:
            def make_q8() -> np.ndarray:
                x = self.rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
                return gguf.quants.quantize(x, Q8_0)
            self.items.append((name, (rows, cols // 32 * 34), np.uint8, Q8_0, make_q8))
            return

        def make() -> np.ndarray:
            x = self.rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
            return x.astype(dtype)
        self.items.append((name, (rows, cols), dtype, None, make))

    def decays(self, name: str, n: int) -> None:
        """Gated DeltaNet `ssm_a` = -exp(A_log) (the converter's transform): A log-spaced over
        [DECAY_A_MIN, DECAY_A_MAX] in a random order, so each head's per-token decay
        exp(-A * softplus(alpha + dt_bias)) lies in (0, 1), from ~0.999 to ~0.3."""
        def make() -> np.ndarray:
            a = np.logspace(math.log10(DECAY_A_MIN), math.log10(DECAY_A_MAX), n)
            return (-a[self.rng.permutation(n)]).astype(np.float32)
        self.items.append((name, (n,), np.float32, None, make))

    def experts(self, name: str, n: int, rows: int, cols: int) -> None:
        def make() -> np.ndarray:
            out = np.empty((n, rows, cols), dtype=np.float16)
            for e in range(n):
                out[e] = self.rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
            return out
        self.items.append((name, (n, rows, cols), np.float16, None, make))

    def router(self, name: str, n: int, cols: int) -> None:
        def make() -> np.ndarray:
            x = self.rng.standard_normal((n, cols), dtype=np.float32) / np.sqrt(cols)
            return x.astype(np.float32)  # np.sqrt's float64 scalar promotes the division
        self.items.append((name, (n, cols), np.float32, None, make))

    def ones(self, name: str, n: int) -> None:
        self.items.append((name, (n,), np.float32, None, lambda: np.ones(n, dtype=np.float32)))

    def fixed(self, name: str, x: np.ndarray) -> None:
        self.items.append((name, x.shape, x.dtype.type, None, lambda: x))

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> None:
        """F32 N(0, std²): biases and sinks."""
        def make() -> np.ndarray:
            return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
        self.items.append((name, shape, np.float32, None, make))

    def q8_0(self, name: str, rows: int, cols: int) -> None:
        """A [rows, cols] matrix as Q8_0 blocks (F16 scale, 32 int8 codes) of spread
        1/sqrt(cols): uniform codes, each block's scale within ±25% of the mean."""
        nb = cols // 32

        def make() -> np.ndarray:
            out = np.empty((rows, nb, 34), dtype=np.uint8)
            scale = 1.0 / math.sqrt(cols) / Q8_0_CODE_STD
            d = (self.rng.uniform(0.75, 1.25, (rows, nb)) * scale).astype(np.float16)
            out[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
            out[:, :, 2:] = self.rng.integers(-127, 128, (rows, nb, 32), dtype=np.int8).view(
                np.uint8)
            return out.reshape(rows, nb * 34)
        self.items.append((name, (rows, nb * 34), np.uint8, Q8_0, make))

    def mxfp4_experts(self, name: str, n: int, rows: int, cols: int) -> None:
        """n stacked [rows, cols] matrices as MXFP4 blocks (E8M0 exponent, 16 bytes of 4-bit
        E2M1 codes): uniform codes, each block's exponent one of the two around spread
        1/sqrt(cols) (at random, so the mean square lands near it)."""
        nb = cols // 32
        e_lo = math.floor(127 + math.log2(1.0 / math.sqrt(cols) / E2M1_CODE_RMS))

        def make() -> np.ndarray:
            out = np.empty((n, rows, nb, 17), dtype=np.uint8)
            out[..., 0] = self.rng.integers(e_lo, e_lo + 2, (n, rows, nb), dtype=np.uint8)
            out[..., 1:] = self.rng.integers(0, 256, (n, rows, nb, 16), dtype=np.uint8)
            return out.reshape(n, rows, nb * 17)
        self.items.append((name, (n, rows, nb * 17), np.uint8, MXFP4, make))


def write_tensors(w: gguf.GGUFWriter, plan: Plan) -> None:
    for name, shape, dtype, raw, _ in plan.items:
        w.add_tensor_info(name, shape, np.dtype(dtype),
                          int(np.prod(shape)) * np.dtype(dtype).itemsize, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (name, shape, dtype, _, make) in enumerate(plan.items):
        x = make()
        assert x.shape == shape and x.dtype == dtype, name
        w.write_tensor_data(x)
        print(f"\r{k + 1}/{len(plan.items)} {name}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    w.close()


def gpt_oss_tensors(plan: Plan, s: dict, n_layers: int, n_vocab: int) -> None:
    """gpt-oss's tensors in MXFP4_MOE's types (see the module doc), with llama.cpp's names."""
    d, hd, moe = s["hidden"], s["head_dim"], s["moe"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    n_e, f = moe["experts"], moe["ffn_exp"]
    bias_std = 0.02
    plan.q8_0("token_embd.weight", n_vocab, d)
    plan.ones("output_norm.weight", d)
    plan.q8_0("output.weight", n_vocab, d)
    for i in range(n_layers):
        b = f"blk.{i}."
        plan.ones(b + "attn_norm.weight", d)
        plan.q8_0(b + "attn_q.weight", q, d)
        plan.normal(b + "attn_q.bias", (q,), bias_std)
        plan.q8_0(b + "attn_k.weight", kv, d)
        plan.normal(b + "attn_k.bias", (kv,), bias_std)
        plan.q8_0(b + "attn_v.weight", kv, d)
        plan.normal(b + "attn_v.bias", (kv,), bias_std)
        plan.q8_0(b + "attn_output.weight", d, q)
        plan.normal(b + "attn_output.bias", (d,), bias_std)
        plan.normal(b + "attn_sinks.weight", (s["heads"],), 1.0)
        plan.ones(b + "post_attention_norm.weight", d)
        plan.router(b + "ffn_gate_inp.weight", n_e, d)
        plan.normal(b + "ffn_gate_inp.bias", (n_e,), bias_std)
        plan.mxfp4_experts(b + "ffn_gate_exps.weight", n_e, f, d)
        plan.normal(b + "ffn_gate_exps.bias", (n_e, f), bias_std)
        plan.mxfp4_experts(b + "ffn_up_exps.weight", n_e, f, d)
        plan.normal(b + "ffn_up_exps.bias", (n_e, f), bias_std)
        plan.mxfp4_experts(b + "ffn_down_exps.weight", n_e, d, f)
        plan.normal(b + "ffn_down_exps.bias", (n_e, d), bias_std)


def is_recurrent(s: dict, layer: int) -> bool:
    """Whether a hybrid's layer is linear attention: all but every `interval`-th (llama.cpp's
    rule when `recurrent_layers` is absent, and Qwen3.5's layer_types)."""
    lin = s.get("linear")
    return lin is not None and (layer + 1) % lin["interval"] != 0


def qwen35_tensors(plan: Plan, s: dict, n_layers: int, n_vocab: int) -> None:
    """Qwen3.5's tensors with llama.cpp's names and the values the GGUF holds (see
    tests/golden/tiny-qwen35.llamacpp.json's gguf_layout): the (1 + w) norms stored as 1 + w = 1
    here, ssm_norm 1, ssm_a = -exp(A_log), ssm_conv1d F32 [conv_dim, kernel]; matrices F16 to
    be quantized. Full attention's attn_q holds per head the query rows then the gate rows."""
    d, hd, lin = s["hidden"], s["head_dim"], s["linear"]
    key_dim, value_dim = lin["k_heads"] * lin["k_dim"], lin["v_heads"] * lin["v_dim"]
    conv_dim = 2 * key_dim + value_dim
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    plan.mat("token_embd.weight", n_vocab, d)
    for i in range(n_layers):
        b = f"blk.{i}."
        plan.ones(b + "attn_norm.weight", d)
        if is_recurrent(s, i):
            plan.mat(b + "attn_qkv.weight", conv_dim, d)
            plan.mat(b + "attn_gate.weight", value_dim, d)
            plan.mat(b + "ssm_conv1d.weight", conv_dim, lin["conv"], dtype=np.float32)
            plan.normal(b + "ssm_dt.bias", (lin["v_heads"],), DT_BIAS_STD)
            plan.decays(b + "ssm_a", lin["v_heads"])
            plan.mat(b + "ssm_beta.weight", lin["v_heads"], d)
            plan.mat(b + "ssm_alpha.weight", lin["v_heads"], d)
            plan.ones(b + "ssm_norm.weight", lin["v_dim"])
            plan.mat(b + "ssm_out.weight", d, value_dim)
        else:
            plan.mat(b + "attn_q.weight", 2 * q, d)
            plan.mat(b + "attn_k.weight", kv, d)
            plan.mat(b + "attn_v.weight", kv, d)
            plan.mat(b + "attn_output.weight", d, q)
            plan.ones(b + "attn_q_norm.weight", hd)
            plan.ones(b + "attn_k_norm.weight", hd)
        plan.ones(b + "post_attention_norm.weight", d)
        plan.mat(b + "ffn_gate.weight", s["ffn"], d)
        plan.mat(b + "ffn_up.weight", s["ffn"], d)
        plan.mat(b + "ffn_down.weight", d, s["ffn"])
    plan.ones("output_norm.weight", d)


def float_tensors(plan: Plan, s: dict, n_layers: int, n_vocab: int) -> None:
    """The dense and qwen3moe shapes' tensors in F16 (F32 norms and router), to be quantized."""
    if s["arch"] == "qwen35":
        qwen35_tensors(plan, s, n_layers, n_vocab)
        return
    d, hd, moe = s["hidden"], s["head_dim"], s.get("moe")
    plan.mat("token_embd.weight", n_vocab, d)
    plan.ones("output_norm.weight", d)
    if not s.get("tied"):
        plan.mat("output.weight", n_vocab, d)
    if s["llama3_rope"]:
        plan.fixed("rope_freqs.weight", llama3_factors(hd, s["theta"]))
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    for i in range(n_layers):
        b = f"blk.{i}."
        plan.ones(b + "attn_norm.weight", d)
        plan.mat(b + "attn_q.weight", q, d)
        plan.mat(b + "attn_k.weight", kv, d)
        plan.mat(b + "attn_v.weight", kv, d)
        plan.mat(b + "attn_output.weight", d, q)
        if s["qk_norm"]:
            plan.ones(b + "attn_q_norm.weight", hd)
            plan.ones(b + "attn_k_norm.weight", hd)
        plan.ones(b + "ffn_norm.weight", d)
        if moe:
            n_e, f = moe["experts"], moe["ffn_exp"]
            plan.router(b + "ffn_gate_inp.weight", n_e, d)
            plan.experts(b + "ffn_gate_exps.weight", n_e, f, d)
            plan.experts(b + "ffn_up_exps.weight", n_e, f, d)
            plan.experts(b + "ffn_down_exps.weight", n_e, d, f)
        else:
            plan.mat(b + "ffn_gate.weight", s["ffn"], d)
            plan.mat(b + "ffn_up.weight", s["ffn"], d)
            plan.mat(b + "ffn_down.weight", d, s["ffn"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="cut the depth to this many layers")
    ap.add_argument("-o", "--out-dir", default="/root/models/bench")
    ap.add_argument("--q8-intermediate", action="store_true",
                    help="write the intermediate's matrices as Q8_0, not F16 (half the disk)")
    args = ap.parse_args()
    s = SHAPES[args.shape]
    n_layers = args.layers or s["layers"]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the depth is in the name only when cut
    stem = args.shape if n_layers == s["layers"] else f"{args.shape}-{n_layers}l"
    direct = s["arch"] == "gpt-oss"  # written in its final types, no quantizer pass
    f16 = out_dir / f"{stem}-{'q8_0' if args.q8_intermediate else 'f16'}.gguf"
    q4 = out_dir / f"{stem}-q4_k_m.gguf"
    final = out_dir / f"{stem}-mxfp4.gguf"
    first = final.with_name(final.name + ".part") if direct else f16
    rng = np.random.default_rng(0)

    w = gguf.GGUFWriter(str(first), s["arch"])
    w.add_name(stem)
    if s["vocab"] == "o200k_harmony":
        n_vocab = o200k_harmony_vocab(w)
    else:
        n_vocab = copy_vocab(w, SDIST / "models" / f"ggml-vocab-{s['vocab']}.gguf",
                             s.get("n_vocab"))
    d, hd = s["hidden"], s["head_dim"]
    w.add_block_count(n_layers)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(s.get("rope_dim", hd))
    if "rope_sections" in s:
        w.add_rope_dimension_sections(s["rope_sections"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_vocab_size(n_vocab)
    moe = s.get("moe")
    if moe:
        w.add_expert_count(moe["experts"])
        w.add_expert_used_count(moe["used"])
        w.add_expert_feed_forward_length(moe["ffn_exp"])
    lin = s.get("linear")
    if lin:
        # the converter's keys (Qwen3NextModel.set_gguf_parameters)
        w.add_ssm_conv_kernel(lin["conv"])
        w.add_ssm_state_size(lin["k_dim"])
        w.add_ssm_group_count(lin["k_heads"])
        w.add_ssm_time_step_rank(lin["v_heads"])
        w.add_ssm_inner_size(lin["v_dim"] * lin["v_heads"])
        w.add_recurrent_layers([is_recurrent(s, i) for i in range(n_layers)])
        w.add_full_attention_interval(lin["interval"])
    if "sliding_window" in s:
        w.add_sliding_window(s["sliding_window"])
    if "yarn" in s:
        y = s["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(y["factor"])
        w.add_rope_scaling_orig_ctx_len(y["orig_ctx"])
        w.add_rope_scaling_yarn_beta_fast(y["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(y["beta_slow"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if direct
                    else gguf.LlamaFileType.MOSTLY_Q8_0 if args.q8_intermediate
                    else gguf.LlamaFileType.MOSTLY_F16)

    plan = Plan(rng, q8=args.q8_intermediate and not direct)
    (gpt_oss_tensors if direct else float_tensors)(plan, s, n_layers, n_vocab)
    write_tensors(w, plan)
    if direct:
        first.replace(final)
        print(f"wrote {final} ({final.stat().st_size / 1e9:.2f} GB)")
        return
    print(f"wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    params.allow_requantize = args.q8_intermediate
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(q4).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed: {rc}")
    f16.unlink()
    print(f"wrote {q4} ({q4.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
