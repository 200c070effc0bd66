//! kiln's errors as Python exceptions, with kiln's messages.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

use kiln::engine::EngineError;
use kiln::fetch::FetchError;
use kiln::server::error::ApiError;

/// A request the server would answer with a 4xx: a bad argument; anything else: a failure.
pub fn api(e: ApiError) -> PyErr {
    if e.status.is_client_error() {
        PyValueError::new_err(e.message)
    } else {
        PyRuntimeError::new_err(e.message)
    }
}

/// A model that cannot be found: a missing file, or a name kiln does not know.
pub fn fetch(e: FetchError) -> PyErr {
    match e {
        FetchError::NoSuchFile { .. } => PyFileNotFoundError::new_err(e.to_string()),
        FetchError::UnknownModel { .. } => PyValueError::new_err(e.to_string()),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

/// An engine error: sizes the caller chose (the context, the prompt) are bad arguments.
pub fn engine(e: EngineError) -> PyErr {
    match e {
        EngineError::ContextTooLarge { .. }
        | EngineError::PromptTooLong { .. }
        | EngineError::EmptyPrompt
        | EngineError::Encoder { .. } => PyValueError::new_err(e.to_string()),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

pub fn value(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

pub fn runtime(msg: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(msg.to_string())
}

/// A panic's message.
pub fn panic_message(p: &(dyn Any + Send)) -> String {
    match (p.downcast_ref::<&str>(), p.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "unknown panic".to_string(),
    }
}

/// Run `f`, turning a panic into a `RuntimeError` instead of letting it reach Python.
pub fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, PyErr>) -> Result<T, PyErr> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(runtime(format!(
            "kiln failed {what}: {} (a bug: please report it)",
            panic_message(p.as_ref())
        )))
    })
}
