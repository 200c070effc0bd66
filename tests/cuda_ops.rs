//! The CUDA backend's product kernels against the CPU's, op by op, on random and edge-case
//! inputs: the 8-bit activation quantizers with the integer matvec of every quantized format
//! (against the CPU's quantizer and `vec_dot`), the products over f32 input and the norm that
//! quantizes against the separate kernels (bit for bit), the Q8_0 cache store, and the
//! prompt-sized path (dequantization to bf16, then the product: cuBLAS on a real GPU,
//! `gemm_bf16` on the software GPU) against an f64 product of the same bf16-rounded operands.
//! The attention kernels are in tests/cuda_attention.rs. Runs on a real GPU, else on the
//! software GPU (see tests/cuda_backend.rs); skips, saying why, only off x86-64, and fails where
//! the software GPU should build but does not.

mod common;

use common::ops::{gpu, i32_bytes, quantized_matvec_args, random, random_blocks};
use kiln::backend::cuda::gpu::{blocks_for, Arena, Arg, Gpu, Layout};
use kiln::backend::cuda::step::GEMM_MIN_ROWS;
use kiln::backend::cuda::weights::{
    format_kernels, repack, repacked_kernels, FormatKernels, PromptProduct,
};
use kiln::quant::GgmlType;

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

/// The formats of [`quantized`] whose blocks divide rows of `cols`, with their kernels.
/// The quantized formats whose blocks divide rows of `cols`, each with its kernels and the
/// weights' bytes as they reach them: the file's layout, then (where the upload rearranges
/// the format) the rearranged one with its `*r` kernels.
fn quantized_for(cols: usize) -> Vec<(GgmlType, FormatKernels, WeightLayout)> {
    let mut all = Vec::new();
    for ty in quantized() {
        if !cols.is_multiple_of(ty.block_size()) {
            continue;
        }
        all.push((ty, format_kernels(ty).unwrap(), WeightLayout::File));
        if let Some(k) = repacked_kernels(ty) {
            all.push((ty, k, WeightLayout::Repacked));
        }
    }
    all
}

/// How a test's weights reach the kernels.
#[derive(Clone, Copy, Debug)]
enum WeightLayout {
    File,
    Repacked,
}

/// `weights(ty, rows, cols)` in `layout`.
fn weights_in(ty: GgmlType, rows: usize, cols: usize, layout: WeightLayout) -> Vec<u8> {
    let w = weights(ty, rows, cols);
    match layout {
        WeightLayout::File => w,
        WeightLayout::Repacked => repack(ty, &w, rows, cols).unwrap(),
    }
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

/// The non-linear formats (grids and value tables): their odd rows in [`weights`] are random
/// bytes, which reach every grid index, sign and scale code.
fn nonlinear(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ4NL | IQ4XS | MXFP4 | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S | IQ1M
    )
}

/// Weights of `ty`, `rows × cols`, quantized by the CPU from random values; for the non-linear
/// formats, odd rows (and every row of a format the CPU quantizes only with an importance
/// matrix) random blocks (`common::ops::random_blocks`).
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let f = random(rows * cols, ty as u64 + 1);
    let rb = ty.row_bytes(cols).unwrap();
    let mut w = vec![0u8; rows * rb];
    let per_row = cols / ty.block_size();
    for (r, (src, dst)) in f.chunks_exact(cols).zip(w.chunks_exact_mut(rb)).enumerate() {
        if nonlinear(ty) && (r % 2 == 1 || kiln::quant::quantize_row(ty, src, dst).is_err()) {
            dst.copy_from_slice(&random_blocks(
                ty,
                per_row,
                (ty as u64) << 8 | r as u64,
                false,
            ));
        } else {
            kiln::quant::quantize_row(ty, src, dst).unwrap();
        }
    }
    w
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn integer_matvec_matches_the_cpu_dot_for_every_quantized_format() {
    let g = gpu();
    let (rows, cols) = (12, 768);
    let x = activations(cols);
    let n_tok = x.len() / cols;
    let types = quantized();
    assert_eq!(types.len(), 20, "the twenty quantized weight formats");
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
        // eight rows to a block (narrow rows; the last block is part empty). Each shape's
        // products are kept for the gated kernel's check.
        let mut products = std::collections::HashMap::new();
        for (threads, tpr) in [(32u32, 32u32), (128, 128), (256, 32)] {
            let args = quantized_matvec_args(wp, xq, yp, (rows, cols), n_tok, false, tpr as i32);
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
            let add_args = quantized_matvec_args(wp, xq, yp, (rows, cols), n_tok, true, tpr as i32);
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
            products.insert((threads, tpr), got);
        }
        // The gated FFN's kernel (gate = up = w here): act(w·x) · (w·x), for either activation,
        // its products those of the matvec of the same shape (checked against the CPU above)
        // bit for bit, as its kernel shares rows out the same way: so only the activation's
        // float functions (CUDA's against the CPU's) may differ.
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
            let mv = &products[&(threads, tpr)];
            for t in 0..n_tok {
                for r in 0..rows {
                    let d = mv[t * rows + r];
                    let mut a = [d];
                    let up = [d];
                    if gelu == 1 {
                        kiln::kernels::f16ops::geglu_scalar(&mut a, &up);
                    } else {
                        kiln::kernels::f16ops::swiglu_scalar(&mut a, &up);
                    }
                    let e = (got[t * rows + r] - a[0]).abs();
                    assert!(
                        e <= 1e-5 * (1.0 + a[0].abs()),
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
/// `rms_norm_q8`) then the product give, bit for bit: every quantized format, rows of 1 to 16
/// blocks of 256 elements (the widest the kernels take; past 2048 in two rounds) and, for the
/// formats of groups of 32,
/// rows that end inside a block (576: SmolLM2's), several tokens (the zero, spiked and large
/// ones of `activations`), alone and adding, a part-empty last block.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn f32_input_products_match_quantize_then_product() {
    let g = gpu();
    let rows = 13;
    let eps = 1e-6f32;
    for cols in [256, 576, 768, 2048, 3072, 4096] {
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
        for (ty, k, layout) in quantized_for(cols) {
            let w = weights_in(ty, rows, cols, layout);
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
                let what = |k: &str, add: bool| {
                    format!("{ty} {layout:?} cols {cols} norm {norm} {k} add {add}")
                };
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
                        let args =
                            quantized_matvec_args(wp, input, yp, (rows, cols), n_tok, add, 32);
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

/// A product with a post-norm and the residual add in its epilogue (`matvec_*_f_post`: the
/// last block to finish normalizes the product's rows and adds them) gives the residual
/// stream that the product (`matvec_*_f`), then `rms_norm_add_f32`, give, bit for bit: every
/// quantized format, outputs of 640 rows (Gemma-3's: 80 blocks) and 13 (a part-empty last
/// block), five tokens; launched twice, so the blocks' counter must be back at zero.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn post_norm_epilogue_matches_the_product_then_the_norm_and_add() {
    let g = gpu();
    let cols = 768;
    let eps = 1e-6f32;
    let x = activations(cols);
    let n_tok = x.len() / cols;
    for rows in [640, 13] {
        let pw: Vec<f32> = random(rows, 11).iter().map(|v| 1.0 + 0.5 * v).collect();
        let res: Vec<f32> = random(n_tok * rows, 12).iter().map(|v| 4.0 * v).collect();
        let mut l = Layout::default();
        let (pwo, reso, count) = (l.take(rows * 4), l.take(res.len() * 4), l.take(4));
        let mut pa = Arena::new(&g, l.bytes).unwrap();
        let s = g.default_stream();
        pa.write(s, pwo, zerocopy::IntoBytes::as_bytes(&pw[..]))
            .unwrap();
        for (ty, k, layout) in quantized_for(cols) {
            let w = weights_in(ty, rows, cols, layout);
            let b = bufs(&g, &w, &x, rows, cols, n_tok);
            let (wp, xp, yp) = (b.arena.ptr(b.w), b.arena.ptr(b.x), b.arena.ptr(b.y));
            let grid = rows.div_ceil(8) as u32;
            let args = quantized_matvec_args(wp, xp, yp, (rows, cols), n_tok, false, 32);
            let norm = [Arg::P(0), Arg::F(0.0)];
            let read_res = |pa: &Arena| {
                let mut v = vec![f32::NAN; res.len()];
                g.synchronize(s).unwrap();
                pa.read(s, reso, zerocopy::IntoBytes::as_mut_bytes(&mut v[..]))
                    .unwrap();
                v
            };
            // The separate kernels.
            pa.write(s, reso, zerocopy::IntoBytes::as_bytes(&res[..]))
                .unwrap();
            let a: Vec<Arg> = args.iter().chain(&norm).copied().collect();
            g.launch(s, k.matvec_f32.unwrap(), grid, 256, &a).unwrap();
            let post = [
                Arg::P(pa.ptr(reso)),
                Arg::P(yp),
                Arg::P(pa.ptr(pwo)),
                Arg::I(rows as i32),
                Arg::F(eps),
            ];
            g.launch(s, "rms_norm_add_f32", n_tok as u32, 256, &post)
                .unwrap();
            let want = read_res(&pa);
            // In the epilogue, twice.
            let tail = [
                Arg::P(pa.ptr(reso)),
                Arg::P(pa.ptr(pwo)),
                Arg::F(eps),
                Arg::P(pa.ptr(count)),
            ];
            let a: Vec<Arg> = args.iter().chain(&norm).chain(&tail).copied().collect();
            for launch in 0..2 {
                pa.write(s, reso, zerocopy::IntoBytes::as_bytes(&res[..]))
                    .unwrap();
                g.launch(s, k.matvec_post.unwrap(), grid, 256, &a).unwrap();
                let got = read_res(&pa);
                let what = format!("{ty} {layout:?} rows {rows} launch {launch}");
                same_bits(&want, &got, &what);
                assert!(
                    want.iter().zip(&res).any(|(w, r)| w != r),
                    "{what}: nothing was added"
                );
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
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn prompt_products_match_an_f64_product_of_the_bf16_operands() {
    let g = gpu();
    let (rows, cols) = (40, 512);
    let n_tok = GEMM_MIN_ROWS.clamp(3, 8);
    let mut x = random(n_tok * cols, 11);
    x[5] = 4.0e4; // past f16's range: bf16 keeps it
    let mut types = quantized();
    types.push(GgmlType::BF16);
    for ty in types {
        prompt_product_matches_f64(&g, ty, &x, (rows, cols, n_tok), 1e-5);
    }
}

/// F32 and F16 weights, which bf16 would round, take f32 prompt products: F32 rows as they
/// are, F16 rows widened a chunk at a time (exactly), x in f32; against an f64 product of the
/// same operands.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn f32_prompt_products_match_an_f64_product() {
    let g = gpu();
    let (rows, cols) = (40, 512);
    let n_tok = GEMM_MIN_ROWS.clamp(3, 8);
    let mut x = random(n_tok * cols, 13);
    x[7] = 1.0e5; // past f16's range and bf16's precision
                  // A sum of `cols` f32 products, in any order: at most cols · u of Σ|w·x| off.
    let bound = cols as f64 * f32::EPSILON as f64 / 2.0;
    for ty in [GgmlType::F32, GgmlType::F16] {
        prompt_product_matches_f64(&g, ty, &x, (rows, cols, n_tok), bound);
    }
}

/// A prompt-sized product of `ty` weights as the session runs it (`step/products.rs` `gemm`):
/// x to bf16 (unless the format multiplies in f32), then the rows in two chunks, as the
/// session does a large matrix in parts, each made into the operand by the format's kernel
/// (F32 rows: none) and multiplied (cuBLAS, or the software GPU's kernel); every output
/// within `bound` of Σ|w·x| of an f64 product of the same operands.
fn prompt_product_matches_f64(
    g: &Gpu,
    ty: GgmlType,
    x: &[f32],
    (rows, cols, n_tok): (usize, usize, usize),
    bound: f64,
) {
    let w = weights(ty, rows, cols);
    let k = format_kernels(ty).unwrap();
    let f32 = matches!(k.prompt, PromptProduct::F32(_));
    let b = bufs(g, &w, x, rows, cols, n_tok);
    let s = g.default_stream();
    let p = |off: usize| b.arena.ptr(off);
    let (wp, yp, scratch) = (p(b.w), p(b.y), p(b.wbf));
    let xs = if f32 { p(b.x) } else { p(b.xbf) };
    if !f32 {
        let n = n_tok * cols;
        let args = [Arg::P(p(b.x)), Arg::P(xs), Arg::L(n as i64)];
        g.launch(s, "f32_to_bf16", blocks_for(n), 256, &args)
            .unwrap();
    }
    let half = rows / 2;
    for (r0, nr) in [(0, half), (half, rows - half)] {
        let m = nr * cols;
        let wc = match k.prompt.kernel() {
            Some(kernel) => {
                let args = [
                    Arg::P(wp),
                    Arg::P(scratch),
                    Arg::I(cols as i32),
                    Arg::L(r0 as i64),
                    Arg::L(m as i64),
                    Arg::L((rows * cols / 32) as i64),
                ];
                g.launch(s, kernel, blocks_for(m), 256, &args).unwrap();
                scratch
            }
            None => wp + (r0 * cols * 4) as u64,
        };
        let yc = yp + (r0 * 4) as u64;
        if !g
            .gemm(f32, s, p(b.ws), wc, xs, yc, nr, cols, n_tok, rows)
            .unwrap()
        {
            let args = [
                Arg::P(wc),
                Arg::P(xs),
                Arg::P(yc),
                Arg::I(nr as i32),
                Arg::I(cols as i32),
                Arg::I(n_tok as i32),
                Arg::I(rows as i32),
            ];
            let kernel = if f32 { "gemm_f32" } else { "gemm_bf16" };
            g.launch(s, kernel, blocks_for(nr * n_tok), 256, &args)
                .unwrap();
        }
        g.synchronize(s).unwrap();
    }
    let got = read_y(g, &b, n_tok * rows);
    // The operands as the product sees them.
    let op = |v: f32| match f32 {
        true => v as f64,
        false => half::bf16::from_f32(v).to_f32() as f64,
    };
    let rb = ty.row_bytes(cols).unwrap();
    let mut deq = vec![0f32; cols];
    let mut worst = 0.0f64;
    for r in 0..rows {
        kiln::quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut deq).unwrap();
        for t in 0..n_tok {
            let xr = &x[t * cols..(t + 1) * cols];
            let terms = deq.iter().zip(xr).map(|(&a, &b)| op(a) * op(b));
            let (want, mag) = terms.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
            let e = (got[t * rows + r] as f64 - want).abs() / mag;
            assert!(
                e <= bound,
                "{ty}: token {t} row {r}: {} vs {want} ({e:.2e})",
                got[t * rows + r]
            );
            worst = worst.max(e);
        }
    }
    let form = if f32 { "f32" } else { "bf16" };
    println!("{ty}: {form} product vs f64, worst error / Σ|w·x| {worst:.2e}");
}

/// `kv_store_q8_0` writes a row's keys and values into a Q8_0 cache as the CPU's cache
/// quantizes them (`BlockQ8_0::quantize`: d = amax / 127, rounding half away from zero), bit
/// for bit: random heads, a zero block, ties at half a step, a negative extreme, large and
/// tiny magnitudes; at its position and slot only.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn q8_0_kv_store_matches_the_cpu_cache() {
    use kiln::quant::blocks::BlockQ8_0;
    let g = gpu();
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

/// The formats rearranged at upload (`repack`: the matrix's blocks' fields as arrays; the
/// 32-element formats and Q6_K): matvec (alone and adding), gated kernel (a block and a warp
/// per row), bf16 dequantization from a row past the first and embedding rows give the file
/// layout's kernels' results bit for bit. Rows of 640 (20 groups: a row's groups do not start
/// 16-byte aligned in the file's layout), 512 and 768.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn repacked_kernels_match_the_file_layout() {
    let g = gpu();
    let s = g.default_stream();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q6K,
    ] {
        let shapes: &[(usize, usize)] = match ty.block_size() {
            32 => &[(12, 640), (9, 768)],
            _ => &[(12, 512), (9, 768)],
        };
        for &(rows, cols) in shapes {
            let x = activations(cols);
            let n_tok = x.len() / cols;
            let w = weights(ty, rows, cols);
            let wr = repack(ty, &w, rows, cols).unwrap();
            assert_eq!(wr.len(), w.len());
            let file = format_kernels(ty).unwrap();
            let quantize = file.quantize.unwrap();
            let run = |w: &[u8], re: bool| {
                let name = |k: &str| if re { format!("{k}r") } else { k.to_string() };
                let mut b = bufs(&g, w, &x, rows, cols, n_tok);
                let n = n_tok * cols;
                let (wp, xp, xq, yp, wbf) = (b.w, b.x, b.xq, b.y, b.wbf);
                let [wp, xp, xq, yp, wbf] = [wp, xp, xq, yp, wbf].map(|o| b.arena.ptr(o));
                let q = [Arg::P(xp), Arg::P(xq), Arg::L(n as i64)];
                g.launch(s, quantize, n.div_ceil(256) as u32, 256, &q)
                    .unwrap();
                let mut out = Vec::new();
                for add in [false, true] {
                    let args = quantized_matvec_args(wp, xq, yp, (rows, cols), n_tok, add, 128);
                    g.launch(s, &name(file.matvec), rows as u32, 128, &args)
                        .unwrap();
                    out.push(read_y(&g, &b, n_tok * rows));
                }
                for (block, tpr) in [(128, 128), (256, 32)] {
                    let args = gated_args(wp, xq, yp, rows, cols, n_tok, 0, tpr);
                    let grid = rows.div_ceil((block / tpr) as usize) as u32;
                    g.launch(s, &name(file.gated.unwrap()), grid, block, &args)
                        .unwrap();
                    out.push(read_y(&g, &b, n_tok * rows));
                }
                // Rows 2.. dequantized (a chunk that starts past the matrix's first row).
                let m = (rows - 2) * cols;
                let args = [
                    Arg::P(wp),
                    Arg::P(wbf),
                    Arg::I(cols as i32),
                    Arg::L(2),
                    Arg::L(m as i64),
                    Arg::L((rows * cols / 32) as i64),
                ];
                let dequant = name(file.prompt.kernel().unwrap());
                g.launch(s, &dequant, blocks_for(m), 256, &args).unwrap();
                let mut deq = vec![0u16; m];
                g.synchronize(s).unwrap();
                b.arena
                    .read(s, b.wbf, zerocopy::IntoBytes::as_mut_bytes(&mut deq[..]))
                    .unwrap();
                // Embedding rows 0, the last and one between, into the bf16 scratch (room for
                // 2 · rows ≥ 3 rows of f32), the ids in x's place.
                let ids = [0i32, rows as i32 - 1, 5];
                b.arena
                    .write(s, b.x, zerocopy::IntoBytes::as_bytes(&ids[..]))
                    .unwrap();
                let args = [
                    Arg::P(wp),
                    Arg::P(xp),
                    Arg::P(wbf),
                    Arg::I(cols as i32),
                    Arg::F(0.5),
                    Arg::P(0),
                    Arg::P(0),
                    Arg::L((rows * cols / 32) as i64),
                ];
                g.launch(s, &name(file.embed), 3, 256, &args).unwrap();
                let mut emb = vec![f32::NAN; 3 * cols];
                g.synchronize(s).unwrap();
                b.arena
                    .read(s, b.wbf, zerocopy::IntoBytes::as_mut_bytes(&mut emb[..]))
                    .unwrap();
                emb.extend(deq.iter().map(|&v| f32::from_bits((v as u32) << 16)));
                out.push(emb);
                out
            };
            let (want, got) = (run(&w, false), run(&wr, true));
            let what = [
                "matvec",
                "matvec adding",
                "gated",
                "gated, narrow",
                "embedding, then bf16",
            ];
            for ((a, b), what) in want.iter().zip(&got).zip(what) {
                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{ty} {rows}x{cols} {what}: {:?} vs {:?}",
                    &a[..4],
                    &b[..4]
                );
            }
        }
    }
}

/// The norm that quantizes for the products after it (`rms_norm_q8`, rows over several blocks
/// of 512 elements) gives `rms_norm_f32` then `quantize_q8_*` bit for bit: widths of one,
/// two (a partial slice) and eight slices, each 8-bit format, rows picked by `sel`.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn norm_and_quantize_in_one_launch_match_the_two_ops() {
    let g = gpu();
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
        let q8 = rows * width / 32 * 40; // (32 bytes of quants a group, then d and s)
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
