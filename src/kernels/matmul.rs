//! Weight matrices and the matrix products over them.
//!
//! The column-major trap: GGUF lists a weight's dimensions fastest-first, so a projection from
//! `in_dim` to `out_dim` has `shape = [in_dim, out_dim]` and is stored as `out_dim` contiguous
//! rows of `in_dim` elements. `y = W·x` is therefore one dot product per stored row.
//!
//! Activations are quantized once per input row to the weight format's partner type (Q8_0,
//! Q8_1, Q8_K, or f16/bf16/f32 for float weights), then every output row is an integer dot
//! product against them. Several projections reading the same input (Q, K and V; gate and up)
//! run as one pool dispatch, so both cores work on one combined list of rows.

use super::pool::{DisjointSlice, ThreadPool};
use crate::gguf::TensorBytes;
use crate::quant::{self, repack, GemmArgs, GgmlType, Kernels};
use std::ops::Range;

mod experts;
pub use experts::{experts_product, ExpertRows, GatedAct};

/// Rows computed per call of the gemm micro-kernel.
const TILE_ROWS: usize = 16;
/// Work items per thread in a matrix product over a batch: enough that a descheduled or
/// slower thread's share is picked up by the others, few enough that taking an item costs
/// nothing. (A matrix-vector product instead streams one run per thread, shared out only
/// when a thread falls behind: [`ThreadPool::run_split`].)
const ITEMS_PER_THREAD: usize = 6;

/// A weight matrix `[out_dim, in_dim]` with the kernels for its block format. (A clone shares
/// the bytes.)
#[derive(Clone)]
pub struct Linear {
    /// The tensor's name in the file, for error messages and debugging taps.
    pub name: String,
    /// Elements per row (GGUF `ne[0]`).
    pub in_dim: usize,
    /// Rows (GGUF `ne[1]`).
    pub out_dim: usize,
    /// Bytes per stored row.
    pub row_bytes: usize,
    /// `out_dim * row_bytes` bytes: a zero-copy view into the model file, or owned bytes
    /// rearranged at load ([`Linear::repacked`]).
    pub data: TensorBytes,
    /// Dot products, activation quantizer and dequantizer for this format, chosen at load.
    pub kernels: Kernels,
    /// Optional bias `[out_dim]`.
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn ty(&self) -> GgmlType {
        self.kernels.weight
    }

    /// Bytes of one quantized activation row for this matrix.
    pub fn act_row_bytes(&self) -> usize {
        self.kernels.act.row_bytes(self.in_dim).unwrap_or(0)
    }

    /// Dequantize stored row `i` (an embedding lookup) into `out[..in_dim]`.
    pub fn row_f32(&self, i: usize, out: &mut [f32]) {
        let g = self.kernels.group;
        if g > 1 && i < self.out_dim / g * g {
            let group = &self.data[i / g * g * self.row_bytes..(i / g + 1) * g * self.row_bytes];
            repack::dequantize_row(&self.kernels, group, i % g, &mut out[..self.in_dim]);
            return;
        }
        let src = &self.data[i * self.row_bytes..(i + 1) * self.row_bytes];
        (self.kernels.dequantize)(src, &mut out[..self.in_dim]);
    }

    /// This matrix in the layout its format multiplies fastest in on this CPU, if that is not
    /// the file's (`quant::repacking`): the rearranged bytes are owned. Whole groups of rows
    /// are rearranged a few MiB at a time, and the file's pages behind each run are released
    /// once it is copied, so the two copies never sit in memory together beyond a run per
    /// thread. [`Linear::row_f32`] still reads single rows (a tied embedding).
    pub fn repacked(self) -> Linear {
        let choice = quant::repacking(&self.kernels, self.out_dim, self.in_dim);
        self.repacked_as(choice)
    }

    /// [`Linear::repacked`] for the output (logits) matrix, whose 32-element formats then sum
    /// whole blocks (`quant::repacking_for_logits`), where that layout pays on this CPU
    /// (`quant::logits_layout`).
    pub fn repacked_for_logits(self) -> Linear {
        let choice = quant::logits_layout(&self.kernels, self.out_dim, self.in_dim);
        self.repacked_as(choice)
    }

    /// This matrix rearranged by `choice` (a layout and its kernels), if any.
    fn repacked_as(self, choice: Option<(repack::RepackFn, Kernels)>) -> Linear {
        // A large matrix (a tied output matrix of 178 MB) is rearranged by a thread per core
        // (at load, before any `--threads` pool exists).
        let helpers = (self.data.len() / (4 * REPACK_RUN_BYTES))
            .min(super::pool::default_threads().saturating_sub(1));
        self.repacked_in_runs(choice, REPACK_RUN_BYTES, helpers)
    }

    /// [`Linear::repacked_as`] in runs of about `run_bytes`, with `helpers` threads besides the
    /// calling one.
    fn repacked_in_runs(
        self,
        choice: Option<(repack::RepackFn, Kernels)>,
        run_bytes: usize,
        helpers: usize,
    ) -> Linear {
        let Some((layout, kernels)) = choice else {
            return self;
        };
        let mut out = vec![0u8; self.data.len()];
        let rb = self.row_bytes.max(1);
        // Runs of whole groups; the last one also holds the rows after the last group.
        let run = (run_bytes / rb).max(1).next_multiple_of(kernels.group);
        let runs = std::sync::Mutex::new(out.chunks_mut(run * rb).enumerate());
        let work = || loop {
            let Some((k, dst)) = runs.lock().unwrap_or_else(|e| e.into_inner()).next() else {
                return;
            };
            let bytes = k * run * rb..k * run * rb + dst.len();
            layout(&self.data[bytes.clone()], dst.len() / rb, self.in_dim, dst);
            self.data.release_range(bytes);
        };
        std::thread::scope(|sc| {
            for _ in 0..helpers {
                sc.spawn(work);
            }
            work();
        });
        // The pages straddling two runs, which neither run could release alone.
        self.data.release();
        Linear {
            data: TensorBytes::owned(out),
            kernels,
            ..self
        }
    }
}

/// Weight bytes [`Linear::repacked`] rearranges at a time.
const REPACK_RUN_BYTES: usize = 4 << 20;

/// Per-thread output tiles for the matrix products, sized once for the largest batch.
pub struct MatmulScratch {
    /// `[n_threads][2][TILE_ROWS * max_tokens]`: a thread's pair of tiles (a gated product
    /// fills both).
    tiles: Vec<f32>,
    tile_len: usize,
    /// Token counts of the independent sequences in the batch, in order (empty: one sequence).
    /// Formats whose arithmetic depends on the batch (Q4_K, Q6_K: see [`crate::quant::GemmFn`])
    /// then run each sequence's rows as a batch of their own, so a sequence's results do not
    /// depend on what it is batched with.
    segments: Vec<usize>,
    /// `max_tokens` ones: the segments of rows that are each alone.
    ones: Vec<usize>,
}

impl MatmulScratch {
    pub fn new(max_tokens: usize, n_threads: usize) -> Self {
        let tile_len = TILE_ROWS * max_tokens;
        MatmulScratch {
            tiles: vec![0.0; 2 * tile_len * n_threads],
            tile_len,
            segments: Vec::with_capacity(max_tokens),
            ones: vec![1; max_tokens],
        }
    }

    /// Declare the batch's sequences by their token counts (one entry, or none, for a single
    /// sequence). Allocation-free up to `max_tokens` sequences.
    pub fn set_segments(&mut self, lens: impl Iterator<Item = usize>) {
        self.segments.clear();
        self.segments.extend(lens);
        if self.segments.len() < 2 {
            self.segments.clear();
        }
    }

    /// The declared sequences' token counts (empty: one sequence).
    pub fn segments(&self) -> &[usize] {
        &self.segments
    }

    /// The tiles, and the segment lists (declared, and the ones).
    pub fn bytes_for(max_tokens: usize, n_threads: usize) -> usize {
        2 * TILE_ROWS * max_tokens * n_threads * 4 + 2 * max_tokens * size_of::<usize>()
    }

    pub fn bytes(&self) -> usize {
        self.tiles.len() * 4 + (self.segments.capacity() + self.ones.len()) * size_of::<usize>()
    }
}

/// Quantize `n` rows of `x` (`[n, in_dim]` f32) to `lin`'s activation format in `out`.
/// Returns the bytes per quantized row.
pub fn quantize_input(
    pool: &ThreadPool,
    lin: &Linear,
    x: &[f32],
    n: usize,
    out: &mut [u8],
) -> usize {
    let in_dim = lin.in_dim;
    let rb = lin.act_row_bytes();
    assert!(
        x.len() >= n * in_dim && out.len() >= n * rb,
        "{}: activation buffer too small",
        lin.name
    );
    let quantize = lin.kernels.quantize_act;
    if n < 4 {
        for j in 0..n {
            quantize(
                &x[j * in_dim..(j + 1) * in_dim],
                &mut out[j * rb..(j + 1) * rb],
            );
        }
        return rb;
    }
    let dst = DisjointSlice::new(&mut out[..n * rb]);
    pool.for_each_range(n, &|rows| {
        // SAFETY: the pool hands each thread a disjoint range of rows.
        let d = unsafe { dst.part(rows.start * rb..rows.end * rb) };
        for (k, j) in rows.enumerate() {
            quantize(
                &x[j * in_dim..(j + 1) * in_dim],
                &mut d[k * rb..(k + 1) * rb],
            );
        }
    });
    rb
}

/// An element-wise function a product applies to each tile of its outputs (bias added) on the
/// thread that computed it, before storing it: the output head's scale and soft cap. Each
/// output then has the bits of applying it to the whole rows afterwards, without a pass (and a
/// dispatch) of its own, and its arithmetic runs while the weights behind the tile stream in.
pub type Epilogue<'a> = &'a (dyn Fn(&mut [f32]) + Sync);

/// `outs[m] = lins[m] · x` for every matrix `m` reading the same quantized input `xq`
/// (`n` rows of `xq_stride` bytes). Each output is `[n, lins[m].out_dim]`, bias added.
///
/// All matrices must share the activation format and `in_dim`.
///
/// `epilogue`, if any, runs over every output tile ([`Epilogue`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul_many(
    pool: &ThreadPool,
    lins: &[&Linear],
    xq: &[u8],
    xq_stride: usize,
    n: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
    epilogue: Option<Epilogue<'_>>,
) {
    assert_eq!(lins.len(), outs.len());
    check_inputs(lins, n, scratch);
    for (l, o) in lins.iter().zip(outs.iter()) {
        assert!(
            o.len() >= n * l.out_dim,
            "{}: output buffer too small",
            l.name
        );
    }
    let total_tiles: usize = lins.iter().map(|l| tiles_of(l)).sum();
    // One DisjointSlice per output; at most a handful of matrices, so a fixed array
    // (no allocation on the hot path).
    assert!(lins.len() <= 4, "matmul_many takes at most 4 matrices");
    let mut slots: [Option<DisjointSlice<f32>>; 4] = [None, None, None, None];
    for (s, o) in slots.iter_mut().zip(outs.iter_mut()) {
        *s = Some(DisjointSlice::new(o));
    }
    let tile_len = scratch.tile_len;
    let segments = segments_of(&scratch.segments, &scratch.ones, n);
    let tiles = DisjointSlice::new(&mut scratch.tiles);
    let tile_bytes = TILE_ROWS * lins[0].row_bytes;
    let run = &|tid: usize, mine: Range<usize>, tokens: Range<usize>| {
        // SAFETY: thread `tid` owns tile `tid` while it runs a range.
        let tile = unsafe { tiles.part(2 * tid * tile_len..(2 * tid + 1) * tile_len) };
        let mut base = 0;
        for (m, lin) in lins.iter().enumerate() {
            let lt = base..base + tiles_of(lin);
            base = lt.end;
            let out = slots[m].as_ref().expect("one slot per matrix");
            for t in mine.start.max(lt.start)..mine.end.min(lt.end) {
                let i = (t - lt.start) * TILE_ROWS;
                let nw = (lin.out_dim - i).min(TILE_ROWS);
                gemm_tile(lin, i, nw, xq, xq_stride, tokens.clone(), segments, tile);
                if let Some(e) = epilogue {
                    e(&mut tile[..tokens.len() * nw]);
                }
                store_tile(out, lin.out_dim, i, nw, tokens.clone(), tile);
            }
        }
    };
    if n < GATED_MIN_ROWS {
        // A matrix-vector product streams its weights: one run per thread, shared out when
        // a thread falls behind.
        pool.run_split(
            total_tiles,
            (SPLIT_GRAIN_BYTES / tile_bytes.max(1)).max(1),
            &|tid, mine| run(tid, mine, 0..n),
        );
    } else {
        let split = Split::new(pool, total_tiles, n, lins);
        pool.run_items(split.n_items, &|tid, item| {
            let (mine, tokens) = split.item(item);
            run(tid, mine, tokens)
        });
    }
}

/// A batch product's work items: runs of whole tiles, about [`ITEMS_PER_THREAD`] per thread,
/// taken dynamically. A product with fewer tiles than that (a narrow matrix on many threads)
/// also splits the batch's tokens into parts of whole 16-row groups, each item one run of
/// tiles over one part: the threads then finish together instead of idling through the last
/// round. Only formats whose results do not depend on the batch ([`batch_dependent`]) split,
/// so every output keeps its bits.
struct Split {
    item_tiles: usize,
    total_tiles: usize,
    part_tokens: usize,
    parts: usize,
    n: usize,
    n_items: usize,
}

/// Fewest tokens in a part of a split batch (two 16-row tiles of an AMX product).
const MIN_PART_TOKENS: usize = 32;

impl Split {
    fn new(pool: &ThreadPool, total_tiles: usize, n: usize, lins: &[&Linear]) -> Split {
        let want = pool.n_threads() * ITEMS_PER_THREAD;
        let item_tiles = total_tiles.div_ceil(want).max(1);
        let tile_items = total_tiles.div_ceil(item_tiles);
        let parts = if lins.iter().any(|l| batch_dependent(l.ty())) {
            1
        } else {
            want.div_ceil(tile_items).min(n / MIN_PART_TOKENS).max(1)
        };
        let part_tokens = n.div_ceil(parts).next_multiple_of(16);
        let parts = n.div_ceil(part_tokens);
        Split {
            item_tiles,
            total_tiles,
            part_tokens,
            parts,
            n,
            n_items: tile_items * parts,
        }
    }

    /// Item `item`'s tiles and tokens (consecutive items share a run of tiles, so its weights
    /// stay in cache).
    fn item(&self, item: usize) -> (Range<usize>, Range<usize>) {
        let (t, p) = (item / self.parts, item % self.parts);
        (
            t * self.item_tiles..((t + 1) * self.item_tiles).min(self.total_tiles),
            p * self.part_tokens..((p + 1) * self.part_tokens).min(self.n),
        )
    }
}

/// Weight bytes a matrix-vector product takes from its share at a time.
const SPLIT_GRAIN_BYTES: usize = 64 << 10;

/// Batches from which a gated feed-forward runs its two products and the activation tile by
/// tile ([`matmul_gated`]), and from which a product is shared out as items rather than as one
/// streamed share per thread ([`ThreadPool::run_split`]). A decode step keeps the gated
/// products apart: there each thread streams one matrix's rows at a time, which reads faster
/// than alternating between the two every tile (Gemma-3 tg128 measured ~8% slower fused).
pub const GATED_MIN_ROWS: usize = 4;

/// `out = act(gate · x, up · x)` (a gated feed-forward's first half, `[n, gate.out_dim]`),
/// both products and the activation tile by tile: the two products of a tile of rows stay in
/// this thread's cache until the activation combines them, and only the result is written,
/// without a pass of its own. `act` works element by element (the same bits as applying it
/// to the whole rows afterwards).
#[allow(clippy::too_many_arguments)]
pub fn matmul_gated(
    pool: &ThreadPool,
    gate: &Linear,
    up: &Linear,
    xq: &[u8],
    xq_stride: usize,
    n: usize,
    out: &mut [f32],
    act: fn(&mut [f32], &[f32]),
    scratch: &mut MatmulScratch,
) {
    check_inputs(&[gate, up], n, scratch);
    assert_eq!(
        gate.out_dim, up.out_dim,
        "{}: gate and up differ",
        gate.name
    );
    let f = gate.out_dim;
    assert!(out.len() >= n * f, "{}: output buffer too small", gate.name);
    let total_tiles = tiles_of(gate);
    let tile_len = scratch.tile_len;
    let segments = segments_of(&scratch.segments, &scratch.ones, n);
    let tiles = DisjointSlice::new(&mut scratch.tiles);
    let out = DisjointSlice::new(out);
    let split = Split::new(pool, total_tiles, n, &[gate, up]);
    pool.run_items(split.n_items, &|tid, item| {
        // SAFETY: thread `tid` owns its pair of tiles while it runs an item.
        let pair = unsafe { tiles.part(2 * tid * tile_len..(2 * tid + 2) * tile_len) };
        let (tg, tu) = pair.split_at_mut(tile_len);
        let (mine, tokens) = split.item(item);
        let len = tokens.len();
        for t in mine {
            let i = t * TILE_ROWS;
            let nw = (f - i).min(TILE_ROWS);
            gemm_tile(gate, i, nw, xq, xq_stride, tokens.clone(), segments, tg);
            gemm_tile(up, i, nw, xq, xq_stride, tokens.clone(), segments, tu);
            act(&mut tg[..len * nw], &tu[..len * nw]);
            store_tile(&out, f, i, nw, tokens.clone(), tg);
        }
    });
}

/// The segments of a product over `n` rows: the declared sequences where they make up this
/// batch; over part of a batch of several sequences, every row alone. That part is the output
/// head's logit rows, each of its own sequence (a continuous-batching step's) or alone (a
/// verification pass's), so each gets a decode step's bits whatever else the step carries. A
/// single sequence's product over part of its batch (a prompt's logit rows) runs them
/// together (`&[]`).
fn segments_of<'a>(segments: &'a [usize], ones: &'a [usize], n: usize) -> &'a [usize] {
    let all = segments.iter().sum::<usize>();
    if !segments.is_empty() && n != all {
        &ones[..n]
    } else if all == n {
        segments
    } else {
        &[]
    }
}

/// Checks shared by the products: one activation format and input size, scratch for `n`
/// tokens, tiles that are whole groups of a repacked matrix.
fn check_inputs(lins: &[&Linear], n: usize, scratch: &MatmulScratch) {
    assert!(
        n * TILE_ROWS <= scratch.tile_len,
        "matmul scratch sized for fewer tokens"
    );
    for l in lins {
        assert_eq!(
            l.kernels.act, lins[0].kernels.act,
            "{}: mixed activation formats",
            l.name
        );
        assert_eq!(l.in_dim, lins[0].in_dim, "{}: mixed input sizes", l.name);
        assert!(
            TILE_ROWS.is_multiple_of(l.kernels.group),
            "{}: tile rows not whole groups",
            l.name
        );
    }
}

/// Tiles of `TILE_ROWS` rows in a matrix, counted from its row 0 (a repacked matrix needs
/// tiles aligned to its groups: `Kernels::group`).
fn tiles_of(l: &Linear) -> usize {
    l.out_dim.div_ceil(TILE_ROWS)
}

/// `tile[(j - tokens.start) * nw + r] = (lin row i + r) · (activation row j)` for the
/// activation rows `tokens` (all of the batch's, or, for a format that does not depend on the
/// batch, any part of them: see [`Split`]), bias added.
#[allow(clippy::too_many_arguments)]
fn gemm_tile(
    lin: &Linear,
    i: usize,
    nw: usize,
    xq: &[u8],
    xq_stride: usize,
    tokens: Range<usize>,
    segments: &[usize],
    tile: &mut [f32],
) {
    let (xq, n) = (&xq[tokens.start * xq_stride..], tokens.len());
    let w = &lin.data[i * lin.row_bytes..(i + nw) * lin.row_bytes];
    let mut gemm = |j0: usize, len: usize| {
        // Activation rows in runs that stay in L2 while the weight tile passes over them;
        // runs start at multiples of 8 and the last takes at least `chunk` rows, so
        // batch-dependent formats see the same groups.
        let chunk = chunk_rows(xq_stride);
        let mut j = j0;
        while j < j0 + len {
            let m = if j0 + len - j < 2 * chunk {
                j0 + len - j
            } else {
                chunk
            };
            let (x, t) = (&xq[j * xq_stride..], &mut tile[j * nw..]);
            let (w, x) = ((w, lin.row_bytes, nw), (x, xq_stride, m));
            (lin.kernels.gemm)(GemmArgs::new(lin.in_dim, w, x, (t, nw)));
            j += m;
        }
    };
    if segments.is_empty() || !batch_dependent(lin.ty()) {
        gemm(0, n);
    } else {
        let mut j0 = 0;
        for &len in segments {
            gemm(j0, len);
            j0 += len;
        }
    }
    if let Some(b) = &lin.bias {
        for row in tile[..n * nw].chunks_exact_mut(nw) {
            for (d, &bb) in row.iter_mut().zip(&b[i..i + nw]) {
                *d += bb;
            }
        }
    }
}

/// Rows `i..i+nw` of the tokens `tokens` of `out` (`[n, out_dim]`) from `tile` (token
/// `tokens.start` first).
fn store_tile(
    out: &DisjointSlice<f32>,
    out_dim: usize,
    i: usize,
    nw: usize,
    tokens: Range<usize>,
    tile: &[f32],
) {
    let t0 = tokens.start;
    for j in tokens {
        // SAFETY: rows `i..i+nw` of these tokens belong to the calling thread alone.
        let dst = unsafe { out.part(j * out_dim + i..j * out_dim + i + nw) };
        let src = &tile[(j - t0) * nw..(j - t0 + 1) * nw];
        match (
            <&mut [f32; TILE_ROWS]>::try_from(&mut *dst),
            <&[f32; TILE_ROWS]>::try_from(src),
        ) {
            // A whole tile row: a fixed-size copy the compiler inlines (a call to `memmove`
            // per token and tile cost 2-4% of a prefill).
            (Ok(d), Ok(s)) => *d = *s,
            _ => dst.copy_from_slice(src),
        }
    }
}

/// Bytes of quantized activation rows one gemm call takes: well inside L2 (1 MiB per core on
/// the machines measured), so the rows stay there while the tile of weight rows passes over
/// them instead of streaming from L3 once per weight row.
const CHUNK_BYTES: usize = 256 * 1024;

/// Activation rows per gemm call for rows of `row_bytes`: a multiple of 8, at least 64.
fn chunk_rows(row_bytes: usize) -> usize {
    (CHUNK_BYTES / row_bytes.max(1) / 8 * 8).max(64)
}

/// Formats whose gemm results depend on the batch's size and a row's place in it: those the
/// reference takes through its tiled kernel from some batch size on, and Q4_K.
fn batch_dependent(ty: GgmlType) -> bool {
    ty == GgmlType::Q4K || crate::quant::kquant_order::tiled(ty, usize::MAX)
}

/// `out = lin · x` for `n` f32 rows: quantizes into `xq` then multiplies.
pub fn matmul(
    pool: &ThreadPool,
    lin: &Linear,
    x: &[f32],
    n: usize,
    xq: &mut [u8],
    out: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let rb = quantize_input(pool, lin, x, n, xq);
    matmul_many(pool, &[lin], xq, rb, n, &mut [out], scratch, None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{random_weight_row, Rng, Scales};

    /// A `rows × n` matrix of random `ty` blocks in the layout the loader would give it.
    pub(super) fn random_linear(
        ty: GgmlType,
        n: usize,
        rows: usize,
        rng: &mut Rng,
    ) -> (Linear, Vec<u8>) {
        let plain: Vec<u8> = (0..rows)
            .flat_map(|_| random_weight_row(ty, n, rng, Scales::Normal))
            .collect();
        let lin = Linear {
            name: format!("{ty}"),
            in_dim: n,
            out_dim: rows,
            row_bytes: ty.row_bytes(n).unwrap(),
            data: TensorBytes::owned(plain.clone()),
            kernels: quant::kernels(ty).unwrap(),
            bias: None,
        };
        (lin.repacked(), plain)
    }

    /// Repacking in runs, on several threads, gives the bytes of repacking at once: runs of
    /// whole groups, the tail rows in the last run.
    #[test]
    fn repacking_in_runs_equals_repacking_at_once() {
        let mut rng = Rng(0x5e9);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ] {
            let n = 512;
            for rows in [16, 37, 100] {
                let (lin, plain) = random_linear(ty, n, rows, &mut rng);
                let Some((want, _)) = quant::repacked(&lin.kernels, &plain, rows, n) else {
                    continue; // no repacked layout on this CPU
                };
                for (run_bytes, helpers) in [(1, 0), (16 * lin.row_bytes, 2), (1 << 20, 1)] {
                    let plain_lin = Linear {
                        data: TensorBytes::owned(plain.clone()),
                        kernels: quant::kernels(ty).unwrap(),
                        ..lin.clone()
                    };
                    let choice = quant::repacking(&plain_lin.kernels, rows, n);
                    let got = plain_lin.repacked_in_runs(choice, run_bytes, helpers);
                    assert!(got.kernels.group > 1);
                    assert_eq!(
                        &got.data[..],
                        &want[..],
                        "{ty} {rows} rows, runs {run_bytes}"
                    );
                }
            }
        }
    }

    /// An epilogue (the output head's scale and soft cap) applied tile by tile, on whichever
    /// thread computed the tile, gives every output the bits of applying it to the whole
    /// product afterwards: decode rows (streamed shares) and batches (items), ragged last
    /// tiles included.
    #[test]
    fn epilogue_per_tile_equals_epilogue_after() {
        let mut rng = Rng(0xe91);
        let n = 512;
        for (ty, rows, threads) in [
            (GgmlType::Q6K, 200, 2),
            (GgmlType::Q4K, 37, 2),
            (GgmlType::Q8_0, 100, 3),
            (GgmlType::Q4_0, 1000, 2),
        ] {
            let pool = ThreadPool::new(threads);
            let (lin, _) = random_linear(ty, n, rows, &mut rng);
            let finish = |t: &mut [f32]| {
                crate::kernels::ops::scale_inplace(t, 0.75);
                crate::kernels::ops::softcap_inplace(t, 3.0);
            };
            for tokens in [1, 3, 5, 40] {
                let x: Vec<f32> = (0..tokens * n).map(|_| rng.uniform() * 3.0).collect();
                let rb = lin.act_row_bytes();
                let mut xq = vec![0u8; tokens * rb];
                let mut scratch = MatmulScratch::new(tokens, threads);
                quantize_input(&pool, &lin, &x, tokens, &mut xq);
                let mut want = vec![0f32; tokens * rows];
                matmul_many(
                    &pool,
                    &[&lin],
                    &xq,
                    rb,
                    tokens,
                    &mut [&mut want],
                    &mut scratch,
                    None,
                );
                let raw = want.clone();
                finish(&mut want);
                let mut got = vec![f32::NAN; tokens * rows];
                let e: Epilogue<'_> = &finish;
                let outs = &mut [&mut got[..]];
                matmul_many(&pool, &[&lin], &xq, rb, tokens, outs, &mut scratch, Some(e));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{ty} {rows} rows, {tokens} tokens");
                // The cap did something: the check is not of an identity.
                assert!(raw.iter().zip(&want).any(|(a, b)| a != b));
            }
        }
    }

    /// The pooled, tiled products (repacked layouts included, segments of independent
    /// sequences included, batches split into parts of tokens on many threads included) give
    /// each output the bits of one call of the matrix's kernels over the whole batch (or the
    /// whole segment), and the gated product equals the two products followed by the
    /// activation.
    #[test]
    fn pooled_products_match_whole_batch_gemms() {
        let mut rng = Rng(0x3a7);
        let (n, rows) = (512, 40);
        for (ty, threads) in [
            (GgmlType::Q4K, 2),
            (GgmlType::Q6K, 2),
            (GgmlType::Q5_0, 2),
            (GgmlType::Q8_0, 2),
            (GgmlType::Q4_1, 2),
            (GgmlType::Q4K, 6),
            (GgmlType::Q4_0, 6),
            (GgmlType::Q5_1, 6),
        ] {
            let pool = ThreadPool::new(threads);
            let (gate, _) = random_linear(ty, n, rows, &mut rng);
            let (up, _) = random_linear(ty, n, rows, &mut rng);
            for (tokens, segs) in [
                (1, vec![]),
                (5, vec![]),
                (37, vec![]),
                (13, vec![6, 7]),
                (200, vec![]),
                (100, vec![64, 36]),
            ] {
                if threads > 2 && tokens > 1 {
                    // 3 tiles on 6 threads: a product of 64 tokens or more splits them.
                    let split = Split::new(&pool, 3, tokens, &[&gate]);
                    let splits = !batch_dependent(ty) && tokens >= 64;
                    assert_eq!(split.parts > 1, splits, "{ty} {tokens} tokens");
                    assert!(split.part_tokens.is_multiple_of(16));
                    assert_eq!(split.item(split.n_items - 1).1.end, tokens);
                }
                let x: Vec<f32> = (0..tokens * n).map(|_| rng.uniform() * 3.0).collect();
                let rb = gate.act_row_bytes();
                let mut xq = vec![0u8; tokens * rb];
                let mut scratch = MatmulScratch::new(tokens, threads);
                scratch.set_segments(segs.iter().copied());
                quantize_input(&pool, &gate, &x, tokens, &mut xq);
                let (mut og, mut ou) = (vec![0f32; tokens * rows], vec![0f32; tokens * rows]);
                matmul_many(
                    &pool,
                    &[&gate, &up],
                    &xq,
                    rb,
                    tokens,
                    &mut [&mut og, &mut ou],
                    &mut scratch,
                    None,
                );
                // The matrix's own kernels, one call per group of rows (or the rows after the
                // last group) and segment, all of the segment's tokens at once.
                let whole = |lin: &Linear| {
                    let (k, g) = (lin.kernels, lin.kernels.group);
                    let mut out = vec![0f32; tokens * rows];
                    let lens = if segs.is_empty() {
                        vec![tokens]
                    } else {
                        segs.clone()
                    };
                    let mut j0 = 0;
                    let rw = lin.row_bytes;
                    for len in lens {
                        let x = &xq[j0 * rb..];
                        for i in (0..rows).step_by(g) {
                            let (w, nw) = (&lin.data[i * rw..], (rows - i).min(g));
                            let o = (&mut out[j0 * rows + i..], rows);
                            (k.gemm)(GemmArgs::new(n, (w, rw, nw), (x, rb, len), o));
                        }
                        j0 += len;
                    }
                    out
                };
                let (wg, wu) = (whole(&gate), whole(&up));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&og), bits(&wg), "{ty} gate, {tokens} tokens {segs:?}");
                assert_eq!(bits(&ou), bits(&wu), "{ty} up, {tokens} tokens {segs:?}");
                let act: fn(&mut [f32], &[f32]) = |g, u| {
                    for (a, b) in g.iter_mut().zip(u) {
                        *a = *a * 0.5 + b;
                    }
                };
                let mut fused = vec![0f32; tokens * rows];
                matmul_gated(
                    &pool,
                    &gate,
                    &up,
                    &xq,
                    rb,
                    tokens,
                    &mut fused,
                    act,
                    &mut scratch,
                );
                act(&mut og, &ou);
                assert_eq!(bits(&fused), bits(&og), "{ty} gated, {tokens} tokens");
            }
        }
    }
}
