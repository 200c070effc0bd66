#!/usr/bin/env python3
"""Write a mixture-of-experts GGUF with a real model's shape and random blocks, for measuring speed
side by side (scripts/bench-vs-ref.py) where the real weights cannot travel.

    scripts/twin-moe.py olmoe  OUT.gguf    # OLMoE-1B-7B shape, llama.cpp's Q4_K_M mix (~4 GB)
    scripts/twin-moe.py gpt-oss OUT.gguf   # gpt-oss-20b shape, as shipped: MXFP4 experts, Q8_0
                                           # attention, embedding and head (~12 GB)
    scripts/twin-moe.py olmoe OUT.gguf --layers 2   # fewer layers (a quick check)

The shapes and keys are the models' own (their config.json as llama.cpp converts it):
OLMoE-1B-7B-0924: 16 layers, 2048 wide, 16 heads of 128 (no GQA), 64 experts of width 1024, top 8,
q/k RMSNorm over the whole vectors, vocabulary 50304. gpt-oss-20b: 24 layers, 2880 wide, 64 query and
8 KV heads of 64, 32 experts of width 2880, top 4, biases everywhere, attention sinks, sliding
window 128 on every other layer (the first local), YaRN x32 over 4096, vocabulary 201088.

The quantization types follow the reference's choices: OLMoE Q4_K_M as `llama-quantize` makes it
(Q4_K everywhere; Q6_K for the head and, on the layers its `use_more_bits` picks, for attn_v and the
experts' down projections; the router in F32); gpt-oss as the released file (experts MXFP4, the
other matrices Q8_0, vectors and the router in F32).

Every block is valid (finite scales of a plausible size, random quants), so both engines load and
run the files at the speed of the real models; the text they produce is meaningless. To keep this
stdlib-only and fast, the quantized data is a pool of random blocks written cyclically from a
random block offset per tensor. The vocabulary is the 256 byte tokens of byte-level BPE, a few
merges and padding tokens up to the real size (both engines' bench runs use token ids only).
"""
import argparse
import os
import random
import struct
import sys

# GGML type id: (elements per block, bytes per block, byte offsets of fp16 scales, e8m0 offset)
F32, F16, Q8_0, Q4_K, Q6_K, MXFP4 = 0, 1, 8, 12, 14, 39
BLOCKS = {
    F32: (1, 4, (), None),
    Q8_0: (32, 34, (0,), None),
    Q4_K: (256, 144, (0, 2), None),
    Q6_K: (256, 210, (208,), None),
    MXFP4: (32, 17, (), 0),
}
TYPE_NAME = {F32: "F32", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K", MXFP4: "MXFP4"}
ALIGN = 32
RNG = random.Random(1234)

# GGUF value types
U32, I32, F32V, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == U32:
        return out + struct.pack("<I", value)
    if vtype == F32V:
        return out + struct.pack("<f", value)
    if vtype == BOOL:
        return out + struct.pack("<B", int(value))
    if vtype == STR:
        return out + gguf_str(value)
    etype, items = value
    out += struct.pack("<IQ", etype, len(items))
    if etype == STR:
        return out + b"".join(gguf_str(s) for s in items)
    if etype == I32:
        return out + struct.pack(f"<{len(items)}i", *items)
    raise ValueError(etype)


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


MERGES = ["Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "r e", "a t"]


def tokenizer(vocab, pre):
    tokens = bytes_to_unicode() + [m.replace(" ", "") for m in MERGES]
    types = [1] * len(tokens)
    while len(tokens) < vocab - 1:
        tokens.append(f"<pad_{len(tokens)}>")
        types.append(4)
    tokens.append("<|endoftext|>")
    types.append(3)
    eot = len(tokens) - 1
    return [
        kv("tokenizer.ggml.model", STR, "gpt2"),
        kv("tokenizer.ggml.pre", STR, pre),
        kv("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        kv("tokenizer.ggml.token_type", ARR, (I32, types)),
        kv("tokenizer.ggml.merges", ARR, (STR, MERGES)),
        kv("tokenizer.ggml.bos_token_id", U32, eot),
        kv("tokenizer.ggml.eos_token_id", U32, eot),
        kv("tokenizer.ggml.add_bos_token", BOOL, False),
    ]


def use_more_bits(i, n):
    """llama.cpp's choice of the Q4_K_M layers that get Q6_K (attn_v, ffn_down)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def olmoe(a):
    L, d, heads, hd, ne, used, ef, vocab = a.layers or 16, 2048, 16, 128, 64, 8, 1024, 50304
    arch = "olmoe"
    keys = [
        kv("general.architecture", STR, arch),
        kv("general.name", STR, f"twin-olmoe-1b-7b-{L}l"),
        kv("general.file_type", U32, 15),  # MOSTLY_Q4_K_M
        kv(f"{arch}.block_count", U32, L),
        kv(f"{arch}.context_length", U32, 4096),
        kv(f"{arch}.embedding_length", U32, d),
        kv(f"{arch}.feed_forward_length", U32, ef),
        kv(f"{arch}.attention.head_count", U32, heads),
        kv(f"{arch}.attention.head_count_kv", U32, heads),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", F32V, 1e-5),
        kv(f"{arch}.rope.freq_base", F32V, 10000.0),
        kv(f"{arch}.expert_count", U32, ne),
        kv(f"{arch}.expert_used_count", U32, used),
    ] + tokenizer(vocab, "olmo")
    t = [("token_embd.weight", (d, vocab), Q4_K), ("output_norm.weight", (d,), F32),
         ("output.weight", (d, vocab), Q6_K)]
    for i in range(L):
        p = f"blk.{i}."
        more = use_more_bits(i, L)
        t += [
            (p + "attn_norm.weight", (d,), F32),
            (p + "attn_q.weight", (d, heads * hd), Q4_K),
            (p + "attn_k.weight", (d, heads * hd), Q4_K),
            (p + "attn_v.weight", (d, heads * hd), Q6_K if more else Q4_K),
            (p + "attn_q_norm.weight", (heads * hd,), F32),
            (p + "attn_k_norm.weight", (heads * hd,), F32),
            (p + "attn_output.weight", (heads * hd, d), Q4_K),
            (p + "ffn_norm.weight", (d,), F32),
            (p + "ffn_gate_inp.weight", (d, ne), F32),
            (p + "ffn_gate_exps.weight", (d, ef, ne), Q4_K),
            (p + "ffn_up_exps.weight", (d, ef, ne), Q4_K),
            (p + "ffn_down_exps.weight", (ef, d, ne), Q6_K if more else Q4_K),
        ]
    return keys, t


def gpt_oss(a):
    L, d, heads, kvh, hd, ne, used, ef, vocab = a.layers or 24, 2880, 64, 8, 64, 32, 4, 2880, 201088
    arch = "gpt-oss"
    keys = [
        kv("general.architecture", STR, arch),
        kv("general.name", STR, f"twin-gpt-oss-20b-{L}l"),
        kv("general.file_type", U32, 38),  # MOSTLY_MXFP4_MOE
        kv(f"{arch}.block_count", U32, L),
        kv(f"{arch}.context_length", U32, 131072),
        kv(f"{arch}.embedding_length", U32, d),
        kv(f"{arch}.feed_forward_length", U32, ef),
        kv(f"{arch}.attention.head_count", U32, heads),
        kv(f"{arch}.attention.head_count_kv", U32, kvh),
        kv(f"{arch}.attention.key_length", U32, hd),
        kv(f"{arch}.attention.value_length", U32, hd),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", F32V, 1e-5),
        kv(f"{arch}.attention.sliding_window", U32, 128),
        kv(f"{arch}.rope.freq_base", F32V, 150000.0),
        kv(f"{arch}.rope.scaling.type", STR, "yarn"),
        kv(f"{arch}.rope.scaling.factor", F32V, 32.0),
        kv(f"{arch}.rope.scaling.original_context_length", U32, 4096),
        kv(f"{arch}.expert_count", U32, ne),
        kv(f"{arch}.expert_used_count", U32, used),
        kv(f"{arch}.expert_feed_forward_length", U32, ef),
    ] + tokenizer(vocab, "gpt-4o")
    t = [("token_embd.weight", (d, vocab), Q8_0), ("output_norm.weight", (d,), F32),
         ("output.weight", (d, vocab), Q8_0)]
    q, kvd = heads * hd, kvh * hd
    for i in range(L):
        p = f"blk.{i}."
        t += [(p + "attn_norm.weight", (d,), F32)]
        for name, out in [("q", q), ("k", kvd), ("v", kvd)]:
            t += [(p + f"attn_{name}.weight", (d, out), Q8_0), (p + f"attn_{name}.bias", (out,), F32)]
        t += [
            (p + "attn_output.weight", (q, d), Q8_0),
            (p + "attn_output.bias", (d,), F32),
            (p + "attn_sinks.weight", (heads,), F32),
            (p + "post_attention_norm.weight", (d,), F32),
            (p + "ffn_gate_inp.weight", (d, ne), F32),
            (p + "ffn_gate_inp.bias", (ne,), F32),
        ]
        for name, rows, cols in [("gate", ef, d), ("up", ef, d), ("down", d, ef)]:
            t += [(p + f"ffn_{name}_exps.weight", (cols, rows, ne), MXFP4),
                  (p + f"ffn_{name}_exps.bias", (rows, ne), F32)]
    return keys, t


def n_elems(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def n_bytes(qtype, shape):
    be, bb, _, _ = BLOCKS[qtype]
    if shape[0] % be:
        raise SystemExit(f"rows of {shape[0]} are not whole {TYPE_NAME[qtype]} blocks")
    return n_elems(shape) // be * bb


POOL_BLOCKS = 1 << 16


def block_pool(qtype):
    """POOL_BLOCKS random valid blocks of `qtype`, as bytes."""
    be, bb, scales, e8m0 = BLOCKS[qtype]
    data = bytearray(os.urandom(POOL_BLOCKS * bb))
    for b in range(POOL_BLOCKS):
        o = b * bb
        for off in scales:
            # fp16 scales of 2e-4 .. 2e-3, as a real file's small weights have.
            data[o + off:o + off + 2] = struct.pack("<e", RNG.uniform(2e-4, 2e-3))
        if e8m0 is not None:
            # MXFP4: E2M1 values up to 6 (stored doubled) times 2^(e - 128): weights below ~0.02.
            data[o + e8m0] = RNG.randint(117, 121)
    return bytes(data)


def f32_values(n, name):
    """Norm gains near 1, everything else small."""
    if name.endswith("norm.weight"):
        return struct.pack(f"<{n}f", *(1.0 + RNG.gauss(0, 0.1) for _ in range(n)))
    scale = 0.02 if "ffn_gate_inp.weight" in name else 0.05
    return struct.pack(f"<{n}f", *(RNG.gauss(0, scale) for _ in range(n)))


def write(path, keys, tensors):
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)) + b"".join(keys)
    infos, offset = [], 0
    for name, shape, qtype in tensors:
        infos.append(gguf_str(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, qtype, offset))
        offset += (n_bytes(qtype, shape) + ALIGN - 1) // ALIGN * ALIGN
    header += b"".join(infos)
    header += b"\0" * (-len(header) % ALIGN)
    pools = {}
    tmp = path + ".part"
    with open(tmp, "wb") as out:
        out.write(header)
        for name, shape, qtype in tensors:
            size = n_bytes(qtype, shape)
            if qtype == F32:
                out.write(f32_values(n_elems(shape), name))
            else:
                if qtype not in pools:
                    pools[qtype] = block_pool(qtype)
                pool = pools[qtype]
                start = RNG.randrange(POOL_BLOCKS) * BLOCKS[qtype][1]
                left = size
                while left:
                    chunk = pool[start:start + left]
                    out.write(chunk)
                    left -= len(chunk)
                    start = 0
            out.write(b"\0" * (-size % ALIGN))
    os.replace(tmp, path)
    total = sum(n_bytes(q, s) for _, s, q in tensors)
    print(f"{path}: {len(tensors)} tensors, {total / 2**30:.2f} GiB of weights")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=["olmoe", "gpt-oss"])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the real model's")
    a = ap.parse_args()
    keys, tensors = (olmoe if a.shape == "olmoe" else gpt_oss)(a)
    write(a.out, keys, tensors)


if __name__ == "__main__":
    sys.exit(main())
