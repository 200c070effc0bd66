//! Split models (`NAME-00001-of-00003.gguf`, ...), as llama.cpp's `gguf-split` writes them:
//! the first part with the model's metadata, every part with `split.no`, `split.count` and
//! `split.tensors.count` and some of the tensors. Loaded by the first part's path, a random
//! model split in three gives logits bit-identical to the file it was split from, and its
//! memory plan counts every part; a missing part, a part with the wrong `split.no` or
//! `split.count`, a first part misnamed, a part opened first, a wrong tensor count and a
//! tensor in two parts are each a one-line error naming the file.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln::engine::plan::plan;
use kiln::engine::{Session, SessionOptions};
use kiln::gguf::{GgufFile, GgufWriter, Value};
use kiln::model::Model;

/// Write `src` as `n` parts `DIR/STEM-0000I-of-0000N.gguf` as gguf-split does (tensors in
/// file order, an even share each), `edit(i, part)` applied to part `i` before it is
/// written; returns the first part's path.
fn split(
    src: &Path,
    dir: &Path,
    stem: &str,
    n: usize,
    edit: &dyn Fn(usize, &mut GgufWriter),
) -> PathBuf {
    let f = GgufFile::open(src).unwrap();
    let whole = GgufWriter::from_file(&f);
    let names: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
    let per = names.len().div_ceil(n);
    let mut first = None;
    for i in 0..n {
        let mut w = GgufWriter::from_file(&f);
        if i > 0 {
            for (k, _) in whole.metadata() {
                w.remove(k);
            }
        }
        w.add("split.no", Value::U16(i as u16));
        w.add("split.count", Value::U16(n as u16));
        w.add("split.tensors.count", Value::I32(names.len() as i32));
        for (j, name) in names.iter().enumerate() {
            if j / per != i {
                w.remove_tensor(name);
            }
        }
        edit(i, &mut w);
        let path = dir.join(format!("{stem}-{:05}-of-{n:05}.gguf", i + 1));
        w.write(&path).unwrap();
        first.get_or_insert(path);
    }
    first.unwrap()
}

/// The logits after each token of a prompt and of 8 greedy steps.
fn logits(m: Model) -> Vec<Vec<f32>> {
    let mut s = Session::new(Arc::new(m), SessionOptions::new(64, 2)).unwrap();
    let mut out = vec![s
        .prefill(&[10, 20, 30, 40, 50], &mut |_, _| {})
        .unwrap()
        .to_vec()];
    for _ in 0..8 {
        let l = out.last().unwrap();
        let t = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
        out.push(s.decode(t).unwrap().to_vec());
    }
    out
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-split-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn split_model_in_three_parts_gives_the_same_logits() {
    for stem in ["random-llama-f32", "random-llama-q4_k"] {
        let src = common::random_model(stem);
        let dir = tmp(stem);
        let first = split(&src, &dir, stem, 3, &|_, _| {});
        let parts = GgufFile::open_model(&first, false).unwrap();
        let whole = GgufFile::open(&src).unwrap();
        assert_eq!(parts.n_parts(), 3);
        assert_eq!(parts.tensors().len(), whole.tensors().len());
        let on_disk: usize = (1..=3)
            .map(|i| {
                std::fs::metadata(dir.join(format!("{stem}-{i:05}-of-00003.gguf")))
                    .unwrap()
                    .len() as usize
            })
            .sum();
        assert_eq!(parts.file_size(), on_disk);
        for t in whole.tensors() {
            let p = parts.tensor_info(&t.name).expect("every tensor");
            assert_eq!(
                &parts.tensor_bytes(p)[..],
                &whole.tensor_bytes(t)[..],
                "{}",
                t.name
            );
        }
        // The plan counts every part's bytes: the weights of the whole file, and a page or
        // so of each further part's header.
        let opts = SessionOptions::new(256, 2);
        let a = plan(&whole, &opts, 1, Default::default())
            .unwrap()
            .total_bytes;
        let b = plan(&parts, &opts, 1, Default::default())
            .unwrap()
            .total_bytes;
        assert!(
            b >= a && b - a < 64 << 10,
            "{stem}: plan {b} of the parts, {a} of the file"
        );

        let want = logits(Model::load(&src).unwrap());
        let got = logits(Model::load(&first).unwrap());
        assert_eq!(got, want, "{stem}: logits of the split model differ");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The error of loading `path`: one line, naming `names`.
fn load_error(path: &Path, names: &Path) -> String {
    let e = match Model::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    };
    assert!(!e.contains('\n'), "one line: {e}");
    let name = names.file_name().unwrap().to_str().unwrap();
    assert!(e.contains(name), "{e} does not name {name}");
    e
}

#[test]
fn split_parts_missing_or_wrong_are_refused_naming_the_file() {
    let stem = "random-llama-f32";
    let src = common::random_model(stem);
    let dir = tmp("bad");
    let part = |i: usize| dir.join(format!("{stem}-{i:05}-of-00003.gguf"));
    let none = |_: usize, _: &mut GgufWriter| {};

    // A missing part.
    let first = split(&src, &dir, stem, 3, &none);
    std::fs::remove_file(part(3)).unwrap();
    let e = load_error(&first, &part(3));
    assert!(e.contains("missing"), "{e}");

    // A part numbered as another.
    split(&src, &dir, stem, 3, &|i, w| {
        if i == 1 {
            w.set("split.no", Value::U16(2));
        }
    });
    let e = load_error(&first, &part(2));
    assert!(e.contains("split.no = 2"), "{e}");

    // A part of another split count.
    split(&src, &dir, stem, 3, &|i, w| {
        if i == 2 {
            w.set("split.count", Value::U16(4));
        }
    });
    let e = load_error(&first, &part(3));
    assert!(e.contains("split.count = 4"), "{e}");

    // Opened by a later part.
    split(&src, &dir, stem, 3, &none);
    let e = load_error(&part(2), &part(2));
    assert!(e.contains("first part"), "{e}");

    // The first part under another name: its siblings cannot be named.
    let renamed = dir.join("model.gguf");
    std::fs::copy(&first, &renamed).unwrap();
    let e = load_error(&renamed, &renamed);
    assert!(e.contains("-00001-of-00003.gguf"), "{e}");

    // A tensor count that the parts do not hold.
    split(&src, &dir, stem, 3, &|i, w| {
        if i == 0 {
            w.set("split.tensors.count", Value::I32(7));
        }
    });
    let e = load_error(&first, &first);
    assert!(e.contains("split.tensors.count = 7"), "{e}");

    // A tensor in two parts.
    let f = GgufFile::open(&src).unwrap();
    let dup = f.tensors()[0].name.clone();
    let bytes = f.tensor_bytes(&f.tensors()[0]).to_vec();
    let shape = f.tensors()[0].shape.clone();
    let ty = f.tensors()[0].ty;
    split(&src, &dir, stem, 3, &|i, w| {
        if i == 2 {
            w.add_tensor(&dup, &shape, ty, bytes.clone());
        }
    });
    let e = load_error(&first, &part(3));
    assert!(e.contains(&dup), "{e}");

    // One part parsed alone (not by its path) is refused by the model loader.
    let alone = GgufFile::from_bytes(std::fs::read(&first).unwrap()).unwrap();
    let e = Model::from_gguf(alone).err().expect("refused").to_string();
    assert!(e.contains("split.count"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
