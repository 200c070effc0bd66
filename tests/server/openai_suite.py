"""kiln serve driven by the official `openai` Python package (and raw HTTP for bad input).

Run by tests/server_openai.rs, which starts two servers:
  A: --parallel 8 --api-key KEY (the main one)
  B: --parallel 1 --queue 1 (queue limits and graceful shutdown; it is SIGTERMed at the end)
Prints one line per check and a closing 'N passed, M failed'; exits non-zero on a failure.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import httpx
import openai

P = argparse.ArgumentParser()
P.add_argument("--a", required=True, help="base URL of server A")
P.add_argument("--b", required=True, help="base URL of server B")
P.add_argument("--b-pid", type=int, required=True)
P.add_argument("--key", required=True)
P.add_argument("--kiln", required=True, help="the kiln binary")
P.add_argument("--model", default="smollm2")
P.add_argument("--ctx", type=int, default=1024)
ARGS = P.parse_args()

client = openai.OpenAI(base_url=ARGS.a + "/v1", api_key=ARGS.key, max_retries=0, timeout=600)
AUTH = {"Authorization": f"Bearer {ARGS.key}"}
MODEL = None  # the served id, read from /v1/models

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a CPU cache is in one sentence.",
    "What color is the sky on a clear day?",
    "Name a famous composer.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
]


def kiln_run(prompt, n, chat):
    """Greedy output of `kiln run` (what the server must reproduce)."""
    cmd = [ARGS.kiln, "run", "-m", ARGS.model, "-p", prompt, "-n", str(n), "--temp", "0",
           "-c", str(ARGS.ctx)]
    # An instruct model gets its chat template by default; --raw is a plain completion.
    cmd.append("--chat" if chat else "--raw")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return out[:-1] if out.endswith("\n") else out  # `run` ends with one newline of its own


def metrics(base=None):
    # /metrics is behind the API key (server B has none; the header is ignored there).
    r = httpx.get((base or ARGS.a) + "/metrics", headers=AUTH, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    text = r.text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def chat_once(prompt, n=32, **kw):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=n,
        temperature=0, **kw)
    return r


def test_models():
    global MODEL
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert len(ids) == 1, ids
    MODEL = ids[0]
    h = httpx.get(ARGS.a + "/health", timeout=10).json()
    assert h["status"] == "ok" and h["slots_total"] == 8, h


def test_chat_greedy_equals_kiln_run():
    for p in PROMPTS[:2]:
        r = chat_once(p)
        want = kiln_run(p, 32, chat=True)
        got = r.choices[0].message.content
        assert got == want, (p, got, want)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
        assert r.object == "chat.completion"


def test_completion_greedy_equals_kiln_run():
    for p in ["The capital of France is", "def fibonacci(n):"]:
        r = client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0)
        want = kiln_run(p, 24, chat=False)
        assert r.choices[0].text == want, (p, r.choices[0].text, want)
        assert r.usage.completion_tokens == 24 or r.choices[0].finish_reason == "stop"


def test_streaming_equals_whole():
    p = PROMPTS[2]
    whole = chat_once(p)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=32, temperature=0,
        stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    # Completions stream too, with usage on the final chunk.
    s = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                  temperature=0, stream=True)
    parts = [c.choices[0].text for c in s if c.choices]
    w = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                  temperature=0)
    assert "".join(parts) == w.choices[0].text


def stream_text(prompt, n, results, i, times):
    t0 = time.time()
    s = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=n,
        temperature=0, stream=True)
    text, finish = "", None
    for chunk in s:
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    results[i] = (text, finish)
    times[i] = time.time() - t0


def test_eight_concurrent_streams_equal_sequential():
    n = 48
    sequential = []
    t0 = time.time()
    tokens = 0
    for p in PROMPTS:
        r = chat_once(p, n)
        sequential.append((r.choices[0].message.content, r.choices[0].finish_reason))
        tokens += r.usage.completion_tokens
    seq_s = time.time() - t0
    results, times = [None] * 8, [0.0] * 8
    threads = [threading.Thread(target=stream_text, args=(p, n, results, i, times))
               for i, p in enumerate(PROMPTS)]
    before = metrics()
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    par_s = time.time() - t0
    after = metrics()
    for i, (want, got) in enumerate(zip(sequential, results)):
        assert got == want, (PROMPTS[i], got, want)
    steps = after["kiln_decode_steps_total"] - before["kiln_decode_steps_total"]
    gen = after["kiln_generated_tokens_total"] - before["kiln_generated_tokens_total"]
    assert steps < gen, f"decode steps {steps} for {gen} tokens: nothing was batched"
    print(f"    8 clients: {tokens} tokens sequential {seq_s:.1f}s ({tokens / seq_s:.1f} tok/s), "
          f"concurrent {par_s:.1f}s ({gen / par_s:.1f} tok/s), {gen / steps:.2f} tokens/step")


def test_prefix_cache_second_turn():
    system = "You are a concise assistant. Answer in one short sentence."
    turn1 = [{"role": "system", "content": system},
             {"role": "user", "content": "What is the capital of Italy?"}]
    r1 = client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=24, temperature=0)
    reply = r1.choices[0].message.content
    turn2 = turn1 + [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And of Spain?"}]
    before = metrics()
    r2 = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=24, temperature=0)
    after = metrics()
    prefilled = after["kiln_prefill_tokens_total"] - before["kiln_prefill_tokens_total"]
    saved = after["kiln_prefill_tokens_saved_total"] - before["kiln_prefill_tokens_saved_total"]
    p1, p2 = r1.usage.prompt_tokens, r2.usage.prompt_tokens
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached == saved and prefilled == p2 - cached, (cached, saved, prefilled, p2)
    assert cached > p1, f"turn 1's prompt ({p1}) and reply should be reused, got {cached}"
    assert prefilled <= p2 - p1, f"prefilled {prefilled} > new tokens {p2 - p1}"
    assert after["kiln_prefix_cache_hits_total"] > before["kiln_prefix_cache_hits_total"]
    cold = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=24,
                                          temperature=0, extra_body={"cache_prompt": False})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.choices[0].message.content == cold.choices[0].message.content, (
        r2.choices[0].message.content, cold.choices[0].message.content)
    print(f"    turn 2: {p2} prompt tokens, {int(cached)} reused, {int(prefilled)} prefilled")


def post(path, body, headers=AUTH, base=None, raw=False):
    data = body if raw else json.dumps(body)
    h = dict(headers)
    h["Content-Type"] = "application/json"
    return httpx.post((base or ARGS.a) + path, content=data, headers=h, timeout=120)


def expect_error(resp, status, what):
    assert resp.status_code == status, (what, resp.status_code, resp.text)
    err = resp.json()["error"]
    assert err["message"] and err["type"], (what, err)
    return err


def test_bad_input():
    good = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    expect_error(post("/v1/chat/completions", b"{not json", raw=True), 400, "malformed JSON")
    expect_error(post("/v1/chat/completions", b"[1,2]", raw=True), 400, "not an object")
    e = expect_error(post("/v1/chat/completions", {**good, "temperature": "hot"}), 400, "type")
    assert "temperature" in e["message"], e
    expect_error(post("/v1/chat/completions", {**good, "messages": "hi"}), 400, "messages type")
    expect_error(post("/v1/chat/completions", {**good, "max_tokens": "many"}), 400, "max_tokens")
    # Another model's name is answered under the server's own (llama-server's behaviour).
    other = post("/v1/chat/completions", {**good, "model": "gpt-9"})
    assert other.status_code == 200, other.text
    assert other.json()["model"] != "gpt-9", other.text
    expect_error(post("/v1/chat/completions", {**good, "messages": []}), 400, "empty messages")
    expect_error(post("/v1/chat/completions", {k: v for k, v in good.items() if k != "messages"}),
                 400, "missing messages")
    e = expect_error(post("/v1/chat/completions", {**good, "max_tokens": 10 ** 6}), 400,
                     "max_tokens past the context")
    assert e["param"] == "max_tokens", e
    e = expect_error(post("/v1/chat/completions", {**good, "n": 9}), 400, "n beyond the slots")
    assert e["param"] == "n" and "--parallel 8" in e["message"], e
    expect_error(post("/v1/chat/completions",
                      {**good, "messages": [{"role": "wizard", "content": "x"}]}), 400, "role")
    expect_error(post("/v1/completions", {"model": MODEL, "prompt": ""}), 400, "empty prompt")
    expect_error(post("/v1/completions", {"model": MODEL, "prompt": [10 ** 9]}), 400, "bad id")
    long_prompt = "word " * (ARGS.ctx * 2)
    expect_error(post("/v1/completions", {"model": MODEL, "prompt": long_prompt}), 400,
                 "prompt longer than the context")
    big = json.dumps({**good, "pad": "x" * (5 << 20)})
    expect_error(post("/v1/chat/completions", big, raw=True), 413, "body over the limit")
    expect_error(post("/v1/chat/completions", good, headers={}), 401, "no key")
    expect_error(post("/v1/chat/completions", good, headers={"Authorization": "Bearer nope"}),
                 401, "wrong key")
    expect_error(httpx.get(ARGS.a + "/v1/nothing", headers=AUTH, timeout=10), 404, "route")
    expect_error(httpx.get(ARGS.a + "/v1/chat/completions", headers=AUTH, timeout=10), 405,
                 "method")
    # The client too: another model's name is answered under the server's own.
    r = client.chat.completions.create(model="gpt-9", max_tokens=2,
                                       messages=[{"role": "user", "content": "x"}])
    assert r.model != "gpt-9", r
    # Still serving.
    r = post("/v1/chat/completions", good)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def check_call(name, arguments):
    """A call of one of the offered functions whose arguments follow its schema."""
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and len(args["city"]) <= 24, args
        assert args["unit"] in ("celsius", "fahrenheit"), args
    else:
        assert name == "get_time", name
        assert set(args) == {"zone"} and isinstance(args["zone"], str), args
    return args


def streamed_chat(**kw):
    """A streamed chat completion joined: per choice index, content, tool calls, finish."""
    out = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            o = out.setdefault(c.index, {"content": "", "calls": {}, "finish": None,
                                         "logprobs": []})
            if c.delta.content:
                o["content"] += c.delta.content
            for t in c.delta.tool_calls or []:
                call = o["calls"].setdefault(t.index, {"id": None, "name": None, "arguments": ""})
                if t.id:
                    assert call["id"] is None, "one id per call"
                    call["id"] = t.id
                    assert t.type == "function" and t.function.name, t
                    call["name"] = t.function.name
                else:
                    assert call["id"] is not None, "the first delta of a call has its id and name"
                if t.function and t.function.arguments:
                    call["arguments"] += t.function.arguments
            if c.logprobs and c.logprobs.content:
                o["logprobs"] += c.logprobs.content
            if c.finish_reason:
                o["finish"] = c.finish_reason
    return out


def test_tool_calls_required_and_named():
    r = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, CLOCK],
                                       tool_choice="required", max_tokens=96, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.content is None, c.message
    assert c.message.tool_calls, c.message
    for t in c.message.tool_calls:
        assert t.type == "function" and t.id.startswith("call_"), t
        check_call(t.function.name, t.function.arguments)
    # Streamed: the same calls, the name first, then the arguments in pieces.
    s = streamed_chat(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, CLOCK],
                      tool_choice="required", max_tokens=96, temperature=0)[0]
    assert s["finish"] == "tool_calls" and s["content"] == "", s
    got = [(s["calls"][i]["name"], s["calls"][i]["arguments"]) for i in sorted(s["calls"])]
    want = [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    assert got == want, (got, want)
    # A named function is the one called.
    r = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, CLOCK], max_tokens=96, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert calls and all(t.function.name == "get_time" for t in calls), calls
    for t in calls:
        check_call(t.function.name, t.function.arguments)
    # `none`: no tools offered, a plain answer.
    r = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                       tool_choice="none", max_tokens=24, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def tool_loop(stream):
    """Call, result, answer: the second turn carries the call and the tool's result."""
    tools = [WEATHER, CLOCK]
    kw = dict(model=MODEL, tools=tools, max_tokens=96, temperature=0)
    if stream:
        s = streamed_chat(messages=ASK_WEATHER, tool_choice="required", **kw)[0]
        calls = [s["calls"][i] for i in sorted(s["calls"])]
        assert s["finish"] == "tool_calls" and calls, s
        tool_calls = [{"id": c["id"], "type": "function",
                       "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    else:
        r = client.chat.completions.create(messages=ASK_WEATHER, tool_choice="required", **kw)
        assert r.choices[0].finish_reason == "tool_calls"
        tool_calls = [t.model_dump() for t in r.choices[0].message.tool_calls]
    history = ASK_WEATHER + [{"role": "assistant", "content": None, "tool_calls": tool_calls}]
    for t in tool_calls:
        args = check_call(t["function"]["name"], t["function"]["arguments"])
        result = ({"city": args["city"], "temperature": 21, "unit": args["unit"],
                   "sky": "sunny"} if t["function"]["name"] == "get_weather"
                  else {"time": "14:05"})
        history.append({"role": "tool", "tool_call_id": t["id"], "content": json.dumps(result)})
    kw["max_tokens"] = 48
    if stream:
        s = streamed_chat(messages=history, tool_choice="auto", **kw)[0]
        answer, finish, calls = s["content"], s["finish"], s["calls"]
    else:
        r = client.chat.completions.create(messages=history, tool_choice="auto", **kw)
        answer, finish = r.choices[0].message.content, r.choices[0].finish_reason
        calls = r.choices[0].message.tool_calls
    assert not calls, f"a second call instead of an answer: {calls}"
    assert finish in ("stop", "length") and answer and answer.strip(), (finish, answer)
    return answer


def test_tool_loop():
    whole = tool_loop(stream=False)
    streamed = tool_loop(stream=True)
    assert whole == streamed, (whole, streamed)
    print(f"    answer after the tool result: {whole!r}")


def test_tool_bad_input():
    base = {"model": MODEL, "messages": ASK_WEATHER, "max_tokens": 8}
    chat = "/v1/chat/completions"
    e = expect_error(post(chat, {**base, "tools": [{"type": "function", "function": {
        "parameters": {"type": "object"}}}]}), 400, "tool without a name")
    assert e["param"] == "tools[0].function.name" and "name" in e["message"], e
    e = expect_error(post(chat, {**base, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": ["not", "an", "object"]}}]}), 400, "parameters not an object")
    assert e["param"] == "tools[0].function.parameters", e
    e = expect_error(post(chat, {**base, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "launch"}}}), 400, "unknown function")
    assert e["param"] == "tool_choice" and "launch" in e["message"], e
    odd = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}}}
    e = expect_error(post(chat, {**base, "tools": [WEATHER, odd], "tool_choice": "required"}), 400,
                     "unsupported schema keyword")
    assert e["param"] == "tools[1].function.parameters", e
    assert "dependentSchemas" in e["message"], e
    e = expect_error(post(chat, {**base, "tools": [WEATHER],
                                 "response_format": {"type": "json_object"}}), 400,
                     "tools and response_format")
    assert e["param"] == "response_format", e
    e = expect_error(post(chat, {**base, "messages": ASK_WEATHER + [
        {"role": "tool", "content": "x"}]}), 400, "tool message without its call id")
    assert e["param"] == "messages[1].tool_call_id", e
    try:
        client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[
            {"type": "function", "function": {"description": "nameless"}}])
        raise AssertionError("a tool without a name was accepted")
    except openai.BadRequestError:
        pass


def test_logprobs():
    kw = dict(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=12,
              temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    entries = c.logprobs.content
    assert len(entries) == r.usage.completion_tokens, (len(entries), r.usage)
    assert "".join(e.token for e in entries) == c.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3, e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token, e
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True), lps
        # Greedy: the token is the most likely one.
        assert e.top_logprobs[0].token == e.token and abs(lps[0] - e.logprob) < 1e-6, e
    assert sum(math.exp(t.logprob) for t in entries[0].top_logprobs) <= 1.0 + 1e-5
    # Streamed: the same entries, chunk by chunk.
    s = streamed_chat(**kw)[0]
    assert [(e.token, e.logprob) for e in s["logprobs"]] == [(e.token, e.logprob) for e in entries]
    # Sampling settings change the draw, not the values (the raw logits').
    hot = client.chat.completions.create(**{**kw, "temperature": 1.5, "seed": 3, "max_tokens": 1},
                                         extra_body={"top_k": 2})
    first = hot.choices[0].logprobs.content[0]
    want = {t.token: t.logprob for t in entries[0].top_logprobs}
    assert abs(first.top_logprobs[0].logprob - entries[0].top_logprobs[0].logprob) < 1e-6
    assert first.token in want or first.logprob < min(want.values()), (first, want)
    # Legacy completions: tokens, their log-probabilities, alternatives, offsets.
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    for tok, l, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tok in alts and abs(alts[tok] - l) < 1e-6 and 1 <= len(alts) <= 3, (tok, l, alts)
    for body, what in [({"logprobs": False, "top_logprobs": 2}, "top_logprobs without logprobs"),
                       ({"logprobs": True, "top_logprobs": 21}, "top_logprobs over 20")]:
        e = expect_error(post("/v1/chat/completions", {"model": MODEL, "messages": kw["messages"],
                                                       **body}), 400, what)
        assert e["param"] == "top_logprobs", e
    e = expect_error(post("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": -1}),
                     400, "negative logprobs")
    assert e["param"] == "logprobs", e


def test_n_choices_share_one_prefill():
    msgs = [{"role": "user", "content": "Invent a name for a cat."}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=12, temperature=1.0, seed=11)
    before = metrics()
    r = client.chat.completions.create(n=3, extra_body={"cache_prompt": False}, **kw)
    after = metrics()
    assert [c.index for c in r.choices] == [0, 1, 2], r.choices
    single = [client.chat.completions.create(**{**kw, "seed": 11 + i},
                                             extra_body={"cache_prompt": False})
              for i in range(3)]
    # Choice i is what seed + i gives alone; the prompt counts once.
    for i, c in enumerate(r.choices):
        assert c.message.content == single[i].choices[0].message.content, (i, c, single[i])
    assert r.usage.prompt_tokens == single[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in single)
    prefilled = after["kiln_prefill_tokens_total"] - before["kiln_prefill_tokens_total"]
    assert prefilled == r.usage.prompt_tokens, (prefilled, r.usage)
    # Streamed: chunks carry their choice's index.
    s = streamed_chat(n=3, **kw)
    assert sorted(s) == [0, 1, 2], s
    for i in range(3):
        assert s[i]["content"] == r.choices[i].message.content, (i, s[i], r.choices[i])
        assert s[i]["finish"] == r.choices[i].finish_reason
    # Completions too, with tools' and logprobs' company.
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, n=2,
                                  temperature=0, logprobs=1)
    assert [x.index for x in c.choices] == [0, 1] and c.choices[0].text == c.choices[1].text
    assert c.choices[0].logprobs.tokens == c.choices[1].logprobs.tokens
    r = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], n=2,
                                       tool_choice="required", max_tokens=96, temperature=0)
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch


def test_disconnect_frees_slot():
    before = metrics()
    body = {"model": MODEL, "prompt": "Count from one to a thousand: one, two,",
            "max_tokens": ARGS.ctx - 64, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", ARGS.a + "/v1/completions", json=body, headers=AUTH,
                      timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break
    # Only a disconnect cancels (ignore_eos: the generation cannot end on its own this soon).
    deadline = time.time() + 60
    while time.time() < deadline:
        m = metrics()
        if (m["kiln_kv_slots_in_use"] == 0
                and m["kiln_requests_cancelled_total"] > before["kiln_requests_cancelled_total"]):
            gen = m["kiln_generated_tokens_total"] - before["kiln_generated_tokens_total"]
            assert gen < ARGS.ctx - 64, "generation ran to the end instead of stopping"
            return
        time.sleep(0.2)
    raise AssertionError(f"slot not freed after disconnect: {metrics()}")


def test_queue_full_is_429():
    """Server B has one slot and a queue of one: a third concurrent request gets 429."""
    body = {"prompt": "Tell me a long story about a dragon.", "max_tokens": 900,
            "temperature": 0, "stream": True, "ignore_eos": True}
    first = httpx.Client(timeout=60)
    second = httpx.Client(timeout=60)
    with first.stream("POST", ARGS.b + "/v1/completions", json=body) as r1:
        assert r1.status_code == 200
        it = r1.iter_lines()
        next(l for l in it if l.startswith("data: "))  # generating: the slot is taken
        holder = {}

        def queued():
            with second.stream("POST", ARGS.b + "/v1/completions", json=body) as r2:
                holder["status"] = r2.status_code
                for _ in r2.iter_lines():
                    break

        t = threading.Thread(target=queued)
        t.start()
        deadline = time.time() + 30
        while metrics(ARGS.b)["kiln_queue_depth"] < 1:
            assert time.time() < deadline, "second request never queued"
            time.sleep(0.05)
        r3 = post("/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers={}, base=ARGS.b)
        expect_error(r3, 429, "queue full")
        assert r3.headers.get("retry-after") == "1", r3.headers
    t.join(timeout=120)
    assert holder.get("status") == 200, holder
    first.close()
    second.close()


def test_sigterm_finishes_started_response():
    body = {"prompt": "The history of Rome", "max_tokens": 40, "temperature": 0, "stream": True,
            "ignore_eos": True}
    chunks, done, finish = [], False, None
    with httpx.stream("POST", ARGS.b + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        sent = False
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if not sent:
                os.kill(ARGS.b_pid, signal.SIGTERM)  # mid-response
                sent = True
            if data == "[DONE]":
                done = True
                break
            c = json.loads(data)
            chunks.append(c["choices"][0]["text"])
            finish = c["choices"][0]["finish_reason"] or finish
    assert done and finish == "length", (done, finish, len(chunks))
    # The server then exits and stops accepting connections.
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            httpx.get(ARGS.b + "/health", timeout=2)
        except httpx.TransportError:
            return
        time.sleep(0.2)
    raise AssertionError("server B still answering after SIGTERM")


TESTS = [
    test_models,
    test_chat_greedy_equals_kiln_run,
    test_completion_greedy_equals_kiln_run,
    test_streaming_equals_whole,
    test_eight_concurrent_streams_equal_sequential,
    test_prefix_cache_second_turn,
    test_bad_input,
    test_tool_calls_required_and_named,
    test_tool_loop,
    test_tool_bad_input,
    test_logprobs,
    test_n_choices_share_one_prefill,
    test_disconnect_frees_slot,
    test_queue_full_is_429,
    test_sigterm_finishes_started_response,
]

passed = failed = 0
for t in TESTS:
    t0 = time.time()
    try:
        t()
        passed += 1
        print(f"ok   {t.__name__} ({time.time() - t0:.1f}s)", flush=True)
    except Exception:
        failed += 1
        print(f"FAIL {t.__name__}", flush=True)
        traceback.print_exc()
print(f"openai-suite: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
