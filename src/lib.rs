//! kiln: a CPU inference engine for GGUF language models.
//!
//! Read it in the order a token flows:
//! - [`gguf`]: the file format, memory-mapped; tensors are zero-copy views into the map.
//! - [`quant`]: block formats (one `#[repr(C)]` struct each), scalar reference dequantizers,
//!   activation quantizers and the SIMD dot-product kernels chosen at run time.
//! - [`tokenizer`]: byte-level BPE and SentencePiece vocabularies, chat templates.
//! - [`model`]: hyper-parameters, weights and one short file per architecture.
//! - [`kernels`]: the compute seam (matmul, norms, RoPE, attention, thread pool).
//! - [`cache`]: the pre-allocated KV cache and scratch buffers.
//! - [`engine`]: prefill / decode loop, generation, perplexity.
//! - [`sampler`]: logits → next token.
//! - [`grammar`]: structured output (JSON schema, GBNF, Lark) with llguidance: token masks.
//! - [`server`]: the OpenAI-compatible HTTP server over the continuous-batching scheduler.
//! - [`fetch`]: getting models: the reference models from their registry packages, any GGUF
//!   file over HTTP(S) (resumable), the models directory (`kiln list`, `kiln rm`, `-m NAME`).
//! - [`fixtures`]: the small random-weight models the tests check against the reference engine.
//! - [`tuning`]: every `KILN_*` environment variable, read once into typed fields.

pub mod backend;
pub mod cache;
pub mod engine;
pub mod fetch;
pub mod fixtures;
pub mod gguf;
pub mod grammar;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod sampler;
pub mod server;
pub mod tokenizer;
pub mod tuning;
