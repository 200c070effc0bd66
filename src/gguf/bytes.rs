//! The bytes behind a GGUF file (a read-only memory map or an owned buffer), zero-copy tensor
//! views into them, and the bounds-checked little-endian cursor the parser reads with.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use super::GgufError;

/// The whole file's bytes. Shared (`Arc`) between the [`super::GgufFile`] and every
/// [`TensorBytes`] view, so views stay valid after the file handle is dropped.
pub(crate) enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    /// Map `path`; with `populate`, read the whole file into the map now (MAP_POPULATE) instead
    /// of paging it in on first use.
    pub(crate) fn map(path: &Path, populate: bool) -> Result<Backing, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. The one hazard is another
        // process truncating or rewriting the file while it is mapped (reads would then see new
        // bytes or fault); like every mmap-based loader (llama.cpp included) we accept that
        // model files are not modified while in use. All reads go through bounds-checked slices.
        let mut opts = memmap2::MmapOptions::new();
        if populate {
            opts.populate();
        }
        let map = unsafe { opts.map(&file) }.map_err(io)?;
        Ok(Backing::Mmap(map))
    }
}

impl Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// The page size `release_range` assumes.
pub const PAGE: usize = 4096;

/// The whole pages inside the file byte range `range`: what releasing it gives back (the
/// partial pages at its ends stay, shared with the bytes beside it). The memory plan counts
/// released pages with it.
pub fn whole_pages(range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    let start = range.start.next_multiple_of(PAGE);
    start..(range.end / PAGE * PAGE).max(start)
}

/// A tensor's raw bytes: a cheap-to-clone view (`Arc` + range) into the file's backing.
///
/// Derefs to `&[u8]`. Data offsets are multiples of the file's alignment (32 by default) and a
/// memory map starts on a page, so in a mapped file the slice start is 32-byte aligned.
#[derive(Clone)]
pub struct TensorBytes {
    backing: Arc<Backing>,
    start: usize,
    len: usize,
}

impl TensorBytes {
    /// `start..start+len` must lie inside `backing`; the caller ([`super::GgufFile`]) clamps it.
    pub(crate) fn new(backing: Arc<Backing>, start: usize, len: usize) -> TensorBytes {
        debug_assert!(start.checked_add(len).is_some_and(|e| e <= backing.len()));
        TensorBytes {
            backing,
            start,
            len,
        }
    }

    /// Bytes that belong to no file (a weight rearranged at load).
    pub fn owned(bytes: Vec<u8>) -> TensorBytes {
        let len = bytes.len();
        TensorBytes::new(Arc::new(Backing::Owned(bytes)), 0, len)
    }

    /// Bytes `range` of this view, as a view of their own (one expert's matrix inside a 3-D
    /// tensor); the range is clamped to the view.
    pub fn slice(&self, range: std::ops::Range<usize>) -> TensorBytes {
        let end = range.end.min(self.len);
        let start = range.start.min(end);
        TensorBytes::new(self.backing.clone(), self.start + start, end - start)
    }

    /// Whether these bytes are the file's mapping (paged in from disk, evictable) rather than
    /// memory the process owns.
    pub fn is_mapped(&self) -> bool {
        matches!(*self.backing, Backing::Mmap(_))
    }

    /// Absolute byte offset of the first byte in the file.
    pub fn file_offset(&self) -> usize {
        self.start
    }

    /// Tells the kernel this view's bytes will not be read again for a while: the whole pages
    /// inside it are dropped from memory (a later read loads them from the file again). For a
    /// tensor whose bytes were copied out at load, so they do not count twice in resident
    /// memory. Does nothing for owned bytes or where the hint is unsupported.
    pub fn release(&self) {
        self.release_range(0..self.len);
    }

    /// [`TensorBytes::release`] for bytes `range` of this view only.
    pub fn release_range(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Backing::Mmap(m) = &*self.backing {
            let (a, b) = (range.start.min(self.len), range.end.min(self.len));
            let pages = whole_pages(self.start + a..self.start + b);
            if !pages.is_empty() {
                // SAFETY: the map is private and never written, so dropping its pages loses
                // nothing: any later read of them (through this or another view) faults the
                // file's bytes back in. The range lies inside the map (`new` checked the view,
                // and `a..b` is clamped to it).
                let _ = unsafe {
                    m.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        pages.start,
                        pages.len(),
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

impl Deref for TensorBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // `get` keeps this panic-free even if a foreign range slipped through.
        self.backing
            .get(self.start..self.start + self.len)
            .unwrap_or(&[])
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorBytes({}..{})", self.start, self.start + self.len)
    }
}

/// A bounds-checked little-endian reader over a byte slice. Every read either returns the bytes
/// or a [`GgufError::Truncated`] naming what was being read and where.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Current absolute position.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current position.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Take the next `n` bytes; `what` is only formatted into the error.
    pub(crate) fn take(
        &mut self,
        n: usize,
        what: &dyn Fn() -> String,
    ) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos,
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Check that `count` items of at least `min_size` encoded bytes each can still fit, before
    /// anything is allocated for them. Returns the count as `usize`.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: usize,
        what: &dyn Fn() -> String,
        offset: usize,
    ) -> Result<usize, GgufError> {
        let max = self.remaining() / min_size.max(1);
        match usize::try_from(count) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                offset,
                count,
                remaining: self.remaining(),
                max,
            }),
        }
    }

    /// A GGUF string: `u64` byte length, then that many UTF-8 bytes (no terminator).
    pub(crate) fn string(&mut self, what: &dyn Fn() -> String) -> Result<&'a str, GgufError> {
        let start = self.pos;
        let len = self.u64(&|| format!("length of {}", what()))?;
        let len = self.check_count(len, 1, &|| format!("length of {}", what()), start)?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|source| GgufError::InvalidUtf8 {
            what: what(),
            offset: start,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_pages_keep_the_partial_ends() {
        assert_eq!(whole_pages(0..3 * PAGE), 0..3 * PAGE);
        assert_eq!(whole_pages(10..3 * PAGE - 1), PAGE..2 * PAGE);
        assert_eq!(whole_pages(PAGE + 1..2 * PAGE + 5), 2 * PAGE..2 * PAGE);
        assert!(whole_pages(5..PAGE - 5).is_empty());
    }

    #[test]
    fn cursor_reads_and_reports_truncation() {
        let data = [1u8, 0, 0, 0, 2, 0];
        let mut c = Cursor::new(&data);
        assert_eq!(c.u32(&|| "a".into()).unwrap(), 1);
        match c.u32(&|| "the count".into()) {
            Err(GgufError::Truncated {
                what,
                offset,
                need,
                have,
            }) => {
                assert_eq!((what.as_str(), offset, need, have), ("the count", 4, 4, 2));
            }
            other => panic!("{other:?}"),
        }
        // A failed read does not move the cursor.
        assert_eq!(c.pos(), 4);
    }

    #[test]
    fn string_length_is_bounded_before_allocating() {
        let mut data = (u64::MAX).to_le_bytes().to_vec();
        data.extend_from_slice(b"abc");
        let mut c = Cursor::new(&data);
        let e = c.string(&|| "key".into()).unwrap_err();
        assert!(
            matches!(e, GgufError::CountTooLarge { offset: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn string_rejects_bad_utf8() {
        let mut data = 2u64.to_le_bytes().to_vec();
        data.extend_from_slice(&[0xff, 0xfe]);
        let e = Cursor::new(&data).string(&|| "key 'x'".into()).unwrap_err();
        assert!(
            e.to_string()
                .contains("key 'x' at byte 0 is not valid UTF-8"),
            "{e}"
        );
    }

    #[test]
    fn tensor_bytes_view() {
        let b = Arc::new(Backing::Owned((0u8..10).collect()));
        let t = TensorBytes::new(b, 3, 4);
        assert_eq!(&*t, &[3, 4, 5, 6]);
        assert_eq!(t.clone().file_offset(), 3);
    }
}
