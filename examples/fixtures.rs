//! The fixture models of the test suite, outside the tests (used by `scripts/make-fixtures.py`).
//!
//!     cargo run --release --example fixtures -- recipes DIR
//!         write the F32 random models (`DIR/random-<recipe>-f32.gguf`) for the reference's
//!         quantizer to start from
//!     cargo run --release --example fixtures -- check MANIFEST [REFDIR]
//!         make every model of MANIFEST as the test suite does and check its sha256; with
//!         REFDIR (the reference's files), name the first tensor that differs

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln::fixtures::{random_f32, FixtureError, Manifest, RECIPES};
use kiln::gguf::GgufFile;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["recipes", dir] => recipes(Path::new(dir)),
        ["check", manifest] => check(Path::new(manifest), None),
        ["check", manifest, refdir] => check(Path::new(manifest), Some(Path::new(refdir))),
        _ => Err("usage: fixtures recipes DIR | fixtures check MANIFEST [REFDIR]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn recipes(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, r) in RECIPES {
        let path = dir.join(format!("random-{name}-f32.gguf"));
        random_f32(&r)
            .write(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

fn check(manifest: &Path, refdir: Option<&Path>) -> Result<(), String> {
    let text =
        std::fs::read_to_string(manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let m = Manifest::parse(&text).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut failed = 0;
    for name in m.models.keys() {
        match m.make(name) {
            Ok(_) => println!("ok       {name}"),
            Err(e) => {
                failed += 1;
                println!("MISMATCH {name}: {e}");
                if let (FixtureError::Mismatch { .. }, Some(dir)) = (&e, refdir) {
                    diff(&m, name, &dir.join(format!("{name}.gguf")));
                }
            }
        }
    }
    if failed > 0 {
        return Err(format!(
            "{failed} of {} fixtures differ from the reference",
            m.models.len()
        ));
    }
    Ok(())
}

/// Name what differs between our bytes and the reference's file.
fn diff(m: &Manifest, name: &str, reference: &PathBuf) {
    let ours = m.models.get(name).and_then(|e| {
        let src = e.from.as_ref()?;
        let src = GgufFile::from_bytes(m.make(src).ok()?).ok()?;
        let w = kiln::fixtures::derive(name, &src, e).ok()?;
        GgufFile::from_bytes(w.to_bytes()).ok()
    });
    let (Some(ours), Ok(theirs)) = (ours, GgufFile::open(reference)) else {
        println!(
            "         (cannot compare tensors with {})",
            reference.display()
        );
        return;
    };
    if ours.metadata() != theirs.metadata() {
        println!("         metadata differs");
    }
    for t in theirs.tensors() {
        match ours.tensor_info(&t.name) {
            Some(o) if ours.tensor_bytes(o)[..] == theirs.tensor_bytes(t)[..] => {}
            Some(_) => println!("         tensor {} ({}) differs", t.name, t.ty),
            None => println!("         tensor {} missing", t.name),
        }
    }
}
