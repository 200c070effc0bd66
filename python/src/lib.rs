//! `kiln._kiln`: the Python extension behind `import kiln` (python/kiln/__init__.py gives it
//! llama-cpp-python's names and signatures).
//!
//! - [`model::Model`]: a loaded model with its tokenizer and one engine runner; tokenizes,
//!   embeds and starts generations. Requests arrive as the server's JSON bodies and go
//!   through the server's own parsing and checks ([`kiln::server::api`],
//!   [`kiln::server::tools`], [`kiln::server::structured`]), so a bad argument is refused
//!   with the server's message.
//! - [`run::Run`]: one generation, computed on a thread of its own by
//!   [`kiln::engine::Engine`] (what `kiln run` drives) while Python waits without the GIL;
//!   its text is shaped into OpenAI's dicts by the server's [`kiln::server::respond::Answers`].
//! - [`errors`]: kiln's errors as Python exceptions: `FileNotFoundError` for a missing model
//!   file, `ValueError` for a bad argument, `RuntimeError` for the rest; a panic becomes a
//!   `RuntimeError`, never a crash of the interpreter.

mod errors;
mod model;
mod run;

use pyo3::prelude::*;

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::Model>()?;
    m.add_class::<run::Run>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
