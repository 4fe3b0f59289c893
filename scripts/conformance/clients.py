#!/usr/bin/env python3
"""Conformance of `pagoda serve` with the official `openai` and `ollama` Python clients.

Starts real servers on loopback with a real model and checks that unmodified clients work:
sync, async and streaming chat and completions, usage, models, the error classes the SDK
raises for 400/404/429, and the Ollama client's generate/chat/list/ps/show.

Usage: clients.py --pagoda target/debug/pagoda --model smollm2:135m
Exit status 0 when every check passed; each failure is printed.
"""

import argparse
import asyncio
import json
import os
import sys

import ollama
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server, check, failures  # noqa: E402



def openai_checks(url, model, embed_model):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "What is the capital of France?"}]

    def chat():
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
        assert r.object == "chat.completion"
        assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 12
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    def chat_stream():
        whole = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True})
        text, usage, finishes = "", None, 0
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finishes += c.finish_reason is not None
        assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
        assert finishes == 1
        assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    def n_and_logprobs():
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=5, n=2, seed=7, temperature=0.9,
            logprobs=True, top_logprobs=3)
        assert len(r.choices) == 2
        for c in r.choices:
            assert c.logprobs.content and all(len(t.top_logprobs) == 3 for t in c.logprobs.content)
            assert all(t.logprob <= 0 for t in c.logprobs.content)

    def completions():
        r = client.completions.create(model=model, prompt="The sky is", max_tokens=6, temperature=0, stop=["\n\n"])
        assert r.object == "text_completion" and isinstance(r.choices[0].text, str)
        assert r.usage.completion_tokens <= 6
        s = client.completions.create(model=model, prompt="The sky is", max_tokens=6, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text

    def models():
        ids = [m.id for m in client.models.list()]
        assert model in ids, ids

    def async_clients():
        async def run():
            a = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            rs = await asyncio.gather(*[
                a.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": f"Say {i}"}])
                for i in range(4)])
            assert all(r.choices[0].message.content is not None for r in rs)
            s = await a.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True)
            n = 0
            async for _ in s:
                n += 1
            assert n >= 2
        asyncio.run(run())

    def errors():
        try:
            client.chat.completions.create(model=model, messages=messages, temperature=5)
            raise AssertionError("temperature 5 was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and "temperature" in str(e)
        try:
            client.chat.completions.create(model=model, messages=messages, max_tokens=10**7)
            raise AssertionError("max_tokens over the context was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400
        try:
            client.chat.completions.create(model="no-such-model:1b", messages=messages)
            raise AssertionError("an unknown model was accepted")
        except openai.NotFoundError as e:
            assert e.status_code == 404

    def embeddings():
        if not embed_model:
            return
        r = client.embeddings.create(model=embed_model, input=["hello world", "a second text"])
        assert len(r.data) == 2 and len(r.data[0].embedding) == 384
        norm = sum(x * x for x in r.data[0].embedding) ** 0.5
        assert abs(norm - 1) < 1e-4, norm
        f = client.embeddings.create(model=embed_model, input="hello world", encoding_format="float")
        assert max(abs(a - b) for a, b in zip(f.data[0].embedding, r.data[0].embedding)) < 1e-6
        assert r.usage.prompt_tokens > 0

    weather = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

    def tools():
        # Whatever the model answers, the SDK parses it: content and/or tool_calls with JSON
        # arguments; finish_reason tool_calls only with calls, stop only without; a reply cut
        # by max_tokens is length even after a complete call (the next may have been cut).
        # `required` with parallel_tool_calls false is exactly one call, then tool_calls.
        for choice in ("auto", "required"):
            r = client.chat.completions.create(model=model, messages=messages, tools=weather,
                                               tool_choice=choice, max_tokens=40, temperature=0,
                                               parallel_tool_calls=choice == "auto")
            m, finish = r.choices[0].message, r.choices[0].finish_reason
            calls = m.tool_calls or []
            assert finish in ("tool_calls", "stop", "length"), r
            assert finish != "tool_calls" or calls, r
            assert finish != "stop" or not calls, r
            if choice == "required":
                assert finish == "tool_calls" and len(calls) == 1, r
            for c in calls:
                assert c.id.startswith("call_") and c.type == "function" and c.function.name
                json.loads(c.function.arguments)
            assert calls or isinstance(m.content, str)
        # A round trip: the call, its result, and the model's answer.
        history = messages + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"}]
        r = client.chat.completions.create(model=model, messages=history, tools=weather, max_tokens=12)
        assert r.choices[0].message.role == "assistant"
        # A tool result for no call is a 400 naming messages.
        try:
            client.chat.completions.create(model=model, tools=weather, max_tokens=4, messages=messages + [
                {"role": "tool", "tool_call_id": "call_nope", "content": "x"}])
            raise AssertionError("a tool result for no call was accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == "messages", e.body

    def tools_stream():
        # The SDK's stream helper accumulates tool call pieces by index (and parses the
        # arguments of `strict` tools).
        strict = [{"type": "function", "function": dict(weather[0]["function"], strict=True)}]
        strict[0]["function"]["parameters"] = dict(weather[0]["function"]["parameters"], additionalProperties=False)
        with client.chat.completions.stream(model=model, messages=messages, tools=strict,
                                            max_tokens=40, temperature=0) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        whole = client.chat.completions.create(model=model, messages=messages, tools=strict,
                                               max_tokens=40, temperature=0)
        a, b = final.choices[0].message, whole.choices[0].message
        assert (a.content or "") == (b.content or ""), (a.content, b.content)
        assert [(c.function.name, c.function.arguments) for c in a.tool_calls or []] == \
            [(c.function.name, c.function.arguments) for c in b.tool_calls or []]

    for name, fn in [("openai tools", tools), ("openai tools stream", tools_stream),
                     ("openai chat", chat), ("openai chat stream + usage", chat_stream),
                     ("openai n + logprobs", n_and_logprobs), ("openai completions", completions),
                     ("openai models", models), ("openai async", async_clients),
                     ("openai errors 400/404", errors), ("openai embeddings", embeddings)]:
        check(name, fn)


def rate_limit_check(url, model):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def limited():
        first = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a long story."}],
            max_tokens=200, stream=True, extra_body={"ignore_eos": True})
        next(iter(first))
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            raise AssertionError("the second request was not refused")
        except openai.RateLimitError as e:
            assert e.status_code == 429
            assert e.response.headers.get("retry-after") is not None
        finally:
            first.close()

    check("openai 429 when the queue is full", limited)


def ollama_checks(url, model, embed_model):
    client = ollama.Client(host=url)

    def generate():
        r = client.generate(model=model, prompt="Why is the sky blue?", options={"num_predict": 8, "temperature": 0})
        assert r.done and r.eval_count == 8 and isinstance(r.response, str)
        parts = list(client.generate(model=model, prompt="Why is the sky blue?", stream=True,
                                     options={"num_predict": 8, "temperature": 0}))
        assert parts[-1].done and "".join(p.response for p in parts) == r.response

    def chat():
        r = client.chat(model=model, messages=[{"role": "user", "content": "Hello!"}], options={"num_predict": 6})
        assert r.message.role == "assistant" and r.done
        parts = list(client.chat(model=model, messages=[{"role": "user", "content": "Hello!"}], stream=True,
                                 options={"num_predict": 6}))
        last = parts[-1]
        # Sampled: the reply may end (EOS) before the 6-token cap; a cut reply has exactly 6.
        assert last.done and last.done_reason in ("stop", "length"), last
        assert 1 <= last.eval_count <= 6, last.eval_count
        if last.done_reason == "length":
            assert last.eval_count == 6, last.eval_count
        assert "".join(p.message.content for p in parts), "an empty streamed reply"

    def listings():
        names = [m.model for m in client.list().models]
        assert model in names, names
        running = [m.model for m in client.ps().models]
        assert model in running, running
        shown = client.show(model)
        assert shown.details.family
        assert client._client.get("/api/version").json()["version"]

    def not_found():
        try:
            client.chat(model="no-such-model:1b", messages=[{"role": "user", "content": "x"}])
            raise AssertionError("an unknown model was accepted")
        except ollama.ResponseError as e:
            assert e.status_code == 404

    def embed():
        if not embed_model:
            return
        r = client.embed(model=embed_model, input=["hello world", "a second text"])
        assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384

    def create_copy_delete():
        name, copy = "conformance-pirate:latest", "conformance-pirate:copy"
        r = client.create(model=name, from_=model, system="Talk like a pirate.",
                          parameters={"temperature": 0.2, "num_predict": 4})
        assert r.status == "success", r
        shown = client.show(name)
        assert "pirate" in (shown.modelfile or ""), shown.modelfile
        assert "temperature 0.2" in (shown.parameters or ""), shown.parameters
        assert client.copy(name, copy).status == "success"
        reply = client.chat(model=copy, messages=[{"role": "user", "content": "Hello!"}])
        assert reply.done and 1 <= reply.eval_count <= 4, reply
        try:
            client.create(model="conformance-bad", from_="/etc/passwd")
            raise AssertionError("a create from a path was accepted")
        except ollama.ResponseError as e:
            assert e.status_code == 400, e
        for n in (copy, name):
            client.delete(n)
        assert name not in [m.model for m in client.list().models]

    def chat_tools():
        def get_weather(city: str) -> str:
            """The current weather in a city.

            Args:
              city: the city
            """
            return "21 C"

        for stream in (False, True):
            parts = client.chat(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                tools=[get_weather], stream=stream, options={"num_predict": 30, "temperature": 0})
            parts = list(parts) if stream else [parts]
            assert parts[-1].done
            for p in parts:
                for c in p.message.tool_calls or []:
                    assert c.function.name and isinstance(c.function.arguments, dict)
        r = client.chat(model=model, tools=[get_weather], options={"num_predict": 6}, messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "21 C", "tool_name": "get_weather"}])
        assert r.done

    for name, fn in [("ollama generate", generate), ("ollama chat tools", chat_tools), ("ollama embed", embed), ("ollama chat", chat),
                     ("ollama list/ps/show/version", listings), ("ollama 404", not_found),
                     ("ollama create/copy/delete", create_copy_delete)]:
        check(name, fn)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagoda", required=True)
    p.add_argument("--model", default="smollm2:135m")
    p.add_argument("--embed-model", default="", help="an embedding model to serve too (e.g. all-minilm)")
    a = p.parse_args()
    print(f"openai {openai.__version__}, ollama client")
    extra = ["--model", a.embed_model] if a.embed_model else []
    server = Server(a.pagoda, a.model, "--kv-cache-memory", "256MiB", *extra)
    try:
        openai_checks(server.url, a.model, a.embed_model)
        ollama_checks(server.url, a.model, a.embed_model)
    finally:
        server.stop()
    tight = Server(a.pagoda, a.model, "--kv-cache-memory", "64MiB", "--max-num-seqs", "1", "--max-queue", "0")
    try:
        rate_limit_check(tight.url, a.model)
    finally:
        tight.stop()
    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all client checks passed")


if __name__ == "__main__":
    main()
