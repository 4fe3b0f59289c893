#!/usr/bin/env python3
"""Tool calling and structured output against `pagoda serve` with a model trained for tools
(issue 22), through unmodified clients: the official `openai` client, the `ollama` client and
LangChain (`langchain-openai`).

Checks what an agent relies on: the model's calls arrive as `tool_calls` (whole and
streamed, reassembled by the SDK's own accumulator), a round trip (the test runs the tool,
the model answers with its result), `parse` with a Pydantic model, json_schema and Ollama
`format` schemas, and LangChain's `bind_tools` and `with_structured_output`.

The validity run: N json_schema requests at temperature 1.0, 16 at a time, must all parse
and validate with the `jsonschema` package; the same prompts without the constraint are
reported (not asserted) for comparison.

Usage: tools.py --pagoda target/debug/pagoda --model qwen2.5-coder:0.5b [--validity 50]
Exit status 0 when every check passed; each failure is printed.
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import ollama
import openai
from pydantic import BaseModel, Field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server, check, failures  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
RESULT = "21 C and sunny"
# The answer step of a round trip: a system prompt and `tool_choice: "none"`, as an agent's
# final-answer step. Qwen2.5-Coder-0.5B (and 1.5B) under `auto` write the same call again
# after a tool result, whatever the wording (measured: six phrasings, with and without a
# system prompt), so `auto` there would test the model, not the round trip.
SYSTEM = "You are a helpful assistant. When you have the information you need, answer the user in a sentence."


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population: int = Field(ge=0)


# The validity run's schema: required keys, bounded strings, an enum, an integer range, a
# bounded list, no other keys.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "job": {"type": "string", "enum": ["engineer", "teacher", "doctor", "artist", "farmer"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1, "maxItems": 3},
        "retired": {"type": "boolean"},
    },
    "required": ["name", "age", "job", "hobbies", "retired"],
    "additionalProperties": False,
}
PLACES = ["Lisbon", "Nairobi", "Osaka", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Perth", "Riga"]
TRAITS = ["young", "old", "cheerful", "quiet", "curious"]


def person_prompts(n):
    return [f"Invent a {TRAITS[i % len(TRAITS)]} person from {PLACES[i // len(TRAITS) % len(PLACES)]}. "
            f"Answer with JSON only, with the keys name, age, job (engineer, teacher, doctor, artist "
            f"or farmer), hobbies (a list) and retired (true or false)." for i in range(n)]


def json_of(text):
    """The JSON in a model's answer: the whole text, or a fenced block in it."""
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0]
    return json.loads(t)


def openai_checks(url, model):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def auto_call():
        r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert len(c.message.tool_calls) == 1, c.message
        call = c.message.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name == "get_weather"
        assert "paris" in json.loads(call.function.arguments)["city"].lower(), call.function.arguments

    def round_trip():
        asked = [{"role": "system", "content": SYSTEM}] + ASK
        r = client.chat.completions.create(model=model, messages=asked, tools=[WEATHER], temperature=0, max_tokens=80)
        call = r.choices[0].message.tool_calls[0]
        history = asked + [r.choices[0].message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
        r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], tool_choice="none",
                                           temperature=0, max_tokens=60)
        answer = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "stop" and "21" in answer, r.choices[0]

    def streamed_calls():
        # Forced, so the call is written in markup the parser streams: name first, then the
        # arguments in pieces; the SDK's accumulator must rebuild what the whole response has.
        kw = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
        pieces, indices, names = [], set(), []
        for chunk in client.chat.completions.create(stream=True, **kw):
            deltas = chunk.choices[0].delta.tool_calls if chunk.choices else None
            for d in deltas or []:
                indices.add(d.index)
                if d.function and d.function.name:
                    assert not pieces, "a name after arguments"
                    names.append(d.function.name)
                if d.function and d.function.arguments:
                    pieces.append(d.function.arguments)
        assert names == ["get_weather"] and indices == {0}, (names, indices)
        assert len(pieces) >= 2, f"arguments in one piece: {pieces}"
        with client.chat.completions.stream(**kw) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        whole = client.chat.completions.create(**kw)
        got = [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls]
        want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
        assert got == want == [("get_weather", "".join(pieces))], (got, want, pieces)
        # strict tools: the SDK parses the arguments into the declared shape.
        assert final.choices[0].message.tool_calls[0].function.parsed_arguments == json.loads(want[0][1])

    def named_function():
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello!"}],
                                           tools=[WEATHER], temperature=0, max_tokens=80,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        call = r.choices[0].message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    def parse_pydantic():
        r = client.beta.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Describe Paris."}],
                                               response_format=City, temperature=0, max_tokens=100)
        city = r.choices[0].message.parsed
        assert isinstance(city, City) and city.name, r.choices[0].message

    def json_schema():
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": person_prompts(1)[0]}],
                                           response_format=fmt, temperature=0, max_tokens=200)
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)

    def bad_input():
        cases = [
            (dict(tools=[{"type": "function", "function": {"parameters": {"type": "object"}}}]), "tools"),
            (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
            (dict(response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}}}),
             "response_format"),
        ]
        for extra, param in cases:
            try:
                client.chat.completions.create(model=model, messages=ASK, max_tokens=4, **extra)
                raise AssertionError(f"accepted: {extra}")
            except openai.BadRequestError as e:
                assert e.body["param"] == param, (extra, e.body)
        # ... and the server still answers.
        assert client.chat.completions.create(model=model, messages=ASK, max_tokens=2).choices

    for name, fn in [("openai tools auto", auto_call), ("openai tools round trip", round_trip),
                     ("openai streamed tool calls", streamed_calls), ("openai named function", named_function),
                     ("openai parse (pydantic)", parse_pydantic), ("openai json_schema", json_schema),
                     ("openai bad tools/schemas are 400s", bad_input)]:
        check(name, fn)


def ollama_checks(url, model):
    client = ollama.Client(host=url)

    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
          city: The city
        """
        return RESULT

    def chat_tools():
        for stream in (False, True):
            parts = client.chat(model=model, messages=ASK, tools=[get_weather], stream=stream,
                                options={"num_predict": 80, "temperature": 0})
            parts = list(parts) if stream else [parts]
            calls = [c for p in parts for c in p.message.tool_calls or []]
            assert [c.function.name for c in calls] == ["get_weather"], parts
            assert "paris" in calls[0].function.arguments["city"].lower(), calls

    def format_schema():
        r = client.chat(model=model, messages=[{"role": "user", "content": "Describe Paris."}],
                        format=City.model_json_schema(), options={"num_predict": 100, "temperature": 0})
        City.model_validate_json(r.message.content)

    for name, fn in [("ollama chat tools", chat_tools), ("ollama format schema", format_schema)]:
        check(name, fn)


def langchain_checks(url, model):
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="none", model=model, temperature=0, max_tokens=100)

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return RESULT

    def bind_tools_round_trip():
        bound = llm.bind_tools([get_weather])
        messages = [SystemMessage(SYSTEM), HumanMessage(ASK[0]["content"])]
        ai = bound.invoke(messages)
        assert [c["name"] for c in ai.tool_calls] == ["get_weather"], ai
        messages.append(ai)
        for call in ai.tool_calls:
            messages.append(get_weather.invoke(call))  # a ToolMessage with the call's id
        answer = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)
        assert not answer.tool_calls and "21" in answer.content, answer

    def structured_output():
        # json_schema (LangChain's default) constrains by the schema; function_calling forces a
        # call of a tool shaped like the model.
        for method in ("json_schema", "function_calling"):
            city = llm.with_structured_output(City, method=method).invoke("Describe Paris.")
            assert isinstance(city, City) and city.name, (method, city)

    for name, fn in [("langchain bind_tools round trip", bind_tools_round_trip),
                     ("langchain with_structured_output", structured_output)]:
        check(name, fn)


def validity(url, model, n):
    """N json_schema requests at temperature 1.0, 16 at a time: every answer must validate.
    The same prompts unconstrained are reported for comparison."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    def ask(prompt, constrained):
        kw = dict(response_format=fmt) if constrained else {}
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           temperature=1.0, max_tokens=200, **kw)
        try:
            jsonschema.validate(json_of(r.choices[0].message.content), PERSON)
            return True, r.choices[0].message.content
        except (ValueError, jsonschema.ValidationError):
            return False, r.choices[0].message.content

    rates = {}
    for constrained in (True, False):
        started = time.time()
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda p: ask(p, constrained), person_prompts(n)))
        valid = sum(ok for ok, _ in results)
        label = "json_schema" if constrained else "unconstrained"
        rates[label] = (valid, results)
        print(f"     {label}: {valid}/{n} valid ({time.time() - started:.0f} s)")

    def all_valid():
        valid, results = rates["json_schema"]
        bad = [text for ok, text in results if not ok]
        assert valid == n, f"{n - valid} invalid, e.g. {bad[:2]}"

    check(f"structured output validity ({n} json_schema requests at temperature 1.0)", all_valid)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagoda", required=True)
    p.add_argument("--model", default="qwen2.5-coder:0.5b")
    p.add_argument("--validity", type=int, default=50, help="json_schema requests in the validity run (0: skip)")
    p.add_argument("--only", choices=["openai", "ollama", "langchain", "validity"], help="run one group")
    a = p.parse_args()
    server = Server(a.pagoda, a.model, "--kv-cache-memory", "512MiB")
    try:
        groups = {"openai": lambda: openai_checks(server.url, a.model),
                  "ollama": lambda: ollama_checks(server.url, a.model),
                  "langchain": lambda: langchain_checks(server.url, a.model),
                  "validity": lambda: a.validity and validity(server.url, a.model, a.validity)}
        for name, run in groups.items():
            if a.only in (None, name):
                run()
    finally:
        server.stop()
    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all tool and structured-output checks passed")


if __name__ == "__main__":
    main()
