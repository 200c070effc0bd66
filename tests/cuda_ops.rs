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
/// others 0), its products into `y`, or added to it, `tpr` threads per row.
#[allow(clippy::too_many_arguments)]
fn matvec_args(
    w: u64,
    xq: u64,
    y: u64,
    rows: usize,
    cols: usize,
    n_tok: usize,
    add: bool,
    tpr: u32,
) -> [Arg; 14] {
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
        Arg::I(tpr as i32),
    ]
}

/// Weights of `ty`, `rows × cols`, quantized by the CPU from random values.
/// A gated kernel's arguments with `w` as both the gate and the up matrix (`gelu` 1: GELU,
/// else SiLU), `tpr` threads per row.
#[allow(clippy::too_many_arguments)]
fn gated_args(
    w: u64,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    n_tok: usize,
    gelu: i32,
    tpr: u32,
) -> [Arg; 9] {
    [
        Arg::P(w),
        Arg::P(w),
        Arg::P(x),
        Arg::P(y),
        Arg::I(rows as i32),
        Arg::I(cols as i32),
        Arg::I(n_tok as i32),
        Arg::I(gelu),
        Arg::I(tpr as i32),
    ]
}

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
        // One warp per row (the software GPU's choice), four (a GPU's), and one warp per row
        // eight rows to a block (narrow rows; the last block is part empty).
        for (threads, tpr) in [(32u32, 32u32), (128, 128), (256, 32)] {
            let args = matvec_args(wp, xq, yp, rows, cols, n_tok, false, tpr);
            let grid = rows.div_ceil((threads / tpr) as usize) as u32;
            let poison = vec![f32::NAN; n_tok * rows];
            let y = b.y;
            b.arena
                .write(s, y, zerocopy::IntoBytes::as_bytes(&poison[..]))
                .unwrap();
            g.launch(s, k.matvec, grid, threads, &args).unwrap();
            let got = read_y(&g, &b, n_tok * rows);
            // With `add`, the products go onto y: y + product, rounded once.
            let base = random(n_tok * rows, 99);
            b.arena
                .write(s, y, zerocopy::IntoBytes::as_bytes(&base[..]))
                .unwrap();
            let add_args = matvec_args(wp, xq, yp, rows, cols, n_tok, true, tpr);
            g.launch(s, k.matvec, grid, threads, &add_args).unwrap();
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
            println!("{ty}: matvec ({tpr} threads a row, {threads} a block) vs CPU vec_dot, worst error / Σ|w·x| {worst:.2e}");
        }
        // The gated FFN's kernel (gate = up = w here): act(w·x) · (w·x), for either activation.
        let cpu = kiln::quant::kernels_for(ty, kiln::quant::Isa::Scalar).unwrap();
        let (rb, ab) = (
            ty.row_bytes(cols).unwrap(),
            cpu.act.row_bytes(cols).unwrap(),
        );
        for (gelu, (threads, tpr)) in [(0, (128u32, 128u32)), (1, (128, 128)), (0, (256, 32))] {
            let poison = vec![f32::NAN; n_tok * rows];
            let y = b.y;
            b.arena
                .write(s, y, zerocopy::IntoBytes::as_bytes(&poison[..]))
                .unwrap();
            let args = gated_args(wp, xq, yp, rows, cols, n_tok, gelu, tpr);
            let grid = rows.div_ceil((threads / tpr) as usize) as u32;
            g.launch(s, k.gated.unwrap(), grid, threads, &args).unwrap();
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
                        "{ty} gated (gelu {gelu}, {tpr} threads a row): token {t} row {r}: {} vs {}",
                        got[t * rows + r],
                        a[0]
                    );
                }
            }
        }
    }
}

/// The products over f32 input (`matvec_*_f`, `gated_*_f`: each block quantizes the input
/// itself, RMS-normalized first when given norm weights) give what the quantizer (or
/// `rms_norm_q8`) then the product give, bit for bit: every quantized format, rows of 1 to 8
/// blocks of 256 elements (the widest the kernels take) and, for the formats of groups of 32,
/// rows that end inside a block (576: SmolLM2's), several tokens (the zero, spiked and large
/// ones of `activations`), alone and adding, a part-empty last block.
#[test]
fn f32_input_products_match_quantize_then_product() {
    let Some(g) = gpu() else { return };
    let rows = 13;
    let eps = 1e-6f32;
    for cols in [256, 576, 768, 2048] {
        let x = activations(cols);
        let n_tok = x.len() / cols;
        // Norm weights, and room for `rms_norm_q8`'s normalized rows.
        let nw: Vec<f32> = random(cols, 3).iter().map(|v| 1.0 + 0.5 * v).collect();
        let mut l = Layout::default();
        let (nwo, ny) = (l.take(cols * 4), l.take(x.len() * 4));
        let mut na = Arena::new(&g, l.bytes).unwrap();
        na.write(
            g.default_stream(),
            nwo,
            zerocopy::IntoBytes::as_bytes(&nw[..]),
        )
        .unwrap();
        for ty in quantized() {
            if !cols.is_multiple_of(ty.block_size()) {
                continue;
            }
            let w = weights(ty, rows, cols);
            let k = format_kernels(ty).unwrap();
            let mut b = bufs(&g, &w, &x, rows, cols, n_tok);
            let s = g.default_stream();
            let (wp, xp, xq, yp) = (
                b.arena.ptr(b.w),
                b.arena.ptr(b.x),
                b.arena.ptr(b.xq),
                b.arena.ptr(b.y),
            );
            let n = n_tok * cols;
            let grid = rows.div_ceil(8) as u32;
            let base = random(n_tok * rows, 5);
            for norm in [false, true] {
                // The input as the separate kernels make it.
                let q = k.quantize.unwrap();
                if norm {
                    let kind = match q {
                        "quantize_q8_0" => 1,
                        "quantize_q8_1" => 2,
                        _ => 3,
                    };
                    let args = [
                        Arg::P(xp),
                        Arg::P(0),
                        Arg::P(na.ptr(ny)),
                        Arg::P(na.ptr(nwo)),
                        Arg::I(cols as i32),
                        Arg::F(eps),
                        Arg::P(xq),
                        Arg::I(kind),
                        Arg::I(512),
                    ];
                    let blocks = n_tok * cols.div_ceil(512);
                    g.launch(s, "rms_norm_q8", blocks as u32, 256, &args)
                        .unwrap();
                } else {
                    let args = [Arg::P(xp), Arg::P(xq), Arg::L(n as i64)];
                    g.launch(s, q, n.div_ceil(256) as u32, 256, &args).unwrap();
                }
                let (nwp, e) = if norm { (na.ptr(nwo), eps) } else { (0, 0.0) };
                let tail = [Arg::P(nwp), Arg::F(e)];
                let what =
                    |k: &str, add: bool| format!("{ty} cols {cols} norm {norm} {k} add {add}");
                for add in [false, true] {
                    let mut out = Vec::new();
                    for (name, input) in [(k.matvec, xq), (k.matvec_f32.unwrap(), xp)] {
                        let start = if add {
                            base.clone()
                        } else {
                            vec![f32::NAN; n_tok * rows]
                        };
                        b.arena
                            .write(s, b.y, zerocopy::IntoBytes::as_bytes(&start[..]))
                            .unwrap();
                        let args = matvec_args(wp, input, yp, rows, cols, n_tok, add, 32);
                        let args: Vec<Arg> = args.iter().chain(&tail).copied().collect();
                        g.launch(s, name, grid, 256, &args).unwrap();
                        out.push(read_y(&g, &b, n_tok * rows));
                    }
                    same_bits(&out[0], &out[1], &what("matvec", add));
                }
                let mut out = Vec::new();
                for (name, input) in [(k.gated.unwrap(), xq), (k.gated_f32.unwrap(), xp)] {
                    b.arena
                        .write(
                            s,
                            b.y,
                            zerocopy::IntoBytes::as_bytes(&vec![f32::NAN; n_tok * rows][..]),
                        )
                        .unwrap();
                    let args = gated_args(wp, input, yp, rows, cols, n_tok, 0, 32);
                    let args: Vec<Arg> = args.iter().chain(&tail).copied().collect();
                    g.launch(s, name, grid, 256, &args).unwrap();
                    out.push(read_y(&g, &b, n_tok * rows));
                }
                same_bits(&out[0], &out[1], &what("gated", false));
            }
        }
    }
}

/// `a` and `b` bit for bit (an unwritten output, NaN, fails too).
fn same_bits(a: &[f32], b: &[f32], what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            x.to_bits() == y.to_bits() && !x.is_nan(),
            "{what}: output {i}: {x} after the separate kernels, {y} over f32"
        );
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
            let args = matvec_args(wp, xq, yp, rows, cols, n_tok, add, 128);
            g.launch(s, matvec, rows as u32, 128, &args).unwrap();
            out.push(read_y(&g, &b, n_tok * rows));
        }
        // A block per row, and (narrow rows) a warp per row, eight to a block.
        for (block, tpr) in [(128, 128), (256, 32)] {
            let args = gated_args(wp, xq, yp, rows, cols, n_tok, 0, tpr as u32);
            let grid = rows.div_ceil((block / tpr) as usize) as u32;
            g.launch(s, gated, grid, block as u32, &args).unwrap();
            out.push(read_y(&g, &b, n_tok * rows));
        }
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
    for (i, what) in ["matvec", "matvec adding", "gated", "gated, narrow"]
        .iter()
        .enumerate()
    {
        let same = file[i]
            .iter()
            .zip(&re[i])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: {:?} vs {:?}", &file[i][..4], &re[i][..4]);
    }
    assert_eq!(file_deq, re_deq, "dequantized to bf16");
}

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
            .collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
        let sum: f64 = e.iter().sum();
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

    /// The largest |got − f64 attention| over a row at position p (`window` 0: none), infinite
    /// where got is not a number (never written).
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
    ) -> f64 {
        let first = if window > 0 && p + 1 > window {
            p + 1 - window
        } else {
            0
        };
        let want = self.attend(q, h, n_heads, slot, first, p, scale);
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

fn i32_bytes(v: impl IntoIterator<Item = i32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Prompt attention in tiles (`attend_tile_*`, rows of mode 3) against an f64 attention of the
/// same cache values, and the rows of other modes left alone: query groups of 1, 3 and 4 heads
/// per kv head, head sizes 48 (a partial chunk of dimensions), 64, 128 and 256, rows of two
/// sequences in one tile, a sliding window over a ring, an f16 and a Q8_0 cache.
#[test]
fn tiled_prompt_attention_matches_an_f64_attention() {
    let Some(g) = gpu() else { return };
    // (query heads, kv heads, head size, ring rows, window, Q8_0 cache)
    let cases = [
        (9usize, 3usize, 64usize, 256usize, 0usize, false),
        (4, 4, 48, 256, 0, false),
        (8, 2, 128, 128, 40, false),
        (4, 1, 256, 256, 0, false),
        (6, 2, 64, 256, 0, true),
    ];
    for (case, &(n_heads, n_kv, hd, rows, window, q8)) in cases.iter().enumerate() {
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
        let mut l = Layout::default();
        let (qo, oo) = (l.take(q.len() * 4), l.take(n_rows * n_heads * hd * 4));
        let (kc, vc) = (
            l.take(slots * cache.per_slot),
            l.take(slots * cache.per_slot),
        );
        let (po, so, mo) = (l.take(n_rows * 4), l.take(n_rows * 4), l.take(n_rows * 4));
        let mut a = Arena::new(&g, l.bytes).unwrap();
        let s = g.default_stream();
        a.write(s, qo, zerocopy::IntoBytes::as_bytes(&q[..]))
            .unwrap();
        a.write(s, oo, &vec![0xFF; n_rows * n_heads * hd * 4])
            .unwrap();
        a.write(s, kc, &cache.bytes[0]).unwrap();
        a.write(s, vc, &cache.bytes[1]).unwrap();
        a.write(s, po, &i32_bytes(rows_at.iter().map(|r| r.1 as i32)))
            .unwrap();
        a.write(s, so, &i32_bytes(rows_at.iter().map(|r| r.0 as i32)))
            .unwrap();
        a.write(s, mo, &i32_bytes(rows_at.iter().map(|r| r.2)))
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
            Arg::I(n_rows as i32),
            Arg::I(n_heads as i32),
            Arg::I(n_kv as i32),
            Arg::I(hd as i32),
            Arg::I(hd as i32),
            Arg::I(rows as i32),
            Arg::F(scale),
            Arg::I(window as i32),
            Arg::P(a.ptr(mo)),
        ];
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
                    worst = worst.max(cache.gap(got, qr, h, n_heads, slot, p, window, scale));
                }
            }
            println!(
                "case {case} ({n_heads}/{n_kv} heads, {hd} dims, ring {rows}, window {window}, q8 {q8}), {name}: worst |Δ| {worst:.2e}"
            );
            assert!(worst < 2e-6, "case {case}, {name}: worst |Δ| {worst}");
        }
    }
}

/// Decode attention split over the keys (`attend_split_*`, the f32 arithmetic: `mirror` 0)
/// then merged (`attend_merge`), against an f64 attention: groups of 1, 3, 4 and 8 query heads
/// per kv head (more than one block's group of 4), rows of two slots at positions in empty,
/// partial and full splits, a window over a ring, an f16 and a Q8_0 cache.
#[test]
fn split_decode_attention_matches_an_f64_attention() {
    let Some(g) = gpu() else { return };
    // (query heads, kv heads, head size, ring rows, window, Q8_0 cache)
    let cases = [
        (9usize, 3usize, 64usize, 1024usize, 0usize, false),
        (4, 4, 48, 1024, 0, false),
        (16, 2, 128, 320, 300, false),
        (8, 2, 64, 1024, 0, true),
    ];
    let (ctx, n_split) = (1024usize, 4usize);
    let chunk = ctx / n_split;
    for (case, &(n_heads, n_kv, hd, rows, window, q8)) in cases.iter().enumerate() {
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
        let mut l = Layout::default();
        let (qo, oo) = (l.take(q.len() * 4), l.take(n_rows * n_heads * hd * 4));
        let (kc, vc) = (
            l.take(slots * cache.per_slot),
            l.take(slots * cache.per_slot),
        );
        let (po, so) = (l.take(n_rows * 4), l.take(n_rows * 4));
        let part = l.take(n_rows * n_heads * n_split * (hd + 2) * 4);
        let mut a = Arena::new(&g, l.bytes).unwrap();
        let s = g.default_stream();
        a.write(s, qo, zerocopy::IntoBytes::as_bytes(&q[..]))
            .unwrap();
        a.write(s, kc, &cache.bytes[0]).unwrap();
        a.write(s, vc, &cache.bytes[1]).unwrap();
        a.write(s, po, &i32_bytes(rows_at.iter().map(|r| r.1 as i32)))
            .unwrap();
        a.write(s, so, &i32_bytes(rows_at.iter().map(|r| r.0 as i32)))
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
            Arg::P(a.ptr(part)),
            Arg::I(n_heads as i32),
            Arg::I(n_kv as i32),
            Arg::I(hd as i32),
            Arg::I(hd as i32),
            Arg::I(ctx as i32),
            Arg::I(rows as i32),
            Arg::F(scale),
            Arg::I(window as i32),
            Arg::I(n_split as i32),
            Arg::I(chunk as i32),
            Arg::I(0),
        ];
        let name = if q8 {
            "attend_split_q8_0"
        } else {
            "attend_split_f16"
        };
        let block = hd.next_multiple_of(32).clamp(128, 1024) as u32;
        g.launch(s, name, (n_rows * n_heads * n_split) as u32, block, &args)
            .unwrap();
        let merge = [
            Arg::P(a.ptr(po)),
            Arg::P(a.ptr(part)),
            Arg::P(a.ptr(oo)),
            Arg::I(n_heads as i32),
            Arg::I(hd as i32),
            Arg::I(ctx as i32),
            Arg::I(n_split as i32),
            Arg::I(0),
        ];
        g.launch(s, "attend_merge", (n_rows * n_heads) as u32, block, &merge)
            .unwrap();
        let mut out = vec![0f32; n_rows * n_heads * hd];
        g.synchronize(s).unwrap();
        a.read(s, oo, zerocopy::IntoBytes::as_mut_bytes(&mut out[..]))
            .unwrap();
        let mut worst = 0f64;
        for (r, &(slot, p)) in rows_at.iter().enumerate() {
            for h in 0..n_heads {
                let got = &out[(r * n_heads + h) * hd..][..hd];
                let qr = &q[(r * n_heads + h) * hd..][..hd];
                worst = worst.max(cache.gap(got, qr, h, n_heads, slot, p, window, scale));
            }
        }
        println!(
            "case {case} ({n_heads}/{n_kv} heads, {hd} dims, ring {rows}, window {window}, q8 {q8}): worst |Δ| {worst:.2e}"
        );
        assert!(worst < 2e-6, "case {case}: worst |Δ| {worst}");
    }
}

/// The norm that quantizes for the products after it (`rms_norm_q8`, rows over several blocks
/// of 512 elements) gives `rms_norm_f32` then `quantize_q8_*` bit for bit: widths of one,
/// two (a partial slice) and eight slices, each 8-bit format, rows picked by `sel`.
#[test]
fn norm_and_quantize_in_one_launch_match_the_two_ops() {
    let Some(g) = gpu() else { return };
    for (width, kind, quantize) in [
        (576usize, 2i32, "quantize_q8_1"),
        (640, 1, "quantize_q8_0"),
        (4096, 1, "quantize_q8_0"),
        (4096, 3, "quantize_q8_k"),
        (512, 3, "quantize_q8_k"),
    ] {
        let rows = 3usize;
        let mut x: Vec<f32> = random(rows * width, 80 + width as u64)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        x[width + 7] = 30.0; // (a spike in row 1)
        let w: Vec<f32> = random(width, 81).iter().map(|v| 1.0 + v * 0.5).collect();
        let sel = [2i32, 0, 1];
        let q8 = rows * width / 32 * 40; // (Q8x: d, s and 32 bytes)
        let mut l = Layout::default();
        let (xo, wo, so) = (l.take(x.len() * 4), l.take(width * 4), l.take(12));
        let (y1, y2, q1, q2) = (
            l.take(x.len() * 4),
            l.take(x.len() * 4),
            l.take(q8),
            l.take(q8),
        );
        let mut a = Arena::new(&g, l.bytes).unwrap();
        let s = g.default_stream();
        a.write(s, xo, zerocopy::IntoBytes::as_bytes(&x[..]))
            .unwrap();
        a.write(s, wo, zerocopy::IntoBytes::as_bytes(&w[..]))
            .unwrap();
        a.write(s, so, &i32_bytes(sel)).unwrap();
        let eps = 1e-5f32;
        let fused = [
            Arg::P(a.ptr(xo)),
            Arg::P(a.ptr(so)),
            Arg::P(a.ptr(y1)),
            Arg::P(a.ptr(wo)),
            Arg::I(width as i32),
            Arg::F(eps),
            Arg::P(a.ptr(q1)),
            Arg::I(kind),
            Arg::I(512),
        ];
        g.launch(
            s,
            "rms_norm_q8",
            (rows * width.div_ceil(512)) as u32,
            256,
            &fused,
        )
        .unwrap();
        let norm = [
            Arg::P(a.ptr(xo)),
            Arg::P(a.ptr(so)),
            Arg::P(a.ptr(y2)),
            Arg::P(a.ptr(wo)),
            Arg::I(width as i32),
            Arg::F(eps),
        ];
        g.launch(s, "rms_norm_f32", rows as u32, 256, &norm)
            .unwrap();
        let n = rows * width;
        let quant = [Arg::P(a.ptr(y2)), Arg::P(a.ptr(q2)), Arg::L(n as i64)];
        g.launch(s, quantize, n.div_ceil(256) as u32, 256, &quant)
            .unwrap();
        g.synchronize(s).unwrap();
        let read = |off: usize, len: usize| {
            let mut b = vec![0u8; len];
            a.read(s, off, &mut b).unwrap();
            b
        };
        assert_eq!(
            read(y1, n * 4),
            read(y2, n * 4),
            "width {width}: normalized rows"
        );
        assert_eq!(read(q1, q8), read(q2, q8), "width {width}: {quantize}");
    }
}
