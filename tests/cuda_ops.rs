//! The CUDA backend's product kernels against the CPU's, op by op, on random and edge-case
//! inputs: the 8-bit activation quantizers with the integer matvec of every quantized format
//! (against the CPU's quantizer and `vec_dot`), and the prompt-sized path (dequantization to
//! bf16, then the product: cuBLAS on a real GPU, `gemm_bf16` on the software GPU) against an
//! f64 product of the same bf16-rounded operands. Runs on a real GPU, else on the software GPU
//! (see tests/cuda_backend.rs), else says why it skips.

mod common;

use std::sync::Arc;

use kiln::backend::cuda::gpu::{blocks_for, Arena, Arg, Gpu, Layout};
use kiln::backend::cuda::weights::format_kernels;
use kiln::backend::cuda::{self, step::GEMM_MIN_ROWS};
use kiln::quant::GgmlType;

fn gpu() -> Option<Arc<Gpu>> {
    match cuda::open() {
        Ok(g) => Some(g),
        Err(no_gpu) => match common::emulator_lib()
            .and_then(|lib| cuda::use_emulator(&lib).map_err(|e| e.to_string()))
        {
            Ok(g) => Some(g),
            Err(why) => {
                println!("skipped: {no_gpu}, and no software GPU: {why}");
                None
            }
        },
    }
}

/// Deterministic values in [-1, 1).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Activation rows that test the quantizers' edges: random, all zero, one spike among small
/// values (the extreme's sign sets Q8_K's scale), large magnitudes, a negative extreme.
fn activations(cols: usize) -> Vec<f32> {
    let mut x = random(cols, 7);
    x.extend(std::iter::repeat_n(0.0, cols));
    let mut spike: Vec<f32> = random(cols, 8).iter().map(|v| v * 1e-3).collect();
    spike[cols / 3] = 5.0;
    x.extend(spike);
    x.extend(random(cols, 9).iter().map(|v| v * 300.0)); // (Q8_1 keeps d·Σq as f16)
    let mut neg = random(cols, 10);
    neg[cols - 1] = -2.5;
    x.extend(neg);
    x
}

/// The formats whose matvec takes 8-bit activations.
fn quantized() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&ty| format_kernels(ty).is_ok_and(|k| k.quantize.is_some()))
        .collect()
}

struct Bufs {
    arena: Arena,
    w: usize,
    x: usize,
    xq: usize,
    xbf: usize,
    wbf: usize,
    y: usize,
    /// cuBLAS's workspace.
    ws: usize,
}

fn bufs(g: &Gpu, w: &[u8], x: &[f32], rows: usize, cols: usize, n_tok: usize) -> Bufs {
    let mut l = Layout::default();
    let (wo, xo) = (l.take(w.len()), l.take(x.len() * 4));
    let xq = l.take(n_tok * cols / 32 * 40);
    let (xbf, wbf) = (l.take(n_tok * cols * 2), l.take(rows * cols * 2));
    let y = l.take(n_tok * rows * 4);
    let ws = l.take(kiln::backend::cuda::blas::WORKSPACE_BYTES);
    let mut arena = Arena::new(g, l.bytes).unwrap();
    let s = g.default_stream();
    arena.write(s, wo, w).unwrap();
    arena
        .write(s, xo, zerocopy::IntoBytes::as_bytes(x))
        .unwrap();
    Bufs {
        arena,
        w: wo,
        x: xo,
        xq,
        xbf,
        wbf,
        y,
        ws,
    }
}

fn read_y(g: &Gpu, b: &Bufs, n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n];
    let s = g.default_stream();
    g.synchronize(s).unwrap();
    b.arena
        .read(s, b.y, zerocopy::IntoBytes::as_mut_bytes(&mut y[..]))
        .unwrap();
    y
}

/// A matvec kernel's arguments for one matrix `w` (the kernel takes up to three: rows of the
/// others 0), its products into `y`, or added to it.
fn matvec_args(
    w: u64,
    xq: u64,
    y: u64,
    rows: usize,
    cols: usize,
    n_tok: usize,
    add: bool,
) -> [Arg; 13] {
    [
        Arg::P(w),
        Arg::P(w),
        Arg::P(w),
        Arg::P(xq),
        Arg::P(y),
        Arg::P(y),
        Arg::P(y),
        Arg::I(rows as i32),
        Arg::I(0),
        Arg::I(0),
        Arg::I(cols as i32),
        Arg::I(n_tok as i32),
        Arg::I(add as i32),
    ]
}

/// Weights of `ty`, `rows × cols`, quantized by the CPU from random values.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let f = random(rows * cols, ty as u64 + 1);
    let rb = ty.row_bytes(cols).unwrap();
    let mut w = vec![0u8; rows * rb];
    for (src, dst) in f.chunks_exact(cols).zip(w.chunks_exact_mut(rb)) {
        kiln::quant::quantize_row(ty, src, dst).unwrap();
    }
    w
}

#[test]
fn integer_matvec_matches_the_cpu_dot_for_every_quantized_format() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (12, 768);
    let x = activations(cols);
    let n_tok = x.len() / cols;
    let types = quantized();
    assert_eq!(types.len(), 10, "the ten quantized weight formats");
    for ty in types {
        let w = weights(ty, rows, cols);
        let k = format_kernels(ty).unwrap();
        let mut b = bufs(&g, &w, &x, rows, cols, n_tok);
        let s = g.default_stream();
        let q = k.quantize.unwrap();
        let n = n_tok * cols;
        let grid = n.div_ceil(256) as u32; // one thread per element, as the session launches
        let (wp, xp, xq, yp) = (
            b.arena.ptr(b.w),
            b.arena.ptr(b.x),
            b.arena.ptr(b.xq),
            b.arena.ptr(b.y),
        );
        g.launch(s, q, grid, 256, &[Arg::P(xp), Arg::P(xq), Arg::L(n as i64)])
            .unwrap();
        let args = matvec_args(wp, xq, yp, rows, cols, n_tok, false);
        // One warp per row (the software GPU's choice) and four (a GPU's).
        for threads in [32, 128] {
            let poison = vec![f32::NAN; n_tok * rows];
            let y = b.y;
            b.arena
                .write(s, y, zerocopy::IntoBytes::as_bytes(&poison[..]))
                .unwrap();
            g.launch(s, k.matvec, rows as u32, threads, &args).unwrap();
            let got = read_y(&g, &b, n_tok * rows);
            // With `add`, the products go onto y: y + product, rounded once.
            let base = random(n_tok * rows, 99);
            b.arena
                .write(s, y, zerocopy::IntoBytes::as_bytes(&base[..]))
                .unwrap();
            let add_args = matvec_args(wp, xq, yp, rows, cols, n_tok, true);
            g.launch(s, k.matvec, rows as u32, threads, &add_args)
                .unwrap();
            let added = read_y(&g, &b, n_tok * rows);
            for i in 0..n_tok * rows {
                assert_eq!(added[i], base[i] + got[i], "{ty}: added product {i}");
            }
            // The CPU: the same activation quantizer, the same integer dot.
            let cpu = kiln::quant::kernels_for(ty, kiln::quant::Isa::Scalar).unwrap();
            let rb = ty.row_bytes(cols).unwrap();
            let ab = cpu.act.row_bytes(cols).unwrap();
            let mut xq8 = vec![0u8; ab];
            let mut worst = 0.0f64;
            for t in 0..n_tok {
                (cpu.quantize_act)(&x[t * cols..(t + 1) * cols], &mut xq8);
                for r in 0..rows {
                    let want = (cpu.vec_dot)(cols, &w[r * rb..(r + 1) * rb], &xq8) as f64;
                    let mut deq = vec![0f32; cols];
                    (cpu.dequantize)(&w[r * rb..(r + 1) * rb], &mut deq);
                    let mag: f64 = deq
                        .iter()
                        .zip(&x[t * cols..])
                        .map(|(a, b)| (a * b).abs() as f64)
                        .sum();
                    let e = (got[t * rows + r] as f64 - want).abs() / (mag + 1e-30);
                    assert!(
                    e <= 2e-6 || (mag == 0.0 && got[t * rows + r] == 0.0),
                    "{ty}: token {t} row {r}: GPU {} vs CPU {want} (relative to Σ|w·x| {mag}: {e:.2e})",
                    got[t * rows + r]
                );
                    worst = worst.max(e);
                }
            }
            println!("{ty}: matvec ({threads} threads a row) vs CPU vec_dot, worst error / Σ|w·x| {worst:.2e}");
        }
        // The gated FFN's kernel (gate = up = w here): act(w·x) · (w·x), for either activation.
        let cpu = kiln::quant::kernels_for(ty, kiln::quant::Isa::Scalar).unwrap();
        let (rb, ab) = (
            ty.row_bytes(cols).unwrap(),
            cpu.act.row_bytes(cols).unwrap(),
        );
        for gelu in [0, 1] {
            let poison = vec![f32::NAN; n_tok * rows];
            let y = b.y;
            b.arena
                .write(s, y, zerocopy::IntoBytes::as_bytes(&poison[..]))
                .unwrap();
            let args = [
                Arg::P(wp),
                Arg::P(wp),
                Arg::P(xq),
                Arg::P(yp),
                Arg::I(rows as i32),
                Arg::I(cols as i32),
                Arg::I(n_tok as i32),
                Arg::I(gelu),
            ];
            g.launch(s, k.gated.unwrap(), rows as u32, 128, &args)
                .unwrap();
            let got = read_y(&g, &b, n_tok * rows);
            let mut xq8 = vec![0u8; ab];
            for t in 0..n_tok {
                (cpu.quantize_act)(&x[t * cols..(t + 1) * cols], &mut xq8);
                for r in 0..rows {
                    let d = (cpu.vec_dot)(cols, &w[r * rb..(r + 1) * rb], &xq8);
                    let mut a = [d];
                    let up = [d];
                    if gelu == 1 {
                        kiln::kernels::f16ops::geglu_scalar(&mut a, &up);
                    } else {
                        kiln::kernels::f16ops::swiglu_scalar(&mut a, &up);
                    }
                    let e = (got[t * rows + r] - a[0]).abs();
                    assert!(
                        e <= 1e-5 * (1.0 + a[0].abs()) + 1e-4 * d.abs(),
                        "{ty} gated (gelu {gelu}): token {t} row {r}: {} vs {}",
                        got[t * rows + r],
                        a[0]
                    );
                }
            }
        }
    }
}

#[test]
fn prompt_products_match_an_f64_product_of_the_bf16_operands() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (40, 512);
    let n_tok = GEMM_MIN_ROWS.clamp(3, 8);
    let mut x = random(n_tok * cols, 11);
    x[5] = 4.0e4; // past f16's range: bf16 keeps it
    let mut types = quantized();
    types.push(GgmlType::BF16);
    for ty in types {
        let w = weights(ty, rows, cols);
        let k = format_kernels(ty).unwrap();
        let b = bufs(&g, &w, &x, rows, cols, n_tok);
        let s = g.default_stream();
        let (wp, xp, xbf, wbf, yp) = (
            b.arena.ptr(b.w),
            b.arena.ptr(b.x),
            b.arena.ptr(b.xbf),
            b.arena.ptr(b.wbf),
            b.arena.ptr(b.y),
        );
        let n = n_tok * cols;
        g.launch(
            s,
            "f32_to_bf16",
            blocks_for(n),
            256,
            &[Arg::P(xp), Arg::P(xbf), Arg::L(n as i64)],
        )
        .unwrap();
        // Two chunks of rows, as the session dequantizes a large matrix in parts.
        let half = rows / 2;
        for (r0, nr) in [(0, half), (half, rows - half)] {
            let m = nr * cols;
            let args = [
                Arg::P(wp),
                Arg::P(wbf),
                Arg::I(cols as i32),
                Arg::L(r0 as i64),
                Arg::L(m as i64),
            ];
            g.launch(s, k.dequant.unwrap(), blocks_for(m), 256, &args)
                .unwrap();
            let yc = yp + (r0 * 4) as u64;
            let ws = b.arena.ptr(b.ws);
            if !g
                .gemm_bf16(s, ws, wbf, xbf, yc, nr, cols, n_tok, rows)
                .unwrap()
            {
                let args = [
                    Arg::P(wbf),
                    Arg::P(xbf),
                    Arg::P(yc),
                    Arg::I(nr as i32),
                    Arg::I(cols as i32),
                    Arg::I(n_tok as i32),
                    Arg::I(rows as i32),
                ];
                g.launch(s, "gemm_bf16", blocks_for(nr * n_tok), 256, &args)
                    .unwrap();
            }
            g.synchronize(s).unwrap();
        }
        let got = read_y(&g, &b, n_tok * rows);
        let bf = |v: f32| half::bf16::from_f32(v).to_f32() as f64;
        let rb = ty.row_bytes(cols).unwrap();
        let mut deq = vec![0f32; cols];
        let mut worst = 0.0f64;
        for r in 0..rows {
            kiln::quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut deq).unwrap();
            for t in 0..n_tok {
                let xr = &x[t * cols..(t + 1) * cols];
                let want: f64 = deq.iter().zip(xr).map(|(&a, &b)| bf(a) * bf(b)).sum();
                let mag: f64 = deq
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| (bf(a) * bf(b)).abs())
                    .sum();
                let e = (got[t * rows + r] as f64 - want).abs() / mag;
                assert!(
                    e <= 1e-5,
                    "{ty}: token {t} row {r}: {} vs {want} ({e:.2e})",
                    got[t * rows + r]
                );
                worst = worst.max(e);
            }
        }
        println!("{ty}: bf16 product vs f64, worst error / Σ|w·x| {worst:.2e}");
    }
}

/// `kv_store_q8_0` writes a row's keys and values into a Q8_0 cache as the CPU's cache
/// quantizes them (`BlockQ8_0::quantize`: d = amax / 127, rounding half away from zero), bit
/// for bit: random heads, a zero block, ties at half a step, a negative extreme, large and
/// tiny magnitudes; at its position and slot only.
#[test]
fn q8_0_kv_store_matches_the_cpu_cache() {
    use kiln::quant::blocks::BlockQ8_0;
    let Some(g) = gpu() else { return };
    let (heads, hd, ctx, slots) = (3usize, 64usize, 5usize, 2usize);
    let n = heads * hd;
    let mut k = random(n, 21);
    k[32..64].fill(0.0);
    // amax 127 gives d = 1: x.5 values sit exactly on ties.
    for (i, v) in k[64..96].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { i as f32 * 1.5 - 20.5 };
    }
    k[100] = -9.0;
    let mut v: Vec<f32> = random(n, 22).iter().map(|x| x * 1e4).collect();
    v[130..160].iter_mut().for_each(|x| *x *= 1e-8);
    let row = kiln::cache::KvType::Q8_0.row_bytes(hd);
    let per_slot = heads * ctx * row;
    let mut l = Layout::default();
    let (ko, vo) = (l.take(n * 4), l.take(n * 4));
    // Keys, then values.
    let kc = l.take(2 * slots * per_slot);
    let vc = kc + slots * per_slot;
    let (po, so) = (l.take(4), l.take(4));
    let mut a = Arena::new(&g, l.bytes).unwrap();
    let s = g.default_stream();
    let bytes = zerocopy::IntoBytes::as_bytes;
    a.write(s, ko, bytes(&k[..])).unwrap();
    a.write(s, vo, bytes(&v[..])).unwrap();
    a.write(s, kc, &vec![0xAB; 2 * slots * per_slot]).unwrap();
    let (pos, slot) = (3usize, 1usize);
    a.write(s, po, &(pos as i32).to_le_bytes()).unwrap();
    a.write(s, so, &(slot as i32).to_le_bytes()).unwrap();
    let args = [
        Arg::P(a.ptr(ko)),
        Arg::P(a.ptr(vo)),
        Arg::P(a.ptr(kc)),
        Arg::P(a.ptr(vc)),
        Arg::P(a.ptr(po)),
        Arg::P(a.ptr(so)),
        Arg::L(per_slot as i64),
        Arg::L(per_slot as i64),
        Arg::I(heads as i32),
        Arg::I(hd as i32),
        Arg::I(hd as i32),
        Arg::I(ctx as i32),
    ];
    g.launch(s, "kv_store_q8_0", 1, 256, &args).unwrap();
    let mut cache = vec![0u8; 2 * slots * per_slot];
    g.synchronize(s).unwrap();
    a.read(s, kc, &mut cache).unwrap();
    for (which, x, base) in [("keys", &k, 0), ("values", &v, slots * per_slot)] {
        for h in 0..heads {
            let mut want = vec![BlockQ8_0::default(); hd / 32];
            <BlockQ8_0 as kiln::quant::reference::Quantize>::quantize(
                &x[h * hd..(h + 1) * hd],
                &mut want,
            );
            let at = base + slot * per_slot + (h * ctx + pos) * row;
            assert_eq!(
                &cache[at..at + row],
                kiln::quant::blocks::as_bytes(&want[..]),
                "{which}, head {h}"
            );
        }
        // Every other position and slot is untouched.
        let untouched = cache[base..base + slots * per_slot]
            .iter()
            .enumerate()
            .filter(|&(i, _)| {
                let (sl, r) = (i / per_slot, i % per_slot);
                !(sl == slot && (r / row) % ctx == pos)
            })
            .all(|(_, &b)| b == 0xAB);
        assert!(untouched, "{which}: bytes outside the row changed");
    }
}

/// q4_0 rearranged at upload (`repack_q4_0`: each row's nibbles 16-byte aligned, then its
/// scales): its matvec (alone and adding), gated kernel and bf16 dequantization give the file
/// layout's kernels' results bit for bit.
#[test]
fn repacked_q4_0_kernels_match_the_file_layout() {
    use kiln::backend::cuda::weights::repack_q4_0;
    let Some(g) = gpu() else { return };
    let (rows, cols) = (12, 768);
    let x = activations(cols);
    let n_tok = x.len() / cols;
    let w = weights(GgmlType::Q4_0, rows, cols);
    let wr = repack_q4_0(&w, rows, cols);
    assert_eq!(wr.len(), w.len());
    let s = g.default_stream();
    let run = |w: &[u8], matvec: &str, gated: &str, dequant: &str| {
        let b = bufs(&g, w, &x, rows, cols, n_tok);
        let n = n_tok * cols;
        let (wp, xp, xq, yp) = (
            b.arena.ptr(b.w),
            b.arena.ptr(b.x),
            b.arena.ptr(b.xq),
            b.arena.ptr(b.y),
        );
        let q = [Arg::P(xp), Arg::P(xq), Arg::L(n as i64)];
        g.launch(s, "quantize_q8_0", n.div_ceil(256) as u32, 256, &q)
            .unwrap();
        let mut out = Vec::new();
        for add in [false, true] {
            let args = matvec_args(wp, xq, yp, rows, cols, n_tok, add);
            g.launch(s, matvec, rows as u32, 128, &args).unwrap();
            out.push(read_y(&g, &b, n_tok * rows));
        }
        let args = [
            Arg::P(wp),
            Arg::P(wp),
            Arg::P(xq),
            Arg::P(yp),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(n_tok as i32),
            Arg::I(0),
        ];
        g.launch(s, gated, rows as u32, 128, &args).unwrap();
        out.push(read_y(&g, &b, n_tok * rows));
        let wbf = b.arena.ptr(b.wbf);
        let m = rows * cols;
        let args = [
            Arg::P(wp),
            Arg::P(wbf),
            Arg::I(cols as i32),
            Arg::L(0),
            Arg::L(m as i64),
        ];
        g.launch(s, dequant, blocks_for(m), 256, &args).unwrap();
        let mut deq = vec![0u16; m];
        g.synchronize(s).unwrap();
        b.arena
            .read(s, b.wbf, zerocopy::IntoBytes::as_mut_bytes(&mut deq[..]))
            .unwrap();
        (out, deq)
    };
    let (file, file_deq) = run(&w, "matvec_q4_0", "gated_q4_0", "dequant_bf16_q4_0");
    let (re, re_deq) = run(&wr, "matvec_q4_0r", "gated_q4_0r", "dequant_bf16_q4_0r");
    for (i, what) in ["matvec", "matvec adding", "gated"].iter().enumerate() {
        let same = file[i]
            .iter()
            .zip(&re[i])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: {:?} vs {:?}", &file[i][..4], &re[i][..4]);
    }
    assert_eq!(file_deq, re_deq, "dequantized to bf16");
}
