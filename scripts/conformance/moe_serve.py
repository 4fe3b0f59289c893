#!/usr/bin/env python3
"""Mixture-of-experts and hybrid models end to end (issues 39, 40): `pagoda serve` a tiny
random model and drive it with the official `openai` client: a streamed chat, `n=2` (whole
and streamed), and a tool call in the family's format, forced with `tool_choice`, whole and
streamed, the streamed call reassembled as a client does. `--family`:
- `qwen3moe` (tests/golden/tiny-qwen3moe, 8 experts, top 2): Qwen3's
  `<tool_call>{json}</tool_call>`;
- `qwen35moe` (tests/golden/tiny-qwen35moe: Qwen3.5's hybrid DeltaNet/attention layers, 8
  experts top 2 and a shared expert): Qwen3.5's `<tool_call><function=NAME><parameter=KEY>`
  markup, and `n=2` forks of the recurrent state;
- `gpt-oss` (tests/golden/tiny-gpt-oss: sinks, sliding windows, experts): a model whose
  template teaches harmony's calls, forced in the JSON form and parsed as such. The model's weights are random, so the
checks are of the serving path (shapes, counts, finish reasons, the call's name and valid
arguments), not of what it says.

The copy served has a compact chat template that renders tools (the golden's 256-token
context is too short for Pagoda's fallback tool prompt).

Usage: moe_serve.py --pagoda target/debug/pagoda [--family qwen3moe|qwen35moe]
Exit status 0 when every check passed; each failure is printed.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server, check, failures  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
GOLDENS = os.path.join(ROOT, "tests", "golden")

# ChatML with Qwen3's tool markup, in few tokens.
QWEN3_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\ntools:' }}{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% for m in messages %}"
    "{% if m.tool_calls %}{{ '<|im_start|>assistant\\n' }}{% for c in m.tool_calls %}"
    "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
    "'<|im_end|>\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ChatML with Qwen3.5's (and Qwen3-Coder's) tool markup, in few tokens.
QWEN35_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\ntools:' }}{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% for m in messages %}"
    "{% if m.tool_calls %}{{ '<|im_start|>assistant\\n' }}{% for c in m.tool_calls %}"
    "{{ '<tool_call>\\n<function=' + c.function.name + '>\\n' }}"
    "{% for k, v in c.function.arguments.items() %}"
    "{{ '<parameter=' + k + '>\\n' + v | string + '\\n</parameter>\\n' }}{% endfor %}"
    "{{ '</function>\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
    "'<|im_end|>\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# gpt-oss's harmony messages with tools, in few tokens: a call is a commentary message to
# functions.NAME.
HARMONY_TEMPLATE = (
    "{% if tools %}{{ '<|start|>developer<|message|>tools:' }}{% for t in tools %}"
    "{{ ' functions.' + t.function.name }}{% endfor %}{{ '<|end|>' }}{% endif %}"
    "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "{{ '<|start|>assistant<|channel|>commentary to=functions.' + c.function.name + "
    "' <|constrain|>json<|message|>' + c.function.arguments | tojson + '<|call|>' }}{% endfor %}"
    "{% elif m.role == 'assistant' %}{% if m.thinking %}{{ '<|start|>assistant<|channel|>analysis"
    "<|message|>' + m.thinking + '<|end|>' }}{% endif %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + "
    "m.content + '<|end|>' }}{% else %}{{ '<|start|>' + m.role + '<|message|>' + m.content + "
    "'<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}"
    "{% endif %}"
)

FAMILIES = {"qwen3moe": ("tiny-qwen3moe", QWEN3_TEMPLATE, "Qwen3 <tool_call>{json}"),
            "qwen35moe": ("tiny-qwen35moe", QWEN35_TEMPLATE, "Qwen3.5 <function=...>"),
            "gpt-oss": ("tiny-gpt-oss", HARMONY_TEMPLATE, "harmony, forced in the JSON form")}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def served_copy(tmp, family):
    golden, template, _ = FAMILIES[family]
    model = os.path.join(tmp, golden)
    os.mkdir(model)
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(GOLDENS, golden, f), model)
    with open(os.path.join(model, "chat_template.jinja"), "w") as f:
        f.write(template)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3moe")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(args.pagoda, served_copy(tmp, args.family))
        try:
            run(openai.OpenAI(base_url=server.url + "/v1", api_key="none"),
                FAMILIES[args.family][2])
        finally:
            server.stop()
    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all checks passed")


def run(client, call_format):
    # The id the server gives the model it serves by path.
    model = client.models.list().data[0].id
    print(f"model id: {model}")

    def streamed_chat():
        text, finish = "", None
        for chunk in client.chat.completions.create(
                model=model, messages=ASK, max_tokens=8, temperature=0, stream=True):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert finish in ("stop", "length"), finish
        assert text, "no text streamed"

    def two_choices():
        r = client.chat.completions.create(model=model, messages=ASK, max_tokens=6, n=2,
                                           temperature=1.0, seed=7)
        assert sorted(c.index for c in r.choices) == [0, 1], r
        assert all(c.message.content for c in r.choices), r
        assert r.usage.completion_tokens >= 2, r.usage

    def two_choices_streamed():
        seen = {0: "", 1: ""}
        for chunk in client.chat.completions.create(model=model, messages=ASK, max_tokens=6, n=2,
                                                    temperature=1.0, stream=True):
            for c in chunk.choices:
                seen[c.index] += c.delta.content or ""
        assert all(seen.values()), seen

    def forced_call():
        r = client.chat.completions.create(
            model=model, messages=ASK, tools=[WEATHER], max_tokens=190, temperature=0,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", r
        args = json.loads(calls[0].function.arguments)
        assert isinstance(args.get("city"), str), args
        assert r.choices[0].finish_reason == "tool_calls", r

    def forced_call_streamed():
        name, arguments, finish = "", "", None
        for chunk in client.chat.completions.create(
                model=model, messages=ASK, tools=[WEATHER], max_tokens=190, temperature=0,
                tool_choice="required", stream=True):
            for c in chunk.choices:
                for t in c.delta.tool_calls or []:
                    name += t.function.name or ""
                    arguments += t.function.arguments or ""
                finish = c.finish_reason or finish
        assert name == "get_weather", name
        assert isinstance(json.loads(arguments).get("city"), str), arguments
        assert finish == "tool_calls", finish

    check("streamed chat", streamed_chat)
    check("n=2", two_choices)
    check("n=2 streamed", two_choices_streamed)
    check(f"a forced tool call ({call_format})", forced_call)
    check("a forced tool call, streamed and reassembled", forced_call_streamed)


if __name__ == "__main__":
    main()
