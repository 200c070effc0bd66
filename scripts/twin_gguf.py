#!/usr/bin/env python3
"""Write a random-weight GGUF for speed measurements where the real weights cannot travel.

Two modes, both with valid blocks (finite fp16 scales, random quants), so every engine
loads and runs them at the speed of the real thing; the text they produce is meaningless.

  twin_gguf.py twin SRC.gguf OUT.gguf
      Same header as SRC (metadata, tokenizer, tensor table) and random tensor data.
      SRC may be a header-only prefix of the real file (head -c DATA_OFFSET): only the
      header is read.
  twin_gguf.py llama SRC.gguf OUT.gguf --layers 16 --dim 2048 --ffn 8192 --heads 32
               --kv-heads 8 [--vocab N] [--type Q4_0] [--out-type Q6_K] [--ctx 8192]
      A llama-architecture model of the given shape, with SRC's tokenizer (its vocabulary
      is padded with dummy tokens up to --vocab). Shapes of common models:
        Llama-3.2-1B: --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256
        Llama-3.1-8B: --layers 32 --dim 4096 --ffn 14336 --heads 32 --kv-heads 8 --vocab 128256
      --type may also be an i-quant whose f16 scale leads its block (IQ4_XS, IQ4_NL, IQ2_XXS,
      IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S): random blocks of those are valid as well.
  twin_gguf.py gemma2 SRC.gguf OUT.gguf [--mix Q4_K_M|Q8_0] [--layers 26 --dim 2304 --ffn 9216
               --heads 8 --kv-heads 4 --head-dim 256 --vocab 256000]
      A Gemma-2 model (Gemma-2-2B's shape by default) with SRC's tokenizer (a Gemma
      SentencePiece vocabulary; cut or padded to --vocab). --mix picks the tensor types as the
      reference's quantizer does for that file type: Q4_K_M keeps the tied embedding in Q6_K
      and attn_v / ffn_down in Q6_K on the layers its `use_more_bits` rule picks, Q4_K
      elsewhere; Q8_0 is Q8_0 throughout.

Needs numpy and the `gguf` package (pip install gguf numpy, or llama.cpp's gguf-py on PYTHONPATH).
"""
import argparse
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# block elements, block bytes, byte offsets of the fp16 scale fields
BLOCKS = {
    T.F32: (1, 4, ()), T.F16: (1, 2, ()), T.BF16: (1, 2, ()),
    T.Q4_0: (32, 18, (0,)), T.Q4_1: (32, 20, (0, 2)), T.Q5_0: (32, 22, (0,)),
    T.Q5_1: (32, 24, (0, 2)), T.Q8_0: (32, 34, (0,)),
    T.Q2_K: (256, 84, (80, 82)), T.Q3_K: (256, 110, (108,)), T.Q4_K: (256, 144, (0, 2)),
    T.Q5_K: (256, 176, (0, 2)), T.Q6_K: (256, 210, (208,)),
    T.IQ4_NL: (32, 18, (0,)), T.IQ4_XS: (256, 136, (0,)), T.IQ2_XXS: (256, 66, (0,)),
    T.IQ2_XS: (256, 74, (0,)), T.IQ2_S: (256, 82, (0,)), T.IQ3_XXS: (256, 98, (0,)),
    T.IQ3_S: (256, 110, (0,)), T.IQ1_S: (256, 50, (0,)),
}
RNG = np.random.default_rng(1234)
CHUNK = 1 << 22  # blocks per write


def n_bytes(qtype, n_elements):
    be, bb, _ = BLOCKS[qtype]
    assert n_elements % be == 0, (qtype, n_elements)
    return n_elements // be * bb


def write_random(out, qtype, n_elements):
    be, bb, scales = BLOCKS[qtype]
    left = n_elements // be
    while left:
        nb = min(left, CHUNK)
        if qtype == T.F32:
            a = (RNG.standard_normal(nb, dtype=np.float32) * 0.02).view(np.uint8)
        elif qtype == T.F16:
            a = (RNG.standard_normal(nb, dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8)
        elif qtype == T.BF16:
            f = (RNG.standard_normal(nb, dtype=np.float32) * 0.02).view(np.uint32)
            a = (f >> 16).astype(np.uint16).view(np.uint8)
        else:
            a = RNG.integers(0, 256, size=(nb, bb), dtype=np.uint8)
            for off in scales:
                d = RNG.uniform(2e-4, 2e-3, size=nb).astype(np.float16)
                a[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
        out.write(a.tobytes())
        left -= nb


def read_header(src):
    """A reader over SRC; a header-only prefix is extended, sparsely, so the tensor views exist."""
    import os, tempfile
    try:
        return gguf.GGUFReader(src), None
    except Exception:
        tmp = tempfile.NamedTemporaryFile(delete=False, suffix=".gguf")
        with open(src, "rb") as f:
            tmp.write(f.read())
        tmp.truncate(os.path.getsize(src) + (1 << 36))  # sparse: costs no disk
        tmp.close()
        return gguf.GGUFReader(tmp.name), tmp.name


def twin(src, dst):
    import os
    reader, tmp = read_header(src)
    tensors = sorted(reader.tensors, key=lambda t: t.data_offset)
    data0 = reader.data_offset
    with open(src, "rb") as f:
        head = f.read(data0)
    with open(dst, "wb") as out:
        out.write(head)
        pos = data0
        for t in tensors:
            if t.data_offset > pos:
                out.write(b"\0" * (t.data_offset - pos))
                pos = t.data_offset
            n = int(t.n_elements)
            write_random(out, T(t.tensor_type), n)
            pos += n_bytes(T(t.tensor_type), n)
    if tmp:
        os.unlink(tmp)
    print(f"{dst}: {len(tensors)} tensors, {pos / 2**20:.1f} MiB")


def copy_tokenizer(r, w, vocab):
    """SRC's tokenizer into writer `w`, its vocabulary cut or padded (dummy user-defined tokens)
    to `vocab` entries (0: as it is); returns the vocabulary size."""
    tok = {}
    for name, field in r.fields.items():
        if name.startswith("tokenizer."):
            tok[name] = field
    tokens = [bytes(tok["tokenizer.ggml.tokens"].parts[i]).decode("utf-8", "replace")
              for i in tok["tokenizer.ggml.tokens"].data]
    types = [int(tok["tokenizer.ggml.token_type"].parts[i][0]) for i in tok["tokenizer.ggml.token_type"].data]
    vocab = vocab or len(tokens)
    tokens, types = tokens[:vocab], types[:vocab]
    while len(tokens) < vocab:
        tokens.append(f"<pad_{len(tokens)}>")
        types.append(4)  # user-defined
    model = bytes(tok["tokenizer.ggml.model"].parts[-1]).decode()
    w.add_vocab_size(vocab)
    w.add_tokenizer_model(model)
    if "tokenizer.ggml.pre" in tok:
        w.add_tokenizer_pre(bytes(tok["tokenizer.ggml.pre"].parts[-1]).decode())
    w.add_token_list(tokens)
    w.add_token_types(types)
    if "tokenizer.ggml.merges" in tok:
        m = tok["tokenizer.ggml.merges"]
        w.add_token_merges([bytes(m.parts[i]).decode("utf-8", "replace") for i in m.data])
    if "tokenizer.ggml.scores" in tok:
        s = tok["tokenizer.ggml.scores"]
        sc = [float(s.parts[i][0]) for i in s.data][:vocab]
        w.add_token_scores(sc + [0.0] * (vocab - len(sc)))
    for k, fn in [("tokenizer.ggml.bos_token_id", w.add_bos_token_id), ("tokenizer.ggml.eos_token_id", w.add_eos_token_id)]:
        if k in tok and int(tok[k].parts[-1][0]) < vocab:
            fn(int(tok[k].parts[-1][0]))
    return vocab


def write_tensors(w, plan):
    """The tensor table `plan` ((name, numpy shape, type) rows) and random data for it."""
    for name, shape, q in plan:
        n = int(np.prod(shape))
        # GGUFWriter takes numpy (row-major) shapes: rows first
        if q == T.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), n_bytes(q, n))
        else:  # a quantized shape is given in bytes per row
            w.add_tensor_info(name, (*shape[:-1], n_bytes(q, shape[-1])), np.dtype(np.uint8), n_bytes(q, n), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    out = w.fout[0]
    align = w.data_alignment
    total = 0
    for name, shape, q in plan:
        pad = (-out.tell()) % align
        out.write(b"\0" * pad)
        write_random(out, q, int(np.prod(shape)))
        total += n_bytes(q, int(np.prod(shape)))
    out.write(b"\0" * ((-out.tell()) % align))
    out.close()
    return total


def llama(src, dst, a):
    r, _ = read_header(src)
    qt, ot = T[a.type], T[a.out_type]
    w = gguf.GGUFWriter(dst, "llama")
    w.add_name(f"twin-llama-{a.layers}x{a.dim}")
    w.add_block_count(a.layers)
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(a.dim // a.heads)
    vocab = copy_tokenizer(r, w, a.vocab)
    hd = a.dim // a.heads
    kvd = hd * a.kv_heads
    plan = [("token_embd.weight", (vocab, a.dim), qt)]
    for i in range(a.layers):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (a.dim,), T.F32),
                 (p + "attn_q.weight", (a.dim, a.dim), qt),
                 (p + "attn_k.weight", (kvd, a.dim), qt),
                 (p + "attn_v.weight", (kvd, a.dim), qt),
                 (p + "attn_output.weight", (a.dim, a.dim), qt),
                 (p + "ffn_norm.weight", (a.dim,), T.F32),
                 (p + "ffn_gate.weight", (a.ffn, a.dim), qt),
                 (p + "ffn_up.weight", (a.ffn, a.dim), qt),
                 (p + "ffn_down.weight", (a.dim, a.ffn), qt)]
    plan += [("output_norm.weight", (a.dim,), T.F32), ("output.weight", (vocab, a.dim), ot)]
    total = write_tensors(w, plan)
    print(f"{dst}: llama {a.layers} layers, dim {a.dim}, ffn {a.ffn}, {a.heads}/{a.kv_heads} heads, vocab {vocab}, {total / 2**30:.2f} GiB of weights")


def more_bits(i, n):
    """The reference quantizer's `use_more_bits(i_layer, n_layers)` (Q4_K_M's Q6_K layers)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def gemma2(src, dst, a):
    r, _ = read_header(src)
    w = gguf.GGUFWriter(dst, "gemma2")
    w.add_name(f"twin-gemma2-{a.layers}x{a.dim}")
    w.add_block_count(a.layers)
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(4096)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    vocab = copy_tokenizer(r, w, a.vocab)
    q8 = a.mix == "Q8_0"
    base = T.Q8_0 if q8 else T.Q4_K
    big = T.Q8_0 if q8 else T.Q6_K
    qd, kvd = a.head_dim * a.heads, a.head_dim * a.kv_heads
    plan = [("token_embd.weight", (vocab, a.dim), big)]
    for i in range(a.layers):
        p = f"blk.{i}."
        more = big if more_bits(i, a.layers) else base
        plan += [(p + "attn_norm.weight", (a.dim,), T.F32),
                 (p + "attn_q.weight", (qd, a.dim), base),
                 (p + "attn_k.weight", (kvd, a.dim), base),
                 (p + "attn_v.weight", (kvd, a.dim), more),
                 (p + "attn_output.weight", (a.dim, qd), base),
                 (p + "post_attention_norm.weight", (a.dim,), T.F32),
                 (p + "ffn_norm.weight", (a.dim,), T.F32),
                 (p + "ffn_gate.weight", (a.ffn, a.dim), base),
                 (p + "ffn_up.weight", (a.ffn, a.dim), base),
                 (p + "ffn_down.weight", (a.dim, a.ffn), more),
                 (p + "post_ffw_norm.weight", (a.dim,), T.F32)]
    plan += [("output_norm.weight", (a.dim,), T.F32)]
    total = write_tensors(w, plan)
    print(f"{dst}: gemma2 {a.mix} {a.layers} layers, dim {a.dim}, ffn {a.ffn}, {a.heads}/{a.kv_heads} heads of {a.head_dim}, vocab {vocab}, {total / 2**30:.2f} GiB of weights")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("twin")
    t.add_argument("src")
    t.add_argument("dst")
    l = sub.add_parser("llama")
    l.add_argument("src")
    l.add_argument("dst")
    for k, v in [("layers", 16), ("dim", 2048), ("ffn", 8192), ("heads", 32), ("kv_heads", 8), ("vocab", 0), ("ctx", 8192)]:
        l.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    l.add_argument("--type", default="Q4_0")
    l.add_argument("--out-type", default="Q6_K")
    g = sub.add_parser("gemma2")
    g.add_argument("src")
    g.add_argument("dst")
    for k, v in [("layers", 26), ("dim", 2304), ("ffn", 9216), ("heads", 8), ("kv_heads", 4),
                 ("head_dim", 256), ("vocab", 256000), ("ctx", 8192)]:
        g.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    g.add_argument("--mix", default="Q4_K_M", choices=["Q4_K_M", "Q8_0"])
    a = p.parse_args()
    if a.mode == "twin":
        twin(a.src, a.dst)
    elif a.mode == "gemma2":
        gemma2(a.src, a.dst, a)
    else:
        llama(a.src, a.dst, a)


if __name__ == "__main__":
    main()
