#!/usr/bin/env python3
"""The official `openai` client against `reagent serve`, unchanged: plain chat, streaming, tools under
each tool_choice (non-streamed and streamed), parallel calls, a json_schema response; then the Responses
API (`responses.create`): plain, streamed, with a function tool, and the call's output sent back. Every
returned call must name a given tool and validate against its schema.

Usage: python openai_client.py BASE_URL   (e.g. http://127.0.0.1:8080/v1)
"""
import json
import sys

import jsonschema
from openai import OpenAI

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "forecast", "description": "Weather of a city in the next days",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
checked = 0


def check_call(name, arguments):
    global checked
    assert name in SCHEMAS, f"`{name}` is no given tool"
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    checked += 1


def main():
    client = OpenAI(base_url=sys.argv[1], api_key="unused")
    model = client.models.list().data[0].id
    chat = client.chat.completions.create

    r = chat(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0)
    assert "Paris" in r.choices[0].message.content, r
    print("plain:", r.choices[0].message.content.strip()[:60])

    text, finish = "", None
    for chunk in chat(model=model, messages=[{"role": "user", "content": "Count from 1 to 5."}], stream=True,
                      max_tokens=40, temperature=0, stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        else:
            assert chunk.usage.completion_tokens > 0
    assert text and finish in ("stop", "length"), (text, finish)
    print("streamed:", text.strip()[:60])

    ask = [{"role": "user", "content": "What is the weather in Oslo, and the forecast for Rome for 3 days?"}]
    for choice in ["auto", "required", {"type": "function", "function": {"name": "forecast"}}]:
        r = chat(model=model, messages=ask, tools=TOOLS, tool_choice=choice, temperature=0)
        m = r.choices[0].message
        if choice != "auto":
            assert m.tool_calls and r.choices[0].finish_reason == "tool_calls", r
        for c in m.tool_calls or []:
            check_call(c.function.name, c.function.arguments)
            if isinstance(choice, dict):
                assert c.function.name == "forecast"
        print(f"tool_choice {choice}:", [(c.function.name, c.function.arguments) for c in m.tool_calls or []] or m.content)

    r = chat(model=model, messages=ask, tools=TOOLS, tool_choice="none", max_tokens=30)
    assert not r.choices[0].message.tool_calls
    r = chat(model=model, messages=ask, tools=TOOLS, parallel_tool_calls=True, tool_choice="required")
    print("parallel:", len(r.choices[0].message.tool_calls), "calls")
    for c in r.choices[0].message.tool_calls:
        check_call(c.function.name, c.function.arguments)

    # A streamed decision: the calls assembled from their deltas.
    calls = {}
    for chunk in chat(model=model, messages=ask, tools=TOOLS, tool_choice="required", stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            c = calls.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
    assert calls
    for c in calls.values():
        check_call(c["name"], c["arguments"])

    # The result of a call sent back: the next turn answers from it.
    call = r.choices[0].message.tool_calls[0]
    turn = ask + [r.choices[0].message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": "12 C, cloudy"} for c in r.choices[0].message.tool_calls]
    r2 = chat(model=model, messages=turn, tools=TOOLS)
    print("after the result:", r2.choices[0].finish_reason, (r2.choices[0].message.content or "")[:60])
    for c in r2.choices[0].message.tool_calls or []:
        check_call(c.function.name, c.function.arguments)

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    r = chat(model=model, messages=[{"role": "user", "content": "Name a city and its country."}],
             response_format={"type": "json_schema", "json_schema": {"name": "place", "strict": True, "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    print("json_schema:", r.choices[0].message.content)
    responses(client, model)
    print(f"ok: {checked} tool calls, every one valid against its schema")


def responses(client, model):
    """The Responses API: plain, streamed, a function tool, its output sent back."""
    r = client.responses.create(model=model, input="What is the capital of France?", temperature=0)
    assert r.status == "completed" and "Paris" in r.output_text, r
    print("responses, plain:", r.output_text.strip()[:60])

    text, kinds = "", []
    with client.responses.stream(model=model, input="Count from 1 to 5.", max_output_tokens=64, temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert text and text == final.output_text, (text, final.output_text)
    print("responses, streamed:", text.strip()[:60])

    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.responses.create(model=model, input=ask, tools=tools, tool_choice="required", temperature=0)
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls, r
    for c in calls:
        check_call(c.name, c.arguments)
    print("responses, tool:", [(c.name, c.arguments) for c in calls])

    # The calls and their outputs sent back as items: the next response answers from them, streamed.
    turn = ask + [c.model_dump(exclude_none=True) for c in calls] + [
        {"type": "function_call_output", "call_id": c.call_id, "output": "12 C, cloudy"} for c in calls]
    streamed_calls = 0
    with client.responses.stream(model=model, input=turn, tools=tools, temperature=0) as stream:
        for event in stream:
            if event.type == "response.output_item.done" and event.item.type == "function_call":
                check_call(event.item.name, event.item.arguments)
                streamed_calls += 1
        final = stream.get_final_response()
    assert final.output_text or streamed_calls, final
    print("responses, after the output:", final.output_text.strip()[:60] or f"{streamed_calls} calls")


if __name__ == "__main__":
    main()
