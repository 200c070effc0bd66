"""kiln serve's /v1/responses driven by the official `openai` Python package.

Run by tests/server_responses.rs against a server with a Hermes tool template: text answers
with `client.responses.create` and `client.responses.stream`, a two-turn function-calling
loop (the call, its output sent back, the answer), and `previous_response_id`. Exits
non-zero on a failure.
"""

import argparse
import json
import sys

import openai

P = argparse.ArgumentParser()
P.add_argument("--url", required=True, help="base URL of the server")
ARGS = P.parse_args()

client = openai.OpenAI(base_url=ARGS.url + "/v1", api_key="none", max_retries=0, timeout=600)

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


# Text, whole and streamed: the same words.
r = client.responses.create(
    model="smollm2",
    instructions="Answer briefly.",
    input="Name three colors of the rainbow.",
    max_output_tokens=32,
    temperature=0,
)
check(r.object == "response" and r.output_text.strip() != "", f"create: {r.output_text!r}")
with client.responses.stream(
    model="smollm2",
    instructions="Answer briefly.",
    input="Name three colors of the rainbow.",
    max_output_tokens=32,
    temperature=0,
) as stream:
    events = list(stream)
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
# The last event carries the response (`response.incomplete` when max_output_tokens cut it).
final = events[-1].response
check(events[-1].type == f"response.{r.status}", f"the last event: {events[-1].type}")
check(deltas == r.output_text, f"stream deltas equal create's text: {deltas!r}")
check(final.output_text == r.output_text, "stream's final response")

# previous_response_id: the stored conversation continues.
r2 = client.responses.create(
    model="smollm2", previous_response_id=r.id, input="And one more?", max_output_tokens=16,
    temperature=0,
)
check(r2.previous_response_id == r.id and r2.output_text.strip() != "", "continued")

# Two turns of function calling.
ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
first = client.responses.create(
    model="smollm2", input=ask, tools=TOOLS, tool_choice="required", max_output_tokens=64,
    temperature=0,
)
calls = [o for o in first.output if o.type == "function_call"]
check(len(calls) >= 1 and calls[0].name == "get_weather", f"a call: {first.output}")
args = json.loads(calls[0].arguments)
check(isinstance(args.get("city"), str), f"arguments follow the schema: {args}")
with client.responses.stream(
    model="smollm2", input=ask, tools=TOOLS, tool_choice="required", max_output_tokens=64,
    temperature=0,
) as stream:
    events = list(stream)
streamed = events[-1].response
index = [o.type for o in streamed.output].index("function_call")
pieces = "".join(
    e.delta
    for e in events
    if e.type == "response.function_call_arguments.delta" and e.output_index == index
)
check(pieces == calls[0].arguments, f"the first call's streamed arguments: {pieces!r}")
check([o.type for o in streamed.output] == [o.type for o in first.output], "streamed items")
second = client.responses.create(
    model="smollm2",
    input=ask
    + [o.model_dump(exclude_none=True) for o in calls]
    + [
        {
            "type": "function_call_output",
            "call_id": calls[0].call_id,
            "output": json.dumps({"temperature_c": 21, "sky": "clear"}),
        }
    ],
    tools=TOOLS,
    max_output_tokens=48,
    temperature=0,
)
check(second.status in ("completed", "incomplete"), f"turn two: {second.output}")
check(
    second.output_text.strip() != "" or any(o.type == "function_call" for o in second.output),
    "turn two answers",
)

# A malformed request: a 400 naming the field.
try:
    client.responses.create(model="smollm2", input=[{"type": "web_search_call"}])
    check(False, "a bad item is refused")
except openai.BadRequestError as e:
    check(e.body.get("param") == "input[0].type", f"the field is named: {e.body}")
print("all passed")
