//! The engine: one scheduler over a batch runner for every generation and score (the server's
//! requests; the command line's and the Python bindings' through [`Engine`]: `run`, `chat`,
//! `bench`, `perplexity`), embeddings; sessions over a loaded model (one sequence's forward
//! passes, the tests' references), and the sizing both share.

pub mod batch;
pub mod embed;
pub mod local;
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

pub use local::{Engine, GenStats, GenerateRequest};
pub use perplexity::{perplexity, PerplexityReport};
pub use sequence::StopReason;
pub use session::{EngineError, Session, SessionOptions};
