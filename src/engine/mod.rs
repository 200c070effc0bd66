//! The engine: sessions over a loaded model, the generation loop, perplexity.

pub mod batch;
pub mod embed;
pub mod generate;
pub mod logprobs;
pub mod perplexity;
pub mod plan;
pub mod pooling;
pub mod rerank;
pub mod scheduler;
pub mod sequence;
pub mod session;
pub mod slot_drafter;
pub mod speculative;

pub use generate::{
    generate, generate_constrained, generate_with, GenStats, GenerateRequest, StopReason,
};
pub use perplexity::{perplexity, PerplexityReport};
pub use session::{EngineError, Session, SessionOptions};
