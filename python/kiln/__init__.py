"""kiln: GGUF language models from Python, after llama-cpp-python's API.

    import kiln
    llm = kiln.Llama(model_path="smollm2", n_ctx=2048)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi!"}])
    print(out["choices"][0]["message"]["content"])

`Llama` loads a GGUF file (or a model kiln knows by name, as `kiln run -m NAME`) into kiln's
engine in this process. Requests are read and checked by the same code as `kiln serve`'s
(chat templates, tools, JSON-schema outputs, stop sequences), and the tokens are computed by the
same loop as `kiln run`, with the GIL released. Errors: `FileNotFoundError` (a missing model
file), `ValueError` (a bad argument, with kiln's message), `RuntimeError` (anything else).
See docs/python.md.
"""

import json

from ._kiln import Model as _Model
from ._kiln import __version__

__all__ = ["Llama", "__version__"]

# llama-cpp-python's constructor arguments that kiln does not implement, with the value that
# asks for nothing: any other value is refused by name rather than ignored.
_UNSUPPORTED_INIT = {
    "use_mlock": False,
    "vocab_only": False,
    "lora_path": None,
    "lora_base": None,
    "rope_freq_base": 0.0,
    "rope_freq_scale": 0.0,
    "logits_all": False,
    "split_mode": None,
    "main_gpu": 0,
    "tensor_split": None,
    "rpc_servers": None,
    "kv_overrides": None,
    "draft_model": None,
    "type_k": None,
    "type_v": None,
    "numa": False,
    "spm_infill": False,
}
# Accepted as they are: what they ask for is what kiln always does.
_ACCEPTED_INIT = {
    "use_mmap",  # kiln always maps the file
    "embedding",  # an encoder or a model with a pooling type embeds; generation is unchanged
    "n_threads_batch",  # one thread count serves prompt and generation
    "offload_kqv",  # with n_gpu_layers, the whole model and its cache are on the GPU
    "last_n_tokens_size",
}

# llama-cpp-python's sampling arguments that kiln does not implement, with their neutral
# values: any other value is refused by name.
_UNSUPPORTED_SAMPLING = {
    "typical_p": 1.0,
    "tfs_z": 1.0,
    "mirostat_mode": 0,
    "stopping_criteria": None,
    "logits_processor": None,
}


def _refuse(what, given, neutral):
    for name, default in neutral.items():
        if name in given and given[name] != default:
            raise ValueError(
                f"{name} = {given[name]!r} is not supported by kiln (refused rather than "
                f"ignored; leave it out or set it to {default!r})"
            )


def _stop_list(stop):
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return list(stop)


class Llama:
    """A GGUF model loaded into kiln, with llama-cpp-python's methods.

    model_path: a GGUF file, a known model's name (`smollm2`, `gemma3`) or a pulled model's
    name; None: the default model (downloaded on first use). n_ctx: the context (0: the model's
    training context). n_threads: None for the physical cores. n_gpu_layers: any value but 0
    runs the whole model on an NVIDIA GPU (`--device cuda`). seed: the sampling seed of calls
    that give none. chat_format: a chat template kiln knows by name instead of the model's own.
    """

    def __init__(
        self,
        model_path=None,
        *,
        n_ctx=512,
        n_threads=None,
        n_batch=512,
        n_gpu_layers=0,
        seed=None,
        chat_format=None,
        verbose=True,
        **kwargs,
    ):
        for name in kwargs:
            if name not in _UNSUPPORTED_INIT and name not in _ACCEPTED_INIT:
                raise TypeError(f"Llama() got an unexpected keyword argument {name!r}")
        _refuse("Llama()", kwargs, _UNSUPPORTED_INIT)
        if seed is not None and (seed == 0xFFFFFFFF or seed < 0):
            seed = None  # llama.cpp's "random seed"
        self.verbose = verbose
        self.chat_format = chat_format
        self._model = _Model(
            None if model_path is None else str(model_path),
            n_ctx,
            n_threads,
            n_batch,
            n_gpu_layers,
            seed,
            chat_format,
            verbose,
        )
        self.model_path = self._model.path()

    # -- the model --------------------------------------------------------------------------

    def n_ctx(self):
        """The context size in tokens."""
        return self._model.n_ctx()

    def n_vocab(self):
        """The vocabulary's size."""
        return self._model.n_vocab()

    def close(self):
        """Free the model; any later call raises ValueError."""
        self._model.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tokens -----------------------------------------------------------------------------

    def tokenize(self, text, add_bos=True, special=False):
        """Token ids of `text` (bytes, UTF-8); `special`: special-token text becomes tokens."""
        if isinstance(text, str):
            raise TypeError("tokenize takes bytes (text.encode('utf-8')), as llama-cpp-python")
        return self._model.tokenize(bytes(text), add_bos, special)

    def detokenize(self, tokens, prev_tokens=None, special=False):
        """The bytes of `tokens` (after `prev_tokens`, when given); control tokens only when
        `special`."""
        if prev_tokens:
            prev = self._model.detokenize(list(prev_tokens), special)
            both = self._model.detokenize(list(prev_tokens) + list(tokens), special)
            return both[len(prev):]
        return self._model.detokenize(list(tokens), special)

    # -- generation -------------------------------------------------------------------------

    def _run(self, kind, body, stream):
        body["stream"] = bool(stream)
        run = self._model.start(kind, json.dumps(body))
        if stream:
            return _chunks(run)
        return json.loads(run.whole())

    def create_completion(
        self,
        prompt,
        suffix=None,
        max_tokens=16,
        temperature=0.8,
        top_p=0.95,
        min_p=0.05,
        typical_p=1.0,
        logprobs=None,
        echo=False,
        stop=None,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        repeat_penalty=1.0,
        top_k=40,
        stream=False,
        seed=None,
        tfs_z=1.0,
        mirostat_mode=0,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        model=None,
        stopping_criteria=None,
        logits_processor=None,
        grammar=None,
        logit_bias=None,
    ):
        """Complete `prompt` (text, or a list of token ids) as a plain completion: OpenAI's
        `text_completion` dict, or with `stream=True` an iterator of its chunks.
        `max_tokens` None or <= 0: until the end of generation or a full context."""
        _refuse(
            "create_completion",
            {
                "typical_p": typical_p,
                "tfs_z": tfs_z,
                "mirostat_mode": mirostat_mode,
                "stopping_criteria": stopping_criteria,
                "logits_processor": logits_processor,
            },
            _UNSUPPORTED_SAMPLING,
        )
        if isinstance(prompt, bytes):
            prompt = prompt.decode("utf-8")
        body = {
            "prompt": prompt,
            "temperature": temperature,
            "top_p": top_p,
            "min_p": min_p,
            "top_k": top_k,
            "repeat_penalty": repeat_penalty,
            "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty,
            "stop": _stop_list(stop),
        }
        if max_tokens is not None and max_tokens > 0:
            body["max_tokens"] = max_tokens
        for name, value in (
            ("suffix", suffix),
            ("logprobs", logprobs),
            ("seed", seed),
            ("grammar", grammar),
            ("logit_bias", logit_bias),
        ):
            if value is not None:
                body[name] = value
        if echo:
            echoed = prompt if isinstance(prompt, str) else self.detokenize(prompt).decode(
                "utf-8", errors="replace"
            )
        else:
            echoed = ""
        if stream:
            return _echo_stream(self._run("completion", body, True), echoed)
        out = self._run("completion", body, False)
        if echoed:
            out["choices"][0]["text"] = echoed + out["choices"][0]["text"]
        return out

    __call__ = create_completion

    def create_chat_completion(
        self,
        messages,
        functions=None,
        function_call=None,
        tools=None,
        tool_choice=None,
        temperature=0.2,
        top_p=0.95,
        top_k=40,
        min_p=0.05,
        typical_p=1.0,
        stream=False,
        stop=None,
        seed=None,
        response_format=None,
        max_tokens=None,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repeat_penalty=1.0,
        tfs_z=1.0,
        mirostat_mode=0,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        model=None,
        logits_processor=None,
        grammar=None,
        logit_bias=None,
        logprobs=None,
        top_logprobs=None,
        parallel_tool_calls=None,
    ):
        """Answer a conversation through the model's chat template: OpenAI's
        `chat.completion` dict (tool calls parsed into `message.tool_calls`), or with
        `stream=True` an iterator of `chat.completion.chunk` dicts. `response_format`:
        `{"type": "json_object"}` (optionally with a `schema`) or `{"type": "json_schema",
        "json_schema": {"schema": ...}}`."""
        _refuse(
            "create_chat_completion",
            {
                "typical_p": typical_p,
                "tfs_z": tfs_z,
                "mirostat_mode": mirostat_mode,
                "logits_processor": logits_processor,
            },
            _UNSUPPORTED_SAMPLING,
        )
        if functions is not None:
            # OpenAI's legacy functions are tools of type function.
            if tools is not None:
                raise ValueError("give tools or functions, not both")
            tools = [{"type": "function", "function": f} for f in functions]
            if isinstance(function_call, dict):
                tool_choice = {"type": "function", "function": function_call}
            elif function_call is not None:
                tool_choice = function_call
        body = {
            "messages": messages,
            "temperature": temperature,
            "top_p": top_p,
            "min_p": min_p,
            "top_k": top_k,
            "repeat_penalty": repeat_penalty,
            "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty,
            "stop": _stop_list(stop),
        }
        if max_tokens is not None and max_tokens > 0:
            body["max_tokens"] = max_tokens
        for name, value in (
            ("tools", tools),
            ("tool_choice", tool_choice),
            ("parallel_tool_calls", parallel_tool_calls),
            ("response_format", response_format),
            ("seed", seed),
            ("grammar", grammar),
            ("logit_bias", logit_bias),
            ("logprobs", logprobs),
            ("top_logprobs", top_logprobs),
        ):
            if value is not None:
                body[name] = value
        return self._run("chat", body, stream)

    # -- embeddings -------------------------------------------------------------------------

    def embed(self, input, normalize=True, truncate=True, return_count=False):
        """The embedding of `input` (a text: one vector; a list of texts: one each), pooled as
        the model declares (pooling `none`: one vector per token), unit length when
        `normalize`. An input longer than the context raises ValueError (it is not cut)."""
        single = isinstance(input, str)
        texts = [input] if single else list(input)
        vectors, count = self._model.embed(texts, 2 if normalize else -1)
        out = [v[0] if len(v) == 1 else v for v in vectors]
        if single:
            out = out[0]
        return (out, count) if return_count else out

    def create_embedding(self, input, model=None):
        """OpenAI's embeddings response for `input` (a text or a list of texts)."""
        texts = [input] if isinstance(input, str) else list(input)
        vectors, count = self._model.embed(texts, 2)
        data = [
            {"object": "embedding", "embedding": v[0] if len(v) == 1 else v, "index": i}
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": model or self._model.id(),
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }


def _chunks(run):
    """A stream's chunks as dicts; closing the generator stops the generation."""
    try:
        for chunk in run:
            yield json.loads(chunk)
    finally:
        run.close()


def _echo_stream(chunks, echoed):
    first = True
    for c in chunks:
        if first and echoed:
            c["choices"][0]["text"] = echoed + c["choices"][0]["text"]
        first = False
        yield c
