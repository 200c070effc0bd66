//! `kiln inspect FILE.gguf`: a model's headline figures, its block formats and (optionally) its
//! tensors. The figures come from [`kiln::gguf::ModelSummary`]; this file only prints them.

use anyhow::Context;
use kiln::gguf::summary::{human_bytes, human_count};
use kiln::gguf::{GgufFile, ModelSummary, TensorRow};

#[derive(clap::Args)]
pub struct InspectArgs {
    /// The model: a GGUF path, a known name or a pulled model's name.
    #[arg(value_name = "MODEL")]
    model: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also list every tensor (name, type, shape, offset, bytes).
    #[arg(long)]
    tensors: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let path = kiln::fetch::resolve_model(Some(&args.model), true)?;
    let f = GgufFile::open_model(&path, false)
        .with_context(|| format!("inspecting {}", path.display()))?;
    let summary = ModelSummary::from_file(&f);
    let tensors: Option<Vec<TensorRow>> = args
        .tensors
        .then(|| f.tensors().iter().map(|t| TensorRow::new(&f, t)).collect());

    if args.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            file: String,
            #[serde(flatten)]
            summary: &'a ModelSummary,
            #[serde(skip_serializing_if = "Option::is_none")]
            tensors: Option<&'a [TensorRow]>,
        }
        let out = Out {
            file: path.display().to_string(),
            summary: &summary,
            tensors: tensors.as_deref(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    print_summary(&path, &summary);
    if let Some(rows) = &tensors {
        println!();
        print_tensors(rows);
    }
    Ok(())
}

fn print_summary(path: &std::path::Path, s: &ModelSummary) {
    fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
        v.as_ref().map_or_else(|| "-".to_owned(), |v| v.to_string())
    }
    let row = |label: &str, value: String| println!("{label:<16} {value}");
    row("file", path.display().to_string());
    row("architecture", opt(&s.architecture));
    row("name", opt(&s.name));
    row("gguf version", s.gguf_version.to_string());
    row(
        "parameters",
        format!("{} ({})", human_count(s.parameters), s.parameters),
    );
    row("context length", opt(&s.context_length));
    row("layers", opt(&s.layers));
    row("heads", opt(&s.heads));
    row("kv heads", opt(&s.kv_heads));
    row("embedding dim", opt(&s.embedding_dim));
    row("ffn dim", opt(&s.ffn_dim));
    if s.head_dim.is_some() {
        row("head dim", opt(&s.head_dim));
    }
    row("rope base", opt(&s.rope_freq_base));
    row("tokenizer", opt(&s.tokenizer_model));
    row("pre-tokenizer", opt(&s.tokenizer_pre));
    row("vocab size", opt(&s.vocab_size));
    row(
        "chat template",
        if s.chat_template { "yes" } else { "no" }.to_owned(),
    );
    row(
        "tensors",
        format!(
            "{} ({} of data)",
            s.tensor_count,
            human_bytes(s.tensor_bytes)
        ),
    );
    for fs in &s.formats {
        println!(
            "  {:<8} {:>5} tensors {:>12} {:>6.2} bpw",
            fs.ty,
            fs.tensors,
            human_bytes(fs.bytes),
            fs.bytes as f64 * 8.0 / fs.elements.max(1) as f64
        );
    }
    row(
        "file size",
        format!("{} ({} bytes)", human_bytes(s.file_size), s.file_size),
    );
    for w in &s.warnings {
        println!("warning: {w}");
    }
}

fn print_tensors(rows: &[TensorRow]) {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:<6} {:<22} {:>12} {:>12}",
        "name", "type", "shape", "offset", "bytes"
    );
    for r in rows {
        let shape = format!("{:?}", r.shape);
        println!(
            "{:<width$}  {:<6} {:<22} {:>12} {:>12}",
            r.name, r.ty, shape, r.offset, r.bytes
        );
    }
}
