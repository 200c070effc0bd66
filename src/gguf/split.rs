//! Models split across files, as llama.cpp's `gguf-split` writes them and its loader reads
//! them: `PREFIX-00001-of-00003.gguf`, `PREFIX-00002-of-00003.gguf`, ... (`llama_split_path`).
//! Every part has `split.no` (0-based), `split.count` and `split.tensors.count` (the tensors of
//! all parts); the first part holds the model's metadata, each part some of its tensors.
//!
//! [`GgufFile::open_model`](super::GgufFile::open_model) opens a model from its first part:
//! the other parts' paths come from the first one's name (`llama_split_prefix`), each is mapped
//! and checked (its `split.no` and `split.count`), and the tensors of all parts form one table,
//! each tensor's bytes read from its own part. A part missing, misnumbered or misnamed is a
//! one-line error naming the file.

use std::path::{Path, PathBuf};

/// The metadata keys of a split model.
pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The file name suffix of part `no` (0-based) of `count`: `-00002-of-00003.gguf`.
pub fn suffix(no: usize, count: usize) -> String {
    format!("-{:05}-of-{:05}.gguf", no + 1, count)
}

/// The path of part `no` (0-based) of `count` parts named from `prefix` (`llama_split_path`).
pub fn part_path(prefix: &Path, no: usize, count: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix(no, count));
    PathBuf::from(s)
}

/// The prefix of `path` if it is named as part `no` of `count` (`llama_split_prefix`): the
/// path without `-0000{no+1}-of-0000{count}.gguf`, which must leave something.
pub fn prefix(path: &Path, no: usize, count: usize) -> Option<PathBuf> {
    let s = path.to_str()?;
    let p = s.strip_suffix(&suffix(no, count))?;
    (!p.is_empty()).then(|| PathBuf::from(p))
}

/// Every part's path of a model of `count` parts whose first part is `first`, or `None` when
/// `first` is not named as a first part.
pub fn part_paths(first: &Path, count: usize) -> Option<Vec<PathBuf>> {
    let p = prefix(first, 0, count)?;
    Some((0..count).map(|i| part_path(&p, i, count)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_llama_cpp() {
        let first = Path::new("/m/Model-Q4_K_M-00001-of-00003.gguf");
        assert_eq!(prefix(first, 0, 3), Some(PathBuf::from("/m/Model-Q4_K_M")));
        assert_eq!(prefix(first, 1, 3), None, "not part 2");
        assert_eq!(prefix(first, 0, 4), None, "not of 4");
        assert_eq!(prefix(Path::new("-00001-of-00003.gguf"), 0, 3), None);
        let parts = part_paths(first, 3).unwrap();
        assert_eq!(
            parts[2],
            PathBuf::from("/m/Model-Q4_K_M-00003-of-00003.gguf")
        );
        assert_eq!(parts[0], first);
        assert_eq!(suffix(11, 120), "-00012-of-00120.gguf");
        assert_eq!(part_paths(Path::new("/m/model.gguf"), 2), None);
    }
}
