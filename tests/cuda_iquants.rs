//! The non-linear formats on the GPU (IQ4_NL, IQ4_XS, MXFP4 and the 2-, 3- and 1-bit
//! i-quants): their embedding rows and their bf16 rows for the prompt-sized products against
//! the CPU's dequantizer, bit for bit, and their decode products on blocks at the formats'
//! extremes against the CPU's `vec_dot`. (Their products on random blocks, with the other
//! quantized formats': tests/cuda_ops.rs.) Runs on a real GPU, else on the software GPU; skips,
//! saying why, only off x86-64.

mod common;

use common::ops::{gpu, quantized_matvec_args, random, random_blocks};
use kiln::backend::cuda::gpu::{blocks_for, Arena, Arg, Layout};
use kiln::backend::cuda::weights::format_kernels;
use kiln::quant::GgmlType;

const FORMATS: [GgmlType; 10] = [
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::MXFP4,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ3XXS,
    GgmlType::IQ3S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
];

/// Every non-linear format's embedding (`embed_*`, scale 1) and its bf16 rows for the prompt
/// products (`dequant_bf16_*`, a chunk from the second row on) are the CPU's `dequantize_row`,
/// and that rounded to bf16 (to nearest even), bit for bit: random blocks (every grid index,
/// sign and scale code; MXFP4's subnormal and overflowing scales) and, where the CPU quantizes
/// the format, blocks it quantized.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn embedding_and_bf16_rows_are_the_cpu_dequantizer_bit_for_bit() {
    let g = gpu();
    let s = g.default_stream();
    let (rows, cols) = (8usize, 512usize);
    for ty in FORMATS {
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = random_blocks(ty, rows * cols / ty.block_size(), ty as u64 + 7, true);
        // The last two rows quantized by the CPU from random values, where it can.
        let x = random(2 * cols, ty as u64);
        let mut q = vec![0u8; 2 * rb];
        if kiln::quant::quantize_row(ty, &x, &mut q).is_ok() {
            w[(rows - 2) * rb..].copy_from_slice(&q);
        }
        let mut want = vec![0f32; rows * cols];
        kiln::quant::dequantize_row(ty, &w, &mut want).unwrap();
        let k = format_kernels(ty).unwrap();
        let mut l = Layout::default();
        let (wo, ido) = (l.take(w.len()), l.take(rows * 4));
        let (eo, bo) = (l.take(rows * cols * 4), l.take(rows * cols * 2));
        let mut a = Arena::new(&g, l.bytes).unwrap();
        a.write(s, wo, &w).unwrap();
        let ids: Vec<i32> = (0..rows as i32).rev().collect();
        a.write(s, ido, zerocopy::IntoBytes::as_bytes(&ids[..]))
            .unwrap();
        let groups = (rows * cols / 32) as i64;
        let args = [
            Arg::P(a.ptr(wo)),
            Arg::P(a.ptr(ido)),
            Arg::P(a.ptr(eo)),
            Arg::I(cols as i32),
            Arg::F(1.0),
            Arg::P(0),
            Arg::P(0),
            Arg::L(groups),
        ];
        g.launch(s, k.embed, rows as u32, 256, &args).unwrap();
        let m = (rows - 1) * cols;
        let args = [
            Arg::P(a.ptr(wo)),
            Arg::P(a.ptr(bo)),
            Arg::I(cols as i32),
            Arg::L(1),
            Arg::L(m as i64),
            Arg::L(groups),
        ];
        g.launch(s, k.prompt.kernel().unwrap(), blocks_for(m), 256, &args)
            .unwrap();
        g.synchronize(s).unwrap();
        let mut emb = vec![f32::NAN; rows * cols];
        a.read(s, eo, zerocopy::IntoBytes::as_mut_bytes(&mut emb[..]))
            .unwrap();
        let mut bf = vec![0u16; m];
        a.read(s, bo, zerocopy::IntoBytes::as_mut_bytes(&mut bf[..]))
            .unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let (got, row) = (&emb[t * cols..][..cols], id as usize);
            for (c, (g, w)) in got.iter().zip(&want[row * cols..][..cols]).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{ty} embedding row {row} [{c}]");
            }
        }
        for (i, (&g, &w)) in bf.iter().zip(&want[cols..]).enumerate() {
            let w = half::bf16::from_f32(w).to_bits();
            assert_eq!(g, w, "{ty} bf16 row {} [{}]", 1 + i / cols, i % cols);
        }
        println!("{ty}: {rows} rows of {cols}: embedding and bf16 rows bit for bit");
    }
}

/// Blocks at the formats' extremes (every byte 0xFF: the largest scales, grid indices and sign
/// patterns, all shift signs negative; every byte 0: the smallest), with a large and a tiny
/// super-block scale, against activations at ±127 and mixed: each format's decode product
/// within float noise of the CPU's `vec_dot` (relative to Σ|w·x|, the bar of
/// tests/cuda_ops.rs), its integer sums exact.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "needs a GPU or the software GPU, which runs only on x86-64"
)]
fn products_on_extreme_blocks_match_the_cpu_dot() {
    let g = gpu();
    let s = g.default_stream();
    let cols = 512usize;
    // Activations: all +1, all −1, alternating ±1 (each quantizes to ±127), random.
    let mut x = vec![1.0f32; cols];
    x.extend(vec![-1.0f32; cols]);
    x.extend((0..cols).map(|i| if i % 3 == 0 { 2.0 } else { -2.0 }));
    x.extend(random(cols, 3));
    let n_tok = x.len() / cols;
    for ty in FORMATS {
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = Vec::new();
        for (fill, d) in [
            (0xFFu8, 1000.0f32),
            (0xFF, -0.01),
            (0x00, 0.5),
            (0xA5, 3.0e-5),
        ] {
            let mut row = vec![fill; rb];
            let bits = half::f16::from_f32(d).to_bits();
            for blk in row.chunks_mut(ty.type_size()) {
                match ty {
                    // (E8M0: 2^(e − 128) for the largest value; 0xFF's 2^127 would overflow.)
                    GgmlType::MXFP4 => blk[0] = if fill == 0xFF { 140 } else { 120 },
                    GgmlType::IQ1M => {
                        for k in 0..4 {
                            let b = &mut blk[49 + 2 * k];
                            *b = (*b & 0x0F) | (((bits >> (4 * k)) & 0xF) as u8) << 4;
                        }
                    }
                    _ => blk[..2].copy_from_slice(&bits.to_le_bytes()),
                }
            }
            w.extend(row);
        }
        let rows = w.len() / rb;
        let k = format_kernels(ty).unwrap();
        let mut l = Layout::default();
        let (wo, xo) = (l.take(w.len()), l.take(x.len() * 4));
        let (qo, yo) = (l.take(x.len() / 32 * 40), l.take(n_tok * rows * 4));
        let mut a = Arena::new(&g, l.bytes).unwrap();
        a.write(s, wo, &w).unwrap();
        a.write(s, xo, zerocopy::IntoBytes::as_bytes(&x[..]))
            .unwrap();
        let n = x.len();
        let args = [Arg::P(a.ptr(xo)), Arg::P(a.ptr(qo)), Arg::L(n as i64)];
        g.launch(s, k.quantize.unwrap(), n.div_ceil(256) as u32, 256, &args)
            .unwrap();
        let (wp, qp, yp) = (a.ptr(wo), a.ptr(qo), a.ptr(yo));
        let args = quantized_matvec_args(wp, qp, yp, (rows, cols), n_tok, false, 32);
        g.launch(s, k.matvec, rows.div_ceil(8) as u32, 256, &args)
            .unwrap();
        g.synchronize(s).unwrap();
        let mut got = vec![f32::NAN; n_tok * rows];
        a.read(s, yo, zerocopy::IntoBytes::as_mut_bytes(&mut got[..]))
            .unwrap();
        let cpu = kiln::quant::kernels_for(ty, kiln::quant::Isa::Scalar).unwrap();
        let mut xq = vec![0u8; cpu.act.row_bytes(cols).unwrap()];
        let mut deq = vec![0f32; cols];
        for t in 0..n_tok {
            let xt = &x[t * cols..][..cols];
            (cpu.quantize_act)(xt, &mut xq);
            for r in 0..rows {
                let wr = &w[r * rb..][..rb];
                let want = (cpu.vec_dot)(cols, wr, &xq) as f64;
                (cpu.dequantize)(wr, &mut deq);
                let mag: f64 = deq.iter().zip(xt).map(|(a, b)| (a * b).abs() as f64).sum();
                let v = got[t * rows + r];
                let e = (v as f64 - want).abs() / (mag + 1e-30);
                assert!(
                    e <= 2e-6 || (mag == 0.0 && v == 0.0),
                    "{ty}: token {t} row {r}: GPU {v} vs CPU {want} ({e:.2e} of Σ|w·x| {mag})"
                );
            }
        }
        println!("{ty}: extreme blocks, {rows} rows x {n_tok} tokens, within 2e-6 of Σ|w·x|");
    }
}
