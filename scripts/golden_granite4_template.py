#!/usr/bin/env python3
"""Golden renderings of Granite 4.0's chat template (tests/golden/tiny-granite4h/
chat_template.jinja, IBM's, as the granite4h golden folder ships it) →
crates/pagoda-model/tests/golden/granite4h_chat_template.json, checked by pagoda-model's
`granite4_chat_template_renders_as_transformers` test.

The conversations and tools are scripts/golden_templates.py's (read from that file, so the two
stay one list). The renderer is jinja2 set up as transformers' `render_jinja_template` sets it up
(`ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks` and `loopcontrols`, `tojson`
as `json.dumps(ensure_ascii=False)`, `raise_exception`), with `add_generation_prompt=True`; only
jinja2 is needed, so it runs where transformers is not installed.

    python3 scripts/golden_granite4_template.py
"""

import json
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "golden" / "tiny-granite4h" / "chat_template.jinja"
OUT = ROOT / "crates" / "pagoda-model" / "tests" / "golden" / "granite4h_chat_template.json"


def golden_templates_inputs():
    """CONVERSATIONS, TOOLS and WITH_TOOLS of golden_templates.py, without importing
    transformers (its one import is dropped)."""
    path = ROOT / "scripts" / "golden_templates.py"
    source = path.read_text().replace(
        "from transformers.utils.chat_template_utils import render_jinja_template", "")
    names = {"__name__": "golden_templates", "__file__": str(path)}
    exec(compile(source, str(path), "exec"), names)
    return names["CONVERSATIONS"], names["TOOLS"], names["WITH_TOOLS"]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    conversations, tools, with_tools = golden_templates_inputs()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(TEMPLATE.read_text())
    cases = []
    for name, messages in conversations.items():
        given = tools if name in with_tools else None
        expected = template.render(messages=messages, tools=given, add_generation_prompt=True,
                                   bos_token="<|end_of_text|>", eos_token="<|end_of_text|>")
        cases.append({"conversation": name, "tools": given is not None, "expected": expected})
    OUT.write_text(json.dumps({
        "source": f"jinja2 {jinja2.__version__} set up as transformers' render_jinja_template "
                  "(scripts/golden_granite4_template.py)",
        "template": "tests/golden/tiny-granite4h/chat_template.jinja",
        "conversations_from": "chat_templates.json (scripts/golden_templates.py)",
        "cases": cases,
    }, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
