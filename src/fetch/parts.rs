//! `kiln pull URL` of a model split across files (`PREFIX-00001-of-00003.gguf`, as llama.cpp's
//! `gguf-split` writes them): the URL names the first part; every part is pulled.
//!
//! The other parts' URLs are the first one's with the part number in its file name changed
//! (`...-00002-of-00003.gguf`, the query kept), and each part is pulled as [`pull_url`] pulls
//! one file: into `NAME.gguf.part` with resume, its header checked, installed atomically, its
//! origin recorded. Parts are named after the first (`NAME-0000I-of-0000N`; with `--name X`,
//! `X-0000I-of-0000N`), so that the loader finds them beside it. The first part's
//! `split.count` must agree with its name; when all parts are there the model is opened whole
//! ([`GgufFile::open_model`]: every part's `split.no` and `split.count`, the tensor count). A part
//! the server does not have is a [`FetchError::MissingPart`] naming its file. A `--sha256` is
//! the sha256 of the file the URL names (the first part).
//!
//! A URL naming a later part is refused with the first part's URL; a file not named as a part
//! is [`pull_url`]'s alone.

use super::http::{name_from_url, pull_url, strip_gguf, PullOptions, Pulled};
use super::FetchError;
use crate::gguf::{split, GgufFile};

/// Part `no` (0-based) of `count` as a file name gives it (`...-00002-of-00003.gguf` → `(1, 3)`,
/// llama.cpp's spelling exactly); `None` when the name is not a part's or `count` is 1.
pub fn part_of_name(file: &str) -> Option<(usize, usize)> {
    // `-00002-of-00003.gguf`: 20 ASCII bytes, after a non-empty prefix.
    let n = file.len();
    let b = file.as_bytes().get(n.checked_sub(20)?..)?;
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if n == 20
        || b[0] != b'-'
        || !digits(1..6)
        || &b[6..10] != b"-of-"
        || !digits(10..15)
        || &b[15..] != b".gguf"
    {
        return None;
    }
    let tail = &file[n - 20..];
    let no: usize = tail[1..6].parse().ok()?;
    let count: usize = tail[10..15].parse().ok()?;
    (no >= 1 && no <= count && count > 1).then_some((no - 1, count))
}

/// The URL's last path segment (raw, not decoded), and the URL around it: `(before, file, after)`
/// with `after` the query and fragment.
fn url_file(url: &str) -> (&str, &str, &str) {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let end = url[scheme_end..]
        .find(['?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let path = &url[..end];
    let start = path[scheme_end..]
        .rfind('/')
        .map_or(end, |i| scheme_end + i + 1);
    (&url[..start], &url[start..end], &url[end..])
}

/// The URL of part `no` (0-based) of `count`, from the URL of any part of them.
fn part_url(url: &str, no: usize, count: usize) -> String {
    let (before, file, after) = url_file(url);
    let prefix = &file[..file.len() - 20];
    format!("{before}{prefix}{}{after}", split::suffix(no, count))
}

/// Whether `url` names the first part of a split model (what [`pull_url_parts`] pulls whole).
pub fn is_split_url(url: &str) -> bool {
    part_of_name(url_file(url).1).is_some_and(|(no, _)| no == 0)
}

/// Pull the model at `url`: the file alone, or, when it names the first part of a split model,
/// every part in order (see the module docs). The first element is the file `-m` takes.
pub fn pull_url_parts(url: &str, opts: &PullOptions) -> Result<Vec<Pulled>, FetchError> {
    let Some((no, count)) = part_of_name(url_file(url).1) else {
        return pull_url(url, opts).map(|p| vec![p]);
    };
    if no != 0 {
        return Err(FetchError::NotFirstPart {
            url: url.to_string(),
            part: no + 1,
            count,
            first: part_url(url, 0, count),
        });
    }
    let suffix0 = split::suffix(0, count);
    let stem0 = strip_gguf(&suffix0);
    let first_name = match &opts.name {
        Some(n) => {
            let n = strip_gguf(n.trim());
            if n.ends_with(stem0) {
                n.to_string()
            } else {
                format!("{n}{stem0}")
            }
        }
        None => name_from_url(url)?,
    };
    let prefix = match first_name.strip_suffix(stem0) {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => {
            return Err(FetchError::BadName {
                name: first_name,
                reason: format!(
                    "a split model's first part is named PREFIX{stem0}: pass --name PREFIX"
                ),
            })
        }
    };
    let mut first_opts = opts.clone();
    first_opts.name = Some(first_name.clone());
    let first = pull_url(url, &first_opts)?;
    let file = GgufFile::open(&first.path).map_err(|error| FetchError::BadSplit {
        path: first.path.clone(),
        error,
    })?;
    let declared = file
        .opt_u32(split::SPLIT_COUNT)
        .map_err(|error| FetchError::BadSplit {
            path: first.path.clone(),
            error,
        })?
        .unwrap_or(1) as usize;
    drop(file);
    if declared != count {
        return Err(FetchError::SplitCountMismatch {
            path: first.path.clone(),
            named: count,
            declared,
        });
    }
    if opts.progress && !first.already {
        eprintln!("kiln: {first_name} is the first of {count} parts; pulling the others");
    }

    let mut done = vec![first];
    for i in 1..count {
        let mut part_opts = opts.clone();
        part_opts.name = Some(format!("{prefix}{}", strip_gguf(&split::suffix(i, count))));
        part_opts.sha256 = None;
        let u = part_url(url, i, count);
        let got = pull_url(&u, &part_opts).map_err(|e| match e {
            FetchError::HttpStatus { status, .. }
                if status.starts_with("404") || status.starts_with("410") =>
            {
                FetchError::MissingPart {
                    file: url_file(&u).1.to_string(),
                    part: i + 1,
                    count,
                    url: u.clone(),
                    status,
                }
            }
            e => e,
        })?;
        done.push(got);
    }
    GgufFile::open_model(&done[0].path, false).map_err(|error| FetchError::BadSplit {
        path: done[0].path.clone(),
        error,
    })?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_as_llama_cpp_writes_them() {
        assert_eq!(part_of_name("M-Q4_K_M-00001-of-00003.gguf"), Some((0, 3)));
        assert_eq!(part_of_name("M-00003-of-00003.gguf"), Some((2, 3)));
        assert_eq!(
            part_of_name("M-00004-of-00003.gguf"),
            None,
            "past the count"
        );
        assert_eq!(
            part_of_name("M-00000-of-00003.gguf"),
            None,
            "parts count from 1"
        );
        assert_eq!(
            part_of_name("M-00001-of-00001.gguf"),
            None,
            "one part is no split"
        );
        assert_eq!(part_of_name("-00001-of-00003.gguf"), None, "no prefix");
        assert_eq!(
            part_of_name("M-00001-OF-00003.gguf"),
            None,
            "llama.cpp's case only"
        );
        assert_eq!(part_of_name("M-0000a-of-00003.gguf"), None);
        assert_eq!(part_of_name("M.gguf"), None);
        assert_eq!(part_of_name("Mé-00001-of-00002.gguf"), Some((0, 2)));
    }

    #[test]
    fn part_urls_keep_the_rest_of_the_url() {
        let u = "https://h/org/repo/resolve/main/M-Q8_0-00001-of-00003.gguf?download=true#x";
        assert!(is_split_url(u));
        assert_eq!(
            part_url(u, 2, 3),
            "https://h/org/repo/resolve/main/M-Q8_0-00003-of-00003.gguf?download=true#x"
        );
        let u2 = "http://h:8/a/M%20X-00002-of-00002.gguf";
        assert!(!is_split_url(u2), "a later part");
        assert_eq!(part_url(u2, 0, 2), "http://h:8/a/M%20X-00001-of-00002.gguf");
        assert!(!is_split_url("http://h/M.gguf"));
        assert!(!is_split_url("http://h/?q=M-00001-of-00002.gguf"));
        assert_eq!(url_file("http://h"), ("http://h", "", ""));
    }
}
