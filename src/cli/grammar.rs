//! Structured-output flags of `kiln run`, as llama.cpp names them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use kiln::grammar::{Constraint, GrammarEngine, GrammarSpec};
use kiln::tokenizer::Tokenizer;

#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Structured output")]
pub struct GrammarArgs {
    /// Constrain the output to this JSON schema: inline JSON, or the path of a file holding it.
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA|FILE")]
    pub json_schema: Option<String>,
    /// Constrain the output to the JSON schema in FILE.
    #[arg(long = "json-schema-file", value_name = "FILE", conflicts_with_all = ["json_schema", "grammar", "grammar_file"])]
    pub json_schema_file: Option<PathBuf>,
    /// Constrain the output to a GBNF grammar (llama.cpp's; `%llguidance` first for Lark): the
    /// grammar's text, or the path of a file holding it.
    #[arg(long = "grammar", value_name = "GRAMMAR|FILE", conflicts_with_all = ["json_schema", "grammar_file"])]
    pub grammar: Option<String>,
    /// Constrain the output to the GBNF grammar in FILE.
    #[arg(
        long = "grammar-file",
        value_name = "FILE",
        conflicts_with = "json_schema"
    )]
    pub grammar_file: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))
}

impl GrammarArgs {
    /// What the flags ask for (`None`: unconstrained).
    pub fn spec(&self) -> Result<Option<GrammarSpec>> {
        let schema_text = match (&self.json_schema, &self.json_schema_file) {
            (Some(s), _) if s.trim_start().starts_with(['{', '[']) || s.trim() == "true" => {
                Some((s.clone(), "--json-schema"))
            }
            (Some(s), _) => Some((read(Path::new(s), "JSON schema file")?, s.as_str())),
            (None, Some(f)) => Some((read(f, "JSON schema file")?, "--json-schema-file")),
            (None, None) => None,
        };
        if let Some((text, from)) = schema_text {
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("the JSON schema of {from} is not valid JSON"))?;
            return Ok(Some(GrammarSpec::JsonSchema(v)));
        }
        let grammar = match (&self.grammar, &self.grammar_file) {
            // A file's name holds no `::=` and no newline; a grammar always has `::=` or `:`.
            (Some(g), _) if !g.contains("::=") && !g.contains('\n') && Path::new(g).is_file() => {
                Some(read(Path::new(g), "grammar file")?)
            }
            (Some(g), _) => Some(g.clone()),
            (None, Some(f)) => Some(read(f, "grammar file")?),
            (None, None) => None,
        };
        Ok(grammar.map(|g| GrammarSpec::from_grammar_text(&g)))
    }
}

/// `spec` compiled for `tok`'s model.
pub fn constraint(spec: Option<&GrammarSpec>, tok: &Tokenizer) -> Result<Option<Constraint>> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let engine = GrammarEngine::from_tokenizer(tok)?;
    Ok(Some(engine.compile(spec)?))
}
