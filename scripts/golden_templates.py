#!/usr/bin/env python3
"""Golden renderings of the families' real chat templates → crates/pagoda-model/tests/golden/
chat_templates.json, checked by pagoda-model's `chat_template_goldens` test.

The templates are llama.cpp's `models/templates/*.jinja` (the llama-cpp-python 0.3.36 sdist),
copied into crates/pagoda-model/tests/golden/templates/. Each is rendered with transformers'
own renderer (`transformers.utils.chat_template_utils.render_jinja_template`, what
`apply_chat_template(tokenize=False)` calls) for every conversation below, with and without
`enable_thinking` (True and False where the template reads it) and `reasoning_effort` ("low" and
"high" where the template reads it: gpt-oss), always with
`add_generation_prompt=True`. A render the template refuses (`raise_exception`, a bad role) is
recorded as `null`: Pagoda must refuse it too.

Inputs are the dicts Pagoda passes: a message's `content` is always a string; `tool_calls`,
`tool_call_id`, `name` and `reasoning_content` appear only where set; a call's `arguments` is a
JSON value (transformers' users and vLLM pass it parsed). `date_string` is passed as a template
keyword (as `chat_template_kwargs` does) so the Llama 3.x renders do not depend on today; the day
of the render is recorded as `rendered_on` for the templates that write today's date anyway
(gpt-oss's `strftime_now`).

    /root/.venvs/pagoda-ref/bin/python scripts/golden_templates.py
"""

import datetime
import json
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "crates" / "pagoda-model" / "tests" / "golden"
TEMPLATES = GOLDEN / "templates"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER]

CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
}

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hello!"}],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello!"},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello. What do you need?"},
        {"role": "user", "content": "A joke."},
    ],
    "reasoning_history": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "tools": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
    ],
    "tool_result": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call12345", "name": "get_weather"},
    ],
    "tool_result_answered": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call12345", "name": "get_weather"},
        {"role": "assistant", "content": "21 degrees."},
        {"role": "user", "content": "Thanks!"},
    ],
}
WITH_TOOLS = {"tools", "tool_result", "tool_result_answered"}


def render(source, messages, tools, kwargs):
    try:
        out, _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source,
            add_generation_prompt=True,
            bos_token="<BOS>",
            eos_token="<EOS>",
            **kwargs,
        )
        return out[0]
    except Exception as e:  # the template refused the conversation
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    cases = []
    for path in sorted(TEMPLATES.glob("*.jinja")):
        source = path.read_text()
        switches = [None]
        if "enable_thinking" in source:
            switches += [True, False]
        efforts = [None]
        if "reasoning_effort" in source:
            efforts += ["low", "high"]
        for name, messages in CONVERSATIONS.items():
            tools = TOOLS if name in WITH_TOOLS else None
            for thinking, effort in [(t, e) for t in switches for e in efforts]:
                kwargs = {"date_string": "26 Jul 2024"}
                if thinking is not None:
                    kwargs["enable_thinking"] = thinking
                if effort is not None:
                    kwargs["reasoning_effort"] = effort
                expected = render(source, messages, tools, kwargs)
                cases.append(
                    {
                        "template": path.name,
                        "conversation": name,
                        "tools": tools is not None,
                        "kwargs": kwargs,
                        "expected": None if isinstance(expected, dict) else expected,
                        "refusal": expected["error"] if isinstance(expected, dict) else None,
                    }
                )
    # gpt-oss's template writes `strftime_now("%Y-%m-%d")`: the test puts its own day in place
    # of this one.
    rendered_on = datetime.datetime.now().strftime("%Y-%m-%d")
    golden = {"tools": TOOLS, "conversations": CONVERSATIONS, "rendered_on": rendered_on, "cases": cases}
    (GOLDEN / "chat_templates.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    refused = sum(c["expected"] is None for c in cases)
    print(f"{len(cases)} renders ({refused} refused by their template)")


if __name__ == "__main__":
    main()
