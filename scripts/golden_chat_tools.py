#!/usr/bin/env python3
"""Golden renderings of Qwen2.5's chat template with tools → tests/golden/chat_qwen25_tools.json.

The template is Qwen2.5's own (the `tokenizer.chat_template` of Qwen2.5-Coder-1.5B-Instruct's
GGUF, the same text as its tokenizer_config.json), given as --template FILE. Rendering is
scripts/reference/make_goldens.py's `render_like_transformers` (jinja2 set up as transformers
sets it up; checked against transformers' own renderer when it is installed).

Inputs are OpenAI request bodies (`tools`, `messages` with `tool_calls` whose `arguments` are
JSON strings, `tool` messages). The template gets them as transformers users and vLLM pass
them: `arguments` parsed into a dict. Pagoda holds JSON values without serde_json's
`preserve_order`, so a JSON Schema's keys reach the template sorted; the schemas here are
written with sorted keys so the two renderers see the same dicts (the `tools` entries' own
keys keep their order: type, function; name, description, parameters).

    python3 scripts/golden_chat_tools.py --template qwen25.jinja
"""

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
from make_goldens import render_like_transformers  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city (°C).",
        "parameters": {
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"], "type": "string"}},
            "required": ["city"],
            "type": "object",
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "description": "The time now."}}

ROUND_TRIP = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]

CASES = [
    ("tools_user_only", [WEATHER, NOW], [{"role": "user", "content": "Weather in Paris?"}]),
    ("tools_with_system", [WEATHER], [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]),
    ("round_trip", [WEATHER, NOW], ROUND_TRIP),
    ("history_without_tools", None, ROUND_TRIP + [{"role": "assistant", "content": "21°C, noon."}, {"role": "user", "content": "Thanks"}]),
]


def for_template(messages):
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True, type=Path)
    args = ap.parse_args()
    template = args.template.read_text().rstrip("\n")
    cases = []
    for name, tools, messages in CASES:
        special = {"bos_token": "", "eos_token": "<|im_end|>"}
        if tools is not None:
            special["tools"] = tools
        rendered = render_like_transformers(template, for_template(messages), True, **special)
        cases.append({"name": name, "tools": tools, "messages": messages, "rendered": rendered})
    out = {
        "chat_template_source": "Qwen2.5-Coder-1.5B-Instruct GGUF tokenizer.chat_template",
        "chat_template": template,
        "renderer": "jinja2 as transformers apply_chat_template(tools=...) (scripts/reference/make_goldens.py render_like_transformers); tool_calls arguments parsed to dicts",
        "cases": cases,
    }
    path = ROOT / "tests" / "golden" / "chat_qwen25_tools.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
