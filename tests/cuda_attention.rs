//! The CUDA backend's attention kernels against an f64 attention of the same cache values, on
//! random inputs: prompt attention in tiles and decode attention split over the keys, with
//! f16 and Q8_0 caches, rings with windows, query heads grouped over kv heads. Runs on a real
//! GPU, else on the software GPU (see tests/cuda_backend.rs); skips, saying why, only off
//! x86-64, and fails where the software GPU should build but does not.

mod common;

use common::ops::{gpu, i32_bytes, random};
use kiln::backend::cuda::gpu::{Arena, Arg, Gpu, Layout};
use std::sync::Arc;

/// A KV cache of random values for the attention tests: `slots` slots of `n_kv` heads of
/// `rows` rows of `hd` values, f16 or Q8_0; its bytes (keys, values) and the values its rows
/// stand for (what the kernels read back).
struct TestCache {
    n_kv: usize,
    hd: usize,
    rows: usize,
    per_slot: usize,
    bytes: [Vec<u8>; 2],
    vals: [Vec<f64>; 2],
}

impl TestCache {
    fn new(slots: usize, n_kv: usize, hd: usize, rows: usize, q8: bool, seed: u64) -> TestCache {
        use half::f16;
        use kiln::quant::blocks::BlockQ8_0;
        let row_bytes = if q8 { hd / 32 * 34 } else { hd * 2 };
        let mut vals = [Vec::new(), Vec::new()];
        let mut bytes = [Vec::new(), Vec::new()];
        for (w, (vals, bytes)) in vals.iter_mut().zip(bytes.iter_mut()).enumerate() {
            let x = random(slots * n_kv * rows * hd, seed + w as u64);
            for r in x.chunks_exact(hd) {
                if q8 {
                    let mut b = vec![BlockQ8_0::default(); hd / 32];
                    <BlockQ8_0 as kiln::quant::reference::Quantize>::quantize(r, &mut b);
                    for blk in &b {
                        let d = blk.d.to_f32();
                        vals.extend(blk.qs.iter().map(|&q| f16::from_f32(q as f32 * d).to_f64()));
                    }
                    bytes.extend_from_slice(kiln::quant::blocks::as_bytes(&b[..]));
                } else {
                    for &v in r {
                        let h = f16::from_f32(v);
                        vals.push(h.to_f64());
                        bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                    }
                }
            }
        }
        let per_slot = n_kv * rows * row_bytes;
        TestCache {
            n_kv,
            hd,
            rows,
            per_slot,
            bytes,
            vals,
        }
    }

    /// Attention in f64 of query `q` (head `h` of `n_heads`) over positions first..=last of
    /// slot `slot` (position t at row t mod rows).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &[f32],
        h: usize,
        n_heads: usize,
        slot: usize,
        first: usize,
        last: usize,
        scale: f32,
        cap: f32,
        sink: Option<f32>,
    ) -> Vec<f64> {
        let (hd, kvh) = (self.hd, h / (n_heads / self.n_kv));
        let at = |w: usize, t: usize| {
            &self.vals[w][((slot * self.n_kv + kvh) * self.rows + t % self.rows) * hd..][..hd]
        };
        let sc: Vec<f64> = (first..=last)
            .map(|t| {
                q.iter()
                    .zip(at(0, t))
                    .map(|(&a, &b)| a as f64 * b)
                    .sum::<f64>()
                    * scale as f64
            })
            .map(|s| match cap {
                0.0 => s,
                c => c as f64 * (s / c as f64).tanh(),
            })
            .collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
        // A sink joins the denominator as a key without a value.
        let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |k| (k as f64 - mx).exp());
        (0..hd)
            .map(|d| {
                (first..=last)
                    .zip(&e)
                    .map(|(t, w)| w * at(1, t)[d])
                    .sum::<f64>()
                    / sum
            })
            .collect()
    }

    /// The largest |got − f64 attention| over a row at position p (`window` 0: none; scores
    /// soft-capped at `cap`, 0: none; the head's attention sink, if any), infinite where got
    /// is not a number (never written).
    #[allow(clippy::too_many_arguments)]
    fn gap(
        &self,
        got: &[f32],
        q: &[f32],
        h: usize,
        n_heads: usize,
        slot: usize,
        p: usize,
        window: usize,
        scale: f32,
        cap: f32,
        sink: Option<f32>,
    ) -> f64 {
        let first = if window > 0 && p + 1 > window {
            p + 1 - window
        } else {
            0
        };
        let want = self.attend(q, h, n_heads, slot, first, p, scale, cap, sink);
        got.iter()
            .zip(&want)
            .map(|(x, y)| gap(*x, *y))
            .fold(0.0, f64::max)
    }
}

/// |x − y|, infinite where x is not a number (an output the kernel never wrote).
fn gap(x: f32, y: f64) -> f64 {
    if x.is_finite() {
        (x as f64 - y).abs()
    } else {
        f64::INFINITY
    }
}

/// An attention test's inputs in one arena: the queries `q`, an output of `out` floats, the
/// cache's two halves, the rows' positions and slots (`slot_pos`), and `extra` more regions
/// of the given sizes after them (offsets in `at.extra`). `args` are the attention kernels'
/// first eight arguments (q, k and v caches, positions, slots, the two slot strides, out).
struct Inputs {
    a: Arena,
    oo: usize,
    extra: Vec<usize>,
    args: [Arg; 8],
}

fn upload(
    g: &Arc<Gpu>,
    q: &[f32],
    out: usize,
    cache: &TestCache,
    slots: usize,
    slot_pos: &[(usize, usize)],
    extra: &[usize],
) -> Inputs {
    let n = slot_pos.len();
    let mut l = Layout::default();
    let (qo, oo) = (l.take(q.len() * 4), l.take(out * 4));
    let (kc, vc) = (
        l.take(slots * cache.per_slot),
        l.take(slots * cache.per_slot),
    );
    let (po, so) = (l.take(n * 4), l.take(n * 4));
    let extra: Vec<usize> = extra.iter().map(|&b| l.take(b)).collect();
    let mut a = Arena::new(g, l.bytes).unwrap();
    let s = g.default_stream();
    a.write(s, qo, zerocopy::IntoBytes::as_bytes(q)).unwrap();
    a.write(s, kc, &cache.bytes[0]).unwrap();
    a.write(s, vc, &cache.bytes[1]).unwrap();
    a.write(s, po, &i32_bytes(slot_pos.iter().map(|r| r.1 as i32)))
        .unwrap();
    a.write(s, so, &i32_bytes(slot_pos.iter().map(|r| r.0 as i32)))
        .unwrap();
    let args = [
        Arg::P(a.ptr(qo)),
        Arg::P(a.ptr(kc)),
        Arg::P(a.ptr(vc)),
        Arg::P(a.ptr(po)),
        Arg::P(a.ptr(so)),
        Arg::L(cache.per_slot as i64),
        Arg::L(cache.per_slot as i64),
        Arg::P(a.ptr(oo)),
    ];
    Inputs { a, oo, extra, args }
}

/// Prompt attention in tiles (`attend_tile_*`, rows of mode 3) against an f64 attention of the
/// same cache values, and the rows of other modes left alone: query groups of 1, 3 and 4 heads
/// per kv head, head sizes 48 (a partial chunk of dimensions), 64, 128 and 256, rows of two
/// sequences in one tile, a sliding window over a ring, an f16 and a Q8_0 cache, soft-capped
/// scores (Gemma-2's: the kernel takes the scale divided by the cap), attention sinks
/// (gpt-oss's, one logit per query head).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn tiled_prompt_attention_matches_an_f64_attention() {
    let g = gpu();
    // (query heads, kv heads, head size, ring rows, window, Q8_0 cache, soft cap)
    let cases = [
        (9usize, 3usize, 64usize, 256usize, 0usize, false, 0.0f32),
        (4, 4, 48, 256, 0, false, 0.0),
        (8, 2, 128, 128, 40, false, 0.5),
        (4, 1, 256, 256, 0, false, 0.0),
        (6, 2, 64, 256, 0, true, 0.0),
    ];
    for (case, &(n_heads, n_kv, hd, rows, window, q8, cap)) in cases.iter().enumerate() {
        let slots = 2usize;
        // Sequence 0: 70 prompt rows at positions 0..70; then one row of mode 1 (left to the
        // row kernel, untouched here); sequence 1: 90 rows at positions 150..240 (past the
        // 128-row ring when it has one).
        let mut rows_at: Vec<(usize, usize, i32)> = (0..70).map(|p| (0, p, 3)).collect();
        rows_at.push((0, 70, 1));
        rows_at.extend((150..240).map(|p| (1, p, 3)));
        let n_rows = rows_at.len();
        let cache = TestCache::new(slots, n_kv, hd, rows, q8, 40 + case as u64 * 2);
        let q = random(n_rows * n_heads * hd, 50 + case as u64);
        let scale = 1.0 / (hd as f32).sqrt();
        let slot_pos: Vec<(usize, usize)> = rows_at.iter().map(|r| (r.0, r.1)).collect();
        let out_len = n_rows * n_heads * hd;
        let extra = [n_rows * 4, n_heads * 4];
        let up = upload(&g, &q, out_len, &cache, slots, &slot_pos, &extra);
        let (mut a, oo, mo) = (up.a, up.oo, up.extra[0]);
        let s = g.default_stream();
        a.write(s, mo, &i32_bytes(rows_at.iter().map(|r| r.2)))
            .unwrap();
        // (Case 1 with sinks: one logit per query head, some above the scores.)
        let sinks: Option<Vec<f32>> =
            (case == 1).then(|| random(n_heads, 90).iter().map(|v| v * 8.0).collect());
        if let Some(k) = &sinks {
            a.write(s, up.extra[1], zerocopy::IntoBytes::as_bytes(&k[..]))
                .unwrap();
        }
        let sink_ptr = Arg::P(if sinks.is_some() {
            a.ptr(up.extra[1])
        } else {
            0
        });
        let sink = |h: usize| sinks.as_ref().map(|k| k[h]);
        let args: Vec<Arg> = up
            .args
            .iter()
            .copied()
            .chain([
                Arg::I(n_rows as i32),
                Arg::I(n_heads as i32),
                Arg::I(n_kv as i32),
                Arg::I(hd as i32),
                Arg::I(hd as i32),
                Arg::I(rows as i32),
                Arg::F(if cap == 0.0 { scale } else { scale / cap }),
                Arg::I(window as i32),
                Arg::P(a.ptr(mo)),
                Arg::F(cap),
                sink_ptr,
            ])
            .collect();
        // Blocks of 64, 32 and 16 query vectors.
        for (per, tag) in [(64usize, ""), (32, "32"), (16, "16")] {
            a.write(s, oo, &vec![0xFF; n_rows * n_heads * hd * 4])
                .unwrap();
            let grid = (n_rows * (n_heads / n_kv)).div_ceil(per) * n_kv;
            let name = format!("attend_tile{tag}_{}", if q8 { "q8_0" } else { "f16" });
            g.launch(s, &name, grid as u32, 256, &args).unwrap();
            let mut out = vec![0f32; n_rows * n_heads * hd];
            g.synchronize(s).unwrap();
            a.read(s, oo, zerocopy::IntoBytes::as_mut_bytes(&mut out[..]))
                .unwrap();
            let mut worst = 0f64;
            for (r, &(slot, p, mode)) in rows_at.iter().enumerate() {
                for h in 0..n_heads {
                    let got = &out[(r * n_heads + h) * hd..][..hd];
                    if mode != 3 {
                        assert!(
                            got.iter().all(|v| v.to_bits() == u32::MAX),
                            "row {r} written"
                        );
                        continue;
                    }
                    let qr = &q[(r * n_heads + h) * hd..][..hd];
                    let gap = cache.gap(got, qr, h, n_heads, slot, p, window, scale, cap, sink(h));
                    worst = worst.max(gap);
                }
            }
            println!(
                "case {case} ({n_heads}/{n_kv} heads, {hd} dims, ring {rows}, window {window}, q8 {q8}, cap {cap}, sinks {}), {name}: worst |Δ| {worst:.2e}",
                sinks.is_some()
            );
            assert!(worst < 2e-6, "case {case}, {name}: worst |Δ| {worst}");
        }
    }
}

/// Decode attention split over the keys (`attend_split_*`, the f32 arithmetic: `mirror` 0)
/// then merged by the last split of each group (`merge_splits`), against an f64 attention: groups of 1, 3, 4 and 8 query heads
/// per kv head (more than one block's group of 4), rows of two slots at positions in empty,
/// partial and full splits, a window over a ring, an f16 and a Q8_0 cache, soft-capped scores,
/// attention sinks.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn split_decode_attention_matches_an_f64_attention() {
    let g = gpu();
    // (query heads, kv heads, head size, ring rows, window, Q8_0 cache, soft cap)
    let cases = [
        (9usize, 3usize, 64usize, 1024usize, 0usize, false, 0.0f32),
        (4, 4, 48, 1024, 0, false, 0.0),
        (16, 2, 128, 320, 300, false, 0.5),
        (8, 2, 64, 1024, 0, true, 0.0),
    ];
    let ctx = 1024usize;
    // (4 splits of 256 keys; 64 of 16: runs of values and streams in a split of few keys)
    for (case, &(n_heads, n_kv, hd, rows, window, q8, cap)) in cases.iter().enumerate() {
        for n_split in [4usize, 64] {
            let chunk = ctx / n_split;
            let slots = 2usize;
            // (slot, position) per decode row.
            let rows_at = [
                (0usize, 0usize),
                (1, 300),
                (0, 700),
                (1, 1023),
                (0, 255),
                (1, 256),
            ];
            let n_rows = rows_at.len();
            let cache = TestCache::new(slots, n_kv, hd, rows, q8, 60 + case as u64 * 2);
            let q = random(n_rows * n_heads * hd, 70 + case as u64);
            let scale = 1.0 / (hd as f32).sqrt();
            let parts = [
                n_rows * n_heads * n_split * (hd + 2) * 4,
                n_rows * n_heads * 4,
                n_heads * 4,
            ];
            let up = upload(
                &g,
                &q,
                n_rows * n_heads * hd,
                &cache,
                slots,
                &rows_at,
                &parts,
            );
            let (mut a, oo) = (up.a, up.oo);
            let (part, counts) = (up.extra[0], up.extra[1]);
            let s = g.default_stream();
            // (Case 1 with sinks: one logit per query head, some above the scores.)
            let sinks: Option<Vec<f32>> =
                (case == 1).then(|| random(n_heads, 91).iter().map(|v| v * 8.0).collect());
            if let Some(k) = &sinks {
                a.write(s, up.extra[2], zerocopy::IntoBytes::as_bytes(&k[..]))
                    .unwrap();
            }
            let sink_ptr = Arg::P(if sinks.is_some() {
                a.ptr(up.extra[2])
            } else {
                0
            });
            let sink = |h: usize| sinks.as_ref().map(|k| k[h]);
            let args: Vec<Arg> = up
                .args
                .iter()
                .copied()
                .chain([
                    Arg::P(a.ptr(part)),
                    Arg::P(a.ptr(counts)),
                    Arg::I(n_heads as i32),
                    Arg::I(n_kv as i32),
                    Arg::I(hd as i32),
                    Arg::I(hd as i32),
                    Arg::I(ctx as i32),
                    Arg::I(rows as i32),
                    Arg::F(if cap == 0.0 { scale } else { scale / cap }),
                    Arg::I(window as i32),
                    Arg::I(n_split as i32),
                    Arg::I(chunk as i32),
                    Arg::I(0),
                    Arg::F(cap),
                    sink_ptr,
                ])
                .collect();
            let name = if q8 {
                "attend_split_q8_0"
            } else {
                "attend_split_f16"
            };
            let block = hd.next_multiple_of(32).clamp(128, 1024) as u32;
            // Twice, the output cleared between: the last split of each group sets its
            // counter back to zero, so the second launch merges as the first did.
            let mut out = vec![f32::NAN; n_rows * n_heads * hd];
            for _ in 0..2 {
                a.write(s, oo, zerocopy::IntoBytes::as_bytes(&out[..]))
                    .unwrap();
                g.launch(s, name, (n_rows * n_heads * n_split) as u32, block, &args)
                    .unwrap();
            }
            g.synchronize(s).unwrap();
            a.read(s, oo, zerocopy::IntoBytes::as_mut_bytes(&mut out[..]))
                .unwrap();
            let mut worst = 0f64;
            for (r, &(slot, p)) in rows_at.iter().enumerate() {
                for h in 0..n_heads {
                    let got = &out[(r * n_heads + h) * hd..][..hd];
                    let qr = &q[(r * n_heads + h) * hd..][..hd];
                    let gap = cache.gap(got, qr, h, n_heads, slot, p, window, scale, cap, sink(h));
                    worst = worst.max(gap);
                }
            }
            println!(
                "case {case} ({n_heads}/{n_kv} heads, {hd} dims, ring {rows}, window {window}, q8 {q8}, cap {cap}, sinks {}, {n_split} splits): worst |Δ| {worst:.2e}",
                sinks.is_some()
            );
            assert!(worst < 2e-6, "case {case}: worst |Δ| {worst}");
        }
    }
}
