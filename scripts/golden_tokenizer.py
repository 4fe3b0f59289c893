#!/usr/bin/env python3
"""Golden token ids and chat-template renders for pagoda-model's tests.

References (none of them ours):
  * token ids: llama.cpp's own tokenizer, through llama-cpp-python, on the very GGUF files the
    tests read. The model is opened with vocab_only=True: tokenizing needs no weights, and it
    sidesteps the crash at first generation that DESIGN.md records for llama-cpp-python on
    this CPU. `special=True` parses "<|im_start|>"-style text as the control token, as
    `Tokenizer::encode` does; `add_bos=True` adds BOS only when the GGUF asks for it
    (tokenizer.ggml.add_bos_token), which is what `encode(text, true)` must do.
  * chat templates: transformers' `render_jinja_template` (Python jinja2 with transformers'
    environment: trim_blocks, lstrip_blocks, tojson, raise_exception, strftime_now), fed the
    GGUF's tokenizer.chat_template, or Pagoda's built-in ChatML fallback when the GGUF has
    none (Gemma 3 270M base ships none). The fallback source is written into the JSON so the
    Rust test can check it is the same text as CHATML_TEMPLATE.

Install: pip install llama-cpp-python==0.3.16 transformers gguf  (no torch needed)
Usage:   python3 scripts/golden_tokenizer.py --smollm2 PATH.gguf --gemma3 PATH.gguf \
             --out crates/pagoda-model/tests/golden
"""

import argparse
import hashlib
import json
import os

import gguf
from llama_cpp import Llama
from transformers.utils.chat_template_utils import render_jinja_template

# Keep in sync with pagoda_model::chat_template::CHATML_TEMPLATE (the test checks it).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

COMMON = [
    "Hello world",
    " leading space",
    "  two  spaces   three    ",
    "line1\nline2\n\nline4\n\n\n",
    "tabs\tand\r\nCRLF\r\n",
    "héllo wörld café naïve Ångström",
    "日本語のテキスト、中文字符。한국어",
    "emoji 🦀🔥👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷",
    "digits 1234567890 3.14159 1,000,000 and 2024-12-02",
    "code: fn main() { println!(\"hi {}\", x[0]); } // <tag> &amp;",
    "don't you're I'll WE'VE it's",
    "",
    " ",
    "\n",
    "a",
]
SPECIAL = {
    "smollm2": [
        "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more",
    ],
    "gemma3": [
        "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text<eos>",
    ],
}

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    [
        {"role": "user", "content": "  Hi!  \nHow are you? 🦀"},
        {"role": "assistant", "content": "Fine, thanks."},
        {"role": "user", "content": "Tell me a joke."},
    ],
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def field_str(reader, key):
    f = reader.fields.get(key)
    return None if f is None else bytes(f.parts[f.data[0]]).decode("utf-8")


def token_text(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return ""
    tid = int(f.parts[f.data[0]][0])
    toks = reader.fields["tokenizer.ggml.tokens"]
    return bytes(toks.parts[toks.data[tid]]).decode("utf-8")


def golden(name, path):
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    cases = []
    for text in COMMON + SPECIAL[name]:
        b = text.encode("utf-8")
        ids = llm.tokenize(b, add_bos=False, special=True)
        with_special = llm.tokenize(b, add_bos=True, special=True)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_add_special": with_special,
            # llama.cpp's detokenization of the plain ids (no control tokens in COMMON texts).
            "detokenized": llm.detokenize(ids).decode("utf-8", errors="replace")
            if text in COMMON else None,
        })

    reader = gguf.GGUFReader(path)
    template = field_str(reader, "tokenizer.chat_template")
    source = "gguf" if template is not None else "chatml-fallback"
    template = template if template is not None else CHATML_TEMPLATE
    bos = token_text(reader, "tokenizer.ggml.bos_token_id")
    eos = token_text(reader, "tokenizer.ggml.eos_token_id")
    chats = []
    for messages in CONVERSATIONS:
        for add_gen in (False, True):
            rendered, _ = render_jinja_template(
                conversations=[messages],
                chat_template=template,
                add_generation_prompt=add_gen,
                bos_token=bos,
                eos_token=eos,
            )
            chats.append({
                "messages": messages,
                "add_generation_prompt": add_gen,
                "rendered": rendered[0],
            })
    return {
        "model": os.path.basename(path),
        "sha256": sha256(path),
        "reference": "llama.cpp tokenizer via llama-cpp-python (vocab_only); transformers render_jinja_template",
        "cases": cases,
        "chat": {"template_source": source, "template": template, "bos_token": bos,
                 "eos_token": eos, "renders": chats},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", required=True)
    ap.add_argument("--gemma3", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, path in (("smollm2", a.smollm2), ("gemma3", a.gemma3)):
        data = golden(name, path)
        with open(os.path.join(a.out, f"{name}_tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(name, len(data["cases"]), "cases")


if __name__ == "__main__":
    main()
