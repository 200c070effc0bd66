//! `kiln list`: the models in the models directory, read from their GGUF headers.

use kiln::fetch;
use kiln::gguf::summary::human_bytes;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  kiln list
  kiln list --json | jq -r '.[].name'

The NAME column is what -m takes (kiln run -m NAME). Models live in $KILN_MODELS, else
~/.cache/kiln/models.")]
pub struct ListArgs {
    /// Print a JSON array (name, path, size, format, formats, architecture, parameters, source,
    /// error) instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ListArgs) -> anyhow::Result<()> {
    let dir = fetch::models_dir();
    let models = fetch::list_models(&dir);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&models)?);
        return Ok(());
    }
    let partials = fetch::partial_downloads(&dir);
    if models.is_empty() && partials.is_empty() {
        eprintln!(
            "kiln: no models in {}; `kiln pull` fetches the default one, `kiln pull URL` any GGUF file",
            dir.display()
        );
        return Ok(());
    }
    if !models.is_empty() {
        let rows: Vec<[String; 5]> = models
            .iter()
            .map(|m| {
                let dash = || "-".to_string();
                [
                    m.name.clone(),
                    human_bytes(m.size),
                    m.format.clone().unwrap_or_else(dash),
                    m.architecture.clone().unwrap_or_else(dash),
                    m.path.display().to_string(),
                ]
            })
            .collect();
        let header = ["NAME", "SIZE", "FORMAT", "ARCH", "PATH"].map(String::from);
        let mut width = [0usize; 4];
        for r in std::iter::once(&header).chain(&rows) {
            for (w, cell) in width.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |r: &[String; 5]| {
            println!(
                "{:<w0$}  {:>w1$}  {:<w2$}  {:<w3$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3],
            )
        };
        line(&header);
        for (r, m) in rows.iter().zip(&models) {
            line(r);
            if let Some(e) = &m.error {
                println!("    error: {e}");
            }
        }
    }
    for p in &partials {
        let of = p
            .total
            .map_or_else(String::new, |t| format!(" of {}", human_bytes(t)));
        match &p.url {
            Some(url) => println!(
                "partial download: {} ({}{of}); `kiln pull {url}` resumes it, `kiln rm {}` deletes it",
                p.name,
                human_bytes(p.bytes),
                p.name
            ),
            None => println!(
                "partial download: {} ({}), origin unknown; `kiln rm {}` deletes it",
                p.name,
                human_bytes(p.bytes),
                p.name
            ),
        }
    }
    Ok(())
}
