"""The Python bindings against the `kiln` command line, on the suite's random fixture models.

Run by tests/python_bindings.rs (the README's `cargo test --release`), which makes the fixtures,
builds the bindings and sets:
    KILN_BIN            the `kiln` binary
    KILN_TEST_MODEL     a random decoder fixture (llama)
    KILN_TEST_ENCODER   a random encoder fixture (bert)
    KILN_TEST_CHAT_MODEL  the random decoder with a ChatML template (the fixtures have none)
Greedy generations must equal `kiln run`'s with the same flags, text for text and token count
for token count; tokens equal `kiln tokenize`'s; embeddings equal `kiln embedding`'s.
"""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import _thread

import pytest

import kiln

BIN = os.environ["KILN_BIN"]
MODEL = os.environ["KILN_TEST_MODEL"]
ENCODER = os.environ["KILN_TEST_ENCODER"]
CHAT_MODEL = os.environ["KILN_TEST_CHAT_MODEL"]
CTX = 512
THREADS = 2

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
QUESTION = "What is the capital of France?"
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "ok"],
    "additionalProperties": False,
}


def cli(*args, stdin=None):
    r = subprocess.run(
        [BIN, *args], capture_output=True, text=True, input=stdin, timeout=300
    )
    assert r.returncode == 0, f"kiln {' '.join(args)} failed: {r.stderr}"
    return r.stdout


def cli_run(*flags, model=None):
    """`kiln run --json` on the fixture, greedy: (text, generated tokens, stop)."""
    out = cli(
        "run", "-m", model or MODEL, "-c", str(CTX), "-t", str(THREADS), "--temp", "0", "--json", *flags
    )
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    *tokens, stats = lines
    text = "".join(t["text"] for t in tokens)
    return text, stats["gen_tokens"], stats["stop"]


@pytest.fixture(scope="module")
def llm():
    with kiln.Llama(model_path=MODEL, n_ctx=CTX, n_threads=THREADS, verbose=False) as m:
        yield m


@pytest.fixture(scope="module")
def chat():
    with kiln.Llama(model_path=CHAT_MODEL, n_ctx=CTX, n_threads=THREADS, verbose=False) as m:
        yield m


@pytest.fixture(scope="module")
def encoder():
    with kiln.Llama(model_path=ENCODER, n_ctx=CTX, n_threads=THREADS, verbose=False) as m:
        yield m


# -- greedy generations equal the command line's ----------------------------------------------


def test_completion_equals_kiln_run(llm):
    text, n, stop = cli_run("--raw", "-p", PROMPT, "-n", "40")
    out = llm.create_completion(PROMPT, max_tokens=40, temperature=0)
    choice = out["choices"][0]
    assert choice["text"] == text
    assert out["usage"]["completion_tokens"] == n
    assert out["usage"]["prompt_tokens"] == len(llm.tokenize(PROMPT.encode()))
    assert choice["finish_reason"] == ("length" if stop == "length" else "stop")
    assert out["object"] == "text_completion"
    # llama-server's timings: the engine's counts.
    assert out["timings"]["predicted_n"] == n
    assert out["timings"]["prompt_n"] == out["usage"]["prompt_tokens"]
    # __call__ is create_completion.
    assert llm(PROMPT, max_tokens=40, temperature=0)["choices"][0]["text"] == text


def test_token_prompt_equals_text_prompt(llm):
    ids = llm.tokenize(PROMPT.encode())
    a = llm.create_completion(PROMPT, max_tokens=12, temperature=0)
    b = llm.create_completion(ids, max_tokens=12, temperature=0)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_chat_equals_kiln_run(chat):
    text, n, _ = cli_run("--chat", "-p", QUESTION, "-n", "32", model=CHAT_MODEL)
    out = chat.create_chat_completion(
        messages=[{"role": "user", "content": QUESTION}], max_tokens=32, temperature=0
    )
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert msg["content"] == text
    assert out["usage"]["completion_tokens"] == n
    assert out["object"] == "chat.completion"


def test_chat_with_system_equals_kiln_run(chat):
    text, _, _ = cli_run("-sys", "Answer briefly.", "-p", QUESTION, "-n", "24", model=CHAT_MODEL)
    out = chat.create_chat_completion(
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=24,
        temperature=0,
    )
    assert out["choices"][0]["message"]["content"] == text


def test_chat_format_names_a_template(llm, chat):
    # The plain fixture has no template: chat is refused, unless chat_format names one.
    with pytest.raises(ValueError, match="no chat template"):
        llm.create_chat_completion(messages=[{"role": "user", "content": QUESTION}])
    messages = [{"role": "user", "content": QUESTION}]
    with kiln.Llama(model_path=MODEL, n_ctx=CTX, n_threads=THREADS, chat_format="chatml",
                    verbose=False) as named:
        a = named.create_chat_completion(messages=messages, max_tokens=16, temperature=0)
    b = chat.create_chat_completion(messages=messages, max_tokens=16, temperature=0)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    with pytest.raises(ValueError, match="no-such-format"):
        kiln.Llama(model_path=MODEL, chat_format="no-such-format", verbose=False)


def test_seeded_sampling_equals_kiln_run(llm):
    # Sampled, not greedy: the same seed and sampler give kiln run's tokens.
    out = cli(
        "run", "-m", MODEL, "-c", str(CTX), "-t", str(THREADS), "--json", "--raw",
        "-p", PROMPT, "-n", "24", "--temp", "0.9", "--top-k", "40", "--top-p", "0.95",
        "--min-p", "0.05", "-s", "1234",
    )
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    text = "".join(t["text"] for t in lines[:-1])
    got = llm.create_completion(
        PROMPT, max_tokens=24, temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=1234
    )
    assert got["choices"][0]["text"] == text


def test_max_tokens_none_runs_to_the_end(llm):
    small = kiln.Llama(model_path=MODEL, n_ctx=64, n_threads=THREADS, verbose=False)
    n_prompt = len(small.tokenize(PROMPT.encode()))
    out = small.create_completion(PROMPT, max_tokens=None, temperature=0)
    assert out["usage"]["completion_tokens"] <= 64 - n_prompt
    if out["choices"][0]["finish_reason"] == "length":
        assert out["usage"]["completion_tokens"] == 64 - n_prompt
    small.close()


# -- streams ---------------------------------------------------------------------------------


def test_completion_stream_concatenates_to_the_whole(llm):
    whole = llm.create_completion(PROMPT, max_tokens=40, temperature=0)
    chunks = list(llm.create_completion(PROMPT, max_tokens=40, temperature=0, stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len(chunks) > 2
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_chat_stream_concatenates_to_the_whole(chat):
    messages = [{"role": "user", "content": QUESTION}]
    whole = chat.create_chat_completion(messages=messages, max_tokens=32, temperature=0)
    chunks = list(
        chat.create_chat_completion(messages=messages, max_tokens=32, temperature=0, stream=True)
    )
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_abandoned_stream_frees_the_model(llm):
    stream = llm.create_completion(PROMPT, max_tokens=200, temperature=0, stream=True)
    next(stream)
    stream.close()
    # The model answers the next call (the stream's generation let go of the session).
    out = llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    assert out["usage"]["completion_tokens"] == 4


def test_open_stream_makes_a_second_call_fail_cleanly(llm):
    stream = llm.create_completion(PROMPT, max_tokens=200, temperature=0, stream=True)
    next(stream)
    with pytest.raises(RuntimeError, match="already generating"):
        llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    stream.close()
    assert llm.create_completion(PROMPT, max_tokens=2, temperature=0)["choices"]


# -- stop sequences --------------------------------------------------------------------------


def test_stop_sequence_cuts_the_text(llm):
    full = llm.create_completion(PROMPT, max_tokens=40, temperature=0)["choices"][0]["text"]
    # A stop sequence from the middle of the greedy text: the text ends just before it.
    middle = len(full) // 2
    stop = full[middle : middle + 3]
    assert len(stop.strip()) > 0, full
    out = llm.create_completion(PROMPT, max_tokens=40, temperature=0, stop=[stop])
    choice = out["choices"][0]
    assert choice["text"] == full[: full.index(stop)]
    assert choice["finish_reason"] == "stop"
    streamed = llm.create_completion(PROMPT, max_tokens=40, temperature=0, stop=stop, stream=True)
    assert "".join(c["choices"][0]["text"] for c in streamed) == choice["text"]


# -- structured output and tools -------------------------------------------------------------


def test_json_schema_response_format_yields_valid_json(chat):
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    out = chat.create_chat_completion(
        messages=[{"role": "user", "content": QUESTION}],
        response_format=rf,
        max_tokens=64,
        temperature=0,
    )
    content = out["choices"][0]["message"]["content"]
    value = json.loads(content)
    assert set(value) == {"color", "ok"}
    assert value["color"] in ("red", "green", "blue")
    assert isinstance(value["ok"], bool)
    assert out["choices"][0]["finish_reason"] == "stop"
    # kiln run with the same schema writes the same text.
    text, _, _ = cli_run("--chat", "-p", QUESTION, "-n", "64", "-j", json.dumps(SCHEMA), model=CHAT_MODEL)
    assert content == text


def test_json_object_with_schema_as_llama_cpp_python(chat):
    # llama-cpp-python's spelling: {"type": "json_object", "schema": ...}.
    out = chat.create_chat_completion(
        messages=[{"role": "user", "content": QUESTION}],
        response_format={"type": "json_object", "schema": SCHEMA},
        max_tokens=64,
        temperature=0.7,
        seed=5,
    )
    assert json.loads(out["choices"][0]["message"]["content"])["color"] in ("red", "green", "blue")


def test_required_tool_call_is_parsed():
    # The generic tool preamble is long in this fixture's vocabulary: a larger context.
    chat = kiln.Llama(model_path=CHAT_MODEL, n_ctx=2048, n_threads=THREADS, verbose=False)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"enum": ["Paris", "Rome"]}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    out = chat.create_chat_completion(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=0,
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    # Streamed: the same call, in OpenAI's delta pieces.
    chunks = list(
        chat.create_chat_completion(
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=200,
            temperature=0,
            stream=True,
        )
    )
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"
    args = "".join(tc["function"].get("arguments") or "" for tc in calls)
    assert json.loads(args) == json.loads(call["function"]["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    chat.close()


# -- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["Hello world", " leading space, ünïcödé and 日本語", "a\n\nb\tc", "<s> and </s>"]
)
def test_tokenize_equals_kiln_tokenize(llm, text):
    ids = json.loads(cli("tokenize", "-m", MODEL, "-p", text, "--ids"))
    assert llm.tokenize(text.encode(), add_bos=True, special=True) == ids
    no_bos = json.loads(cli("tokenize", "-m", MODEL, "-p", text, "--ids", "--no-bos"))
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == no_bos
    literal = json.loads(cli("tokenize", "-m", MODEL, "-p", text, "--ids", "--no-parse-special"))
    assert llm.tokenize(text.encode(), add_bos=True, special=False) == literal
    assert llm.detokenize(llm.tokenize(text.encode(), add_bos=False)) == text.encode()
    # BOS is a control token: left out unless special.
    assert llm.detokenize(llm.tokenize(text.encode(), add_bos=True)) == text.encode()


def test_detokenize_prev_tokens(llm):
    ids = llm.tokenize(b"Hello world, again", add_bos=False)
    whole = llm.detokenize(ids)
    assert llm.detokenize(ids[:2]) + llm.detokenize(ids[2:], prev_tokens=ids[:2]) == whole


def test_sizes(llm):
    assert llm.n_ctx() == CTX
    assert llm.n_vocab() > 100
    assert os.path.samefile(llm.model_path, MODEL)


# -- embeddings ------------------------------------------------------------------------------


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def test_embeddings_equal_kiln_embedding(encoder):
    texts = ["cats sit on mats", "dogs chase cats", "a"]
    out = json.loads(
        cli("embedding", "-m", ENCODER, "-c", str(CTX), "-t", str(THREADS), "--json",
            "-p", "\n".join(texts))
    )
    want = [[f32(x) for x in d["embedding"]] for d in out["data"]]
    got = encoder.create_embedding(texts)
    assert got["object"] == "list"
    assert [d["index"] for d in got["data"]] == [0, 1, 2]
    assert [d["embedding"] for d in got["data"]] == want
    assert got["usage"]["prompt_tokens"] == out["usage"]["prompt_tokens"]
    assert encoder.embed(texts[0]) == want[0]
    vectors, count = encoder.embed(texts, return_count=True)
    assert vectors == want and count == out["usage"]["prompt_tokens"]
    norm = sum(x * x for x in want[0]) ** 0.5
    assert abs(norm - 1) < 1e-5
    raw = encoder.embed(texts[0], normalize=False)
    assert abs(sum(x * x for x in raw) ** 0.5 - 1) > 1e-3


def test_encoder_refuses_generation(encoder):
    with pytest.raises(ValueError, match="encoder"):
        encoder.create_completion("hello", max_tokens=4)
    with pytest.raises(ValueError, match="encoder"):
        encoder.create_chat_completion(messages=[{"role": "user", "content": "hi"}])


# -- errors ----------------------------------------------------------------------------------


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        kiln.Llama(model_path=str(tmp_path / "nope.gguf"), verbose=False)


def test_unknown_name_is_value_error():
    with pytest.raises(ValueError, match="no-such-model"):
        kiln.Llama(model_path="no-such-model", verbose=False)


def test_bad_context_is_value_error():
    with pytest.raises(ValueError, match="n_ctx = -1"):
        kiln.Llama(model_path=MODEL, n_ctx=-1, verbose=False)
    with pytest.raises(ValueError, match="training context"):
        kiln.Llama(model_path=MODEL, n_ctx=10_000_000, verbose=False)


def test_bad_arguments_are_value_errors(llm):
    with pytest.raises(ValueError, match="temperature"):
        llm.create_completion(PROMPT, temperature=5.0)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.create_completion(PROMPT, max_tokens=CTX * 2)
    with pytest.raises(ValueError, match="typical_p"):
        llm.create_completion(PROMPT, typical_p=0.5)
    with pytest.raises(ValueError, match="mirostat_mode"):
        llm.create_chat_completion(messages=[{"role": "user", "content": "x"}], mirostat_mode=2)
    with pytest.raises(ValueError, match="logprobs"):
        llm.create_completion(PROMPT, logprobs=2)
    with pytest.raises(ValueError, match="token id"):
        llm.detokenize([10**9])
    with pytest.raises(ValueError, match="rope_freq_base"):
        kiln.Llama(model_path=MODEL, rope_freq_base=10000.0, verbose=False)
    with pytest.raises(TypeError, match="no_such_argument"):
        kiln.Llama(model_path=MODEL, no_such_argument=1, verbose=False)
    with pytest.raises(TypeError):
        llm.tokenize("not bytes")
    with pytest.raises(ValueError, match="UTF-8"):
        llm.tokenize(b"\xff\xfe")


def test_bad_chat_arguments_are_value_errors(chat):
    with pytest.raises(ValueError, match="response_format"):
        chat.create_chat_completion(
            messages=[{"role": "user", "content": "x"}], response_format={"type": "xml"}
        )
    with pytest.raises(ValueError, match="messages"):
        chat.create_chat_completion(messages=[])
    with pytest.raises(ValueError, match="role"):
        chat.create_chat_completion(messages=[{"content": "no role"}])
    with pytest.raises(ValueError, match="tools"):
        chat.create_chat_completion(
            messages=[{"role": "user", "content": "x"}], tools=[{"type": "retrieval"}]
        )
    with pytest.raises(ValueError, match="json_schema"):
        chat.create_chat_completion(
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x"}},
        )


def test_closed_model_raises():
    m = kiln.Llama(model_path=MODEL, n_ctx=64, verbose=False)
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m.create_completion("x")


def test_known_name_resolves_in_the_models_directory(tmp_path):
    # kiln reads KILN_MODELS once per process (src/tuning.rs), so a fresh interpreter.
    shutil.copy(MODEL, tmp_path / "tiny-fixture.gguf")
    code = (
        "import kiln, sys; "
        "m = kiln.Llama(model_path='tiny-fixture', n_ctx=64, verbose=False); "
        "print(m.model_path); m.close()"
    )
    env = dict(os.environ, KILN_MODELS=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert os.path.samefile(out.stdout.strip(), tmp_path / "tiny-fixture.gguf"), out.stderr


# -- the GIL and Ctrl-C ----------------------------------------------------------------------


def test_gil_is_released_while_generating(llm):
    done = threading.Event()
    ticks = 0

    def work():
        llm.create_completion(PROMPT, max_tokens=200, temperature=0)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    # Python ran on this thread while the model computed on the other.
    assert ticks > 10


def test_keyboard_interrupt_stops_a_generation():
    # A generation to the end of a 2048-token context takes seconds; Ctrl-C (here: the
    # interrupt a timer raises in the main thread) stops it between two tokens.
    big = kiln.Llama(model_path=MODEL, n_ctx=2048, n_threads=THREADS, verbose=False)
    # Python's own Ctrl-C handler, even where this process was started with SIGINT ignored
    # (a background job), which makes interrupt_main a no-op.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    for stream in (False, True):
        finished = False
        timer = threading.Timer(0.3, _thread.interrupt_main)
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            out = big.create_completion(PROMPT, max_tokens=None, temperature=0, stream=stream)
            if stream:
                for _ in out:
                    pass
            finished = True
            time.sleep(10)  # (the interrupt lands here if the generation was quicker)
        timer.cancel()
        assert not finished, "the generation ended before the interrupt came"
        assert time.monotonic() - t0 < 5
        # The model is usable at once.
        out = big.create_completion(PROMPT, max_tokens=2, temperature=0)
        assert out["usage"]["completion_tokens"] == 2
    signal.signal(signal.SIGINT, previous)
    big.close()
