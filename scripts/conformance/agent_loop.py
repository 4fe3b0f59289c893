#!/usr/bin/env python3
"""Agent loops against `pagoda serve` through the official `openai` client (issue 38): does the
catalog's tool model finish what an agent asks of it?

Two tools (a weather lookup and a currency converter) and five questions, each needing one
call. Each loop runs as an agent framework runs it, `tool_choice` left at `auto` on every step:
ask, the model calls a tool, the script runs the tool and sends its result back, the model
answers or calls again (at most --max-steps model turns). A loop *finishes* when its last
assistant message is text (no further call) that states the tool result's distinctive value
(an odd temperature or amount the fake tool made up, so the model cannot know it otherwise),
after a call of the right tool; a reply that is only JSON (an echoed result or a call written
as text) does not count.

Usage: agent_loop.py --pagoda target/debug/pagoda --model qwen2.5-coder:1.5b [--min-finished 4]
Prints one line per loop and a table row; exit status 1 when fewer than --min-finished loops
finish (or the server does not start).
"""

import argparse
import json
import os
import re
import sys
import time

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city: temperature in degrees Celsius and conditions",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city name"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another at today's exchange rate",
        "parameters": {"type": "object",
                       "properties": {"amount": {"type": "number", "description": "The amount to convert"},
                                      "from_currency": {"type": "string", "description": "ISO code, e.g. USD"},
                                      "to_currency": {"type": "string", "description": "ISO code, e.g. EUR"}},
                       "required": ["amount", "from_currency", "to_currency"]}}},
]

# Made-up, deliberately odd values: a model that states one has read it from the tool result.
WEATHER = {"lisbon": (23.7, "sunny"), "oslo": (-4.6, "light snow"), "nairobi": (26.1, "partly cloudy")}
RATES = {("USD", "CHF"): 0.8117, ("GBP", "EUR"): 1.1648}

# (question, the tool it needs, the value its answer must state)
QUESTIONS = [
    ("What is the weather like in Lisbon right now?", "get_weather", "23.7"),
    ("Is it cold in Oslo today?", "get_weather", "-4.6"),
    ("How warm is it in Nairobi at the moment?", "get_weather", "26.1"),
    ("How many Swiss francs do I get for 120 US dollars today?", "convert_currency", "97.40"),
    ("Convert 80 British pounds to euros.", "convert_currency", "93.18"),
]

# An agent's system message. Measured with Qwen2.5-Coder-1.5B (docs/benchmarks.md, "Agent
# loops"): without one the model calls the tool again after every result (0/5); telling it
# only to answer with the numbers leaves it explaining calls instead of making them (2/5);
# saying when to call and when to stop, as this does, finishes every loop.
SYSTEM = ("You are a helpful assistant with tools. Call a tool when you need live data you do "
          "not have yet. Once a tool result is in the conversation, do not call the tool again: "
          "answer the user in one or two sentences, stating the numbers from the result.")


def run_tool(name, arguments):
    """The fake tools: a JSON result for the model, or a JSON error it can read."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as e:
        return json.dumps({"error": f"arguments are not JSON: {e}"})
    if name == "get_weather":
        city = str(args.get("city", "")).split(",")[0].strip()
        if city.lower() not in WEATHER:
            return json.dumps({"error": f"unknown city {city!r}"})
        temp, sky = WEATHER[city.lower()]
        return json.dumps({"city": city, "temperature_c": temp, "conditions": sky})
    if name == "convert_currency":
        src = str(args.get("from_currency", "")).upper()
        dst = str(args.get("to_currency", "")).upper()
        try:
            amount = float(args.get("amount"))
        except (TypeError, ValueError):
            return json.dumps({"error": "amount must be a number"})
        if (src, dst) not in RATES:
            return json.dumps({"error": f"no rate for {src} to {dst}"})
        rate = RATES[(src, dst)]
        return json.dumps({"amount": amount, "from": src, "to": dst, "rate": rate,
                           "result": f"{amount * rate:.2f}"})
    return json.dumps({"error": f"unknown tool {name!r}"})


def states(text, value):
    """Whether `text` states `value` (thousands separators and a sign's spelling aside)."""
    flat = text.replace(",", "").replace("\u2212", "-").replace("minus ", "-")
    return re.search(r"(?<![\d.])" + re.escape(value) + r"(?!\d)", flat) is not None


def only_json(text):
    """Whether `text` is nothing but JSON values (an echoed result, calls written as text)."""
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0].strip()
    decoder, at, values = json.JSONDecoder(), 0, 0
    while at < len(t):
        try:
            _, end = decoder.raw_decode(t, at)
        except json.JSONDecodeError:
            return False
        values += 1
        at = end
        while at < len(t) and t[at].isspace():
            at += 1
    return values > 0


def loop(client, model, question, tool, value, max_steps, max_tokens, system):
    """One agent loop; returns (finished, model turns, the last reply, what went wrong)."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    called = False
    for step in range(1, max_steps + 1):
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           temperature=0, max_tokens=max_tokens)
        msg = r.choices[0].message
        if msg.tool_calls:
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                called = called or call.function.name == tool
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": run_tool(call.function.name, call.function.arguments)})
            continue
        text = msg.content or ""
        if r.choices[0].finish_reason != "stop":
            return False, step, text, f"finish_reason {r.choices[0].finish_reason}"
        if not called:
            return False, step, text, "answered without calling " + tool
        if only_json(text):
            return False, step, text, "the answer is only JSON"
        if not states(text, value):
            return False, step, text, f"the answer does not state {value}"
        return True, step, text, ""
    return False, max_steps, "", f"still calling tools after {max_steps} turns"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagoda", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--min-finished", type=int, default=4, help="loops that must finish (of 5)")
    p.add_argument("--max-steps", type=int, default=4, help="model turns per loop")
    p.add_argument("--max-tokens", type=int, default=256, help="per model turn")
    p.add_argument("--system", default=SYSTEM, help="system message ('' for none)")
    a = p.parse_args()
    started = time.time()
    server = Server(a.pagoda, a.model, "--kv-cache-memory", "512MiB")
    finished = 0
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        loops_started = time.time()
        for question, tool, value in QUESTIONS:
            t0 = time.time()
            try:
                ok, steps, text, why = loop(client, a.model, question, tool, value,
                                            a.max_steps, a.max_tokens, a.system)
            except Exception as e:  # noqa: BLE001 - an error ends this loop, not the run
                ok, steps, text, why = False, 0, "", f"{type(e).__name__}: {e}"
            finished += ok
            shown = " ".join(text.split())[:160]
            print(f"{'ok  ' if ok else 'FAIL'} {question!r}: {steps} turn(s), {time.time() - t0:.1f} s"
                  f"{'' if ok else ' - ' + why}; reply: {shown!r}")
        loops_s = time.time() - loops_started
    finally:
        server.stop()
    print(f"| {a.model} | {finished}/{len(QUESTIONS)} | {loops_s:.0f} s loops, "
          f"{time.time() - started:.0f} s with start |")
    if finished < a.min_finished:
        print(f"agent loops: {finished}/{len(QUESTIONS)} finished, {a.min_finished} required")
        sys.exit(1)
    print(f"agent loops: {finished}/{len(QUESTIONS)} finished")


if __name__ == "__main__":
    main()
