//! Build a seed corpus for `gguf_parse` from a directory of GGUF files.
//!
//! For each file: its raw header (everything before the data section: parses up to the tensor
//! range check) and a shrunken valid copy (same metadata, first 8 tensors reduced to one block
//! each) small enough for libFuzzer's input size limit.

use kiln::gguf::{GgufFile, GgufWriter, RawTensor};

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../target/tmp/fixtures".into());
    let out = std::path::Path::new("corpus/gguf_parse");
    std::fs::create_dir_all(out)?;
    let mut n = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(&path)?;
        let file = GgufFile::from_bytes(bytes.clone())?;
        std::fs::write(
            out.join(format!("{stem}.header")),
            &bytes[..file.data_offset()],
        )?;

        let mut w = GgufWriter::from_file(&file);
        let small: Vec<RawTensor> = file
            .tensors()
            .iter()
            .take(8)
            .map(|t| RawTensor {
                name: t.name.clone(),
                dims: vec![t.ty.block_size() as u64],
                type_id: t.ty.id(),
                offset: None,
                data: vec![0x3c; t.ty.type_size()],
            })
            .collect();
        *w.tensors_mut() = small;
        let seed = w.to_bytes();
        GgufFile::from_bytes(seed.clone())?; // must be valid
        std::fs::write(out.join(format!("{stem}.small.gguf")), seed)?;
        n += 2;
    }
    println!("wrote {n} seeds to {}", out.display());
    Ok(())
}
