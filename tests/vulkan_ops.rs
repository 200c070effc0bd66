//! The Vulkan backend's kernels against the CPU's, op by op, on random and edge-case inputs,
//! on the machine's Vulkan device (Mesa's lavapipe where there is no GPU).
//!
//! Bit for bit where the arithmetic is the same: the 8-bit activation quantizer (Q8_0's
//! rounding) against the CPU's, the f16 KV store against `half`'s rounding, `add`, `scale`, a
//! product's bias added to its rows, a product added onto its output against the product then
//! the add, and `argmax` against the sampler's. Within a stated tolerance where the order of
//! the float operations differs (the kernels sum in f32 trees; the CPU sums in f64 or in SIMD
//! lanes, and its `cos`, `exp` and `tanh` are not the device's):
//! - products (decode and prompt, every format, f32 or integer dot): |GPU − CPU| ≤ 2e-6 ·
//!   Σ|w·x| (the CUDA op tests' bound, tests/cuda_ops.rs), against the reference's order for
//!   the integer products (`quant::kquant_order`: the same operations, but Vulkan lets a driver
//!   split `fma` into a multiply and an add) and an f64 product of the CPU's dequantized weights
//!   for the others;
//! - RMSNorm: bit for bit where the device has f64 (lavapipe has: the squares summed in f64,
//!   as the CPU sums them), else 2e-6 relative to each value (the kernel's sum then f32);
//! - RoPE: 2e-6 · (|a| + |b|) of each rotated pair at positions up to 32767 (the angles are the
//!   CPU's f32 products, bit for bit; only `cos`/`sin` differ);
//! - decode attention: 2e-6 relative to max|v| against an f64 softmax over the same f16 K and
//!   V;
//! - SiLU·up and GELU·up: 2e-6 relative to the exact forms, plus, for GELU, 1.2e-7·|x·up|
//!   (two ulps of the 1 + tanh that cancels for large negative x: the device's `tanh`); SiLU·up
//!   also within 2e-6 of the CPU's (the same exp, computed as the CPU does, but lavapipe's
//!   results are up to 2 ulps off: `fma` as a multiply and an add, not yet located).
//!
//! Where no Vulkan driver is present the tests install Mesa's (Debian's `mesa-vulkan-drivers`
//! and `libvulkan1`) with apt-get when they run as root, and otherwise fail saying what to
//! install; they are ignored only off Linux, where there is no package to install.

mod common;

use std::sync::Arc;

use common::ops::random;

use kiln::backend::vulkan::arena::Region;
use kiln::backend::vulkan::ops::{self, AttnArgs, Product, RopeArgs};
use kiln::backend::vulkan::shaders::WeightFormat;
use kiln::backend::vulkan::{self, device, Arena, Layout, Memory, Program, Recorder, Vk};
use kiln::kernels::ops::{Activation, Rope, RopeKind};
use kiln::quant::{kquant_order, GgmlType};

/// The Vulkan device, after installing lavapipe where there is none and that is possible.
fn vk() -> Arc<Vk> {
    match vulkan::open() {
        Ok(vk) => vk,
        Err(first) => {
            let missing = format!(
                "{first}: the Vulkan op tests need a Vulkan driver: install Debian's \
                 mesa-vulkan-drivers and libvulkan1 (apt-get install mesa-vulkan-drivers libvulkan1)"
            );
            common::cli::apt_install(&["mesa-vulkan-drivers", "libvulkan1"], &missing);
            vulkan::open().unwrap_or_else(|e| panic!("{missing} (installed, but: {e})"))
        }
    }
}

/// Activation rows that test the quantizer's edges: random, all zero, one spike among small
/// values, large magnitudes, a negative extreme.
fn activations(cols: usize) -> Vec<f32> {
    let mut x = random(cols, 7);
    x.extend(std::iter::repeat_n(0.0, cols));
    let mut spike: Vec<f32> = random(cols, 8).iter().map(|v| v * 1e-3).collect();
    spike[cols / 3] = 5.0;
    x.extend(spike);
    x.extend(random(cols, 9).iter().map(|v| v * 300.0));
    let mut neg = random(cols, 10);
    neg[cols - 1] = -2.5;
    x.extend(neg);
    x
}

/// Regions of one device arena, laid out from byte sizes, and a host arena for a step's data.
struct Bufs {
    vk: Arc<Vk>,
    dev: Arena,
    offs: Vec<(u64, usize)>,
}

impl Bufs {
    fn new(vk: &Arc<Vk>, sizes: &[usize], mem: Memory) -> Bufs {
        let mut l = Layout::default();
        let offs: Vec<_> = sizes.iter().map(|&n| (l.take(n), n)).collect();
        let dev = Arena::new(vk, l.bytes, mem).unwrap();
        Bufs {
            vk: vk.clone(),
            dev,
            offs,
        }
    }

    fn r(&self, i: usize) -> Region {
        let (off, n) = self.offs[i];
        self.dev.at(off, n).unwrap()
    }

    fn put(&mut self, i: usize, bytes: &[u8]) {
        self.dev.write(self.offs[i].0, bytes).unwrap();
    }

    fn put_f32(&mut self, i: usize, v: &[f32]) {
        self.dev.write_f32(self.offs[i].0, v).unwrap();
    }

    fn get_f32(&self, i: usize) -> Vec<f32> {
        let mut v = vec![0f32; self.offs[i].1 / 4];
        self.dev.read_f32(self.offs[i].0, &mut v).unwrap();
        v
    }

    fn get(&self, i: usize) -> Vec<u8> {
        let mut v = vec![0u8; self.offs[i].1];
        self.dev.read(self.offs[i].0, &mut v).unwrap();
        v
    }

    /// Record `f`'s dispatches and run them once.
    fn run(&self, f: impl FnOnce(&mut Recorder, &Bufs)) {
        self.program(f).run().unwrap();
    }

    fn program(&self, f: impl FnOnce(&mut Recorder, &Bufs)) -> Program {
        let mut rec = Recorder::new(&self.vk);
        f(&mut rec, self);
        rec.finish().unwrap()
    }
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Weights of `ty`, `rows × cols`, quantized by the CPU from random values, and their values as
/// the CPU dequantizes them.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let f = random(rows * cols, ty as u64 + 1);
    let rb = ty.row_bytes(cols).unwrap();
    let mut w = vec![0u8; rows * rb];
    let mut deq = vec![0f32; rows * cols];
    for ((src, dst), d) in f
        .chunks_exact(cols)
        .zip(w.chunks_exact_mut(rb))
        .zip(deq.chunks_exact_mut(cols))
    {
        kiln::quant::quantize_row(ty, src, dst).unwrap();
        kiln::quant::dequantize_row(ty, dst, d).unwrap();
    }
    (w, deq)
}

fn ggml(f: WeightFormat) -> GgmlType {
    match f {
        WeightFormat::F32 => GgmlType::F32,
        WeightFormat::F16 => GgmlType::F16,
        WeightFormat::Q8_0 => GgmlType::Q8_0,
        WeightFormat::Q4_0 => GgmlType::Q4_0,
        WeightFormat::Q4K => GgmlType::Q4K,
        WeightFormat::Q6K => GgmlType::Q6K,
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn a_device_is_listed_and_opens() {
    let vk = vk();
    let all = device::list().unwrap();
    assert!(
        all.iter().any(|d| d == &vk.info),
        "{:?} among {all:?}",
        vk.info
    );
    println!("Vulkan device: {}", device::describe(&vk.info));
}

/// The decode and prompt products over f32 inputs, every format, against an f64 product of the
/// CPU's dequantized weights; the decode product against the prompt product; and the products
/// added onto their outputs, bit for bit the product then the add.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn float_products_match_the_cpus_dequantized_weights() {
    let vk = vk();
    let (rows, cols) = (20, 512);
    let mut x = activations(cols);
    x.extend(random(cols * 12, 11)); // 17 tokens: a full tile and a part-empty one
    let n_tok = x.len() / cols;
    for fmt in WeightFormat::ALL {
        let ty = ggml(fmt);
        let (w, deq) = weights(ty, rows, cols);
        let mut b = Bufs::new(
            &vk,
            &[w.len(), x.len() * 4, n_tok * rows * 4],
            Memory::Device,
        );
        b.put(0, &w);
        b.put_f32(1, &x);
        let mut results = Vec::new();
        for (name, tokens) in [("matvec", n_tok), ("mm", n_tok), ("matvec", 1)] {
            let p = Product {
                rows,
                cols,
                n_tok: tokens,
                add: false,
            };
            b.put_f32(2, &vec![f32::NAN; n_tok * rows]);
            b.run(|rec, b| {
                let f = if name == "mm" { ops::mm } else { ops::matvec };
                f(rec, fmt, b.r(0), b.r(1), b.r(2), p).unwrap()
            });
            let got = b.get_f32(2);
            let mut worst = 0f64;
            for t in 0..tokens {
                for r in 0..rows {
                    let (mut want, mut mag) = (0f64, 0f64);
                    for c in 0..cols {
                        let v = deq[r * cols + c] as f64 * x[t * cols + c] as f64;
                        want += v;
                        mag += v.abs();
                    }
                    let g = got[t * rows + r];
                    let e = (g as f64 - want).abs() / (mag + 1e-30);
                    assert!(
                        e <= 2e-6 || (mag == 0.0 && g == 0.0),
                        "{fmt:?} {name}: token {t} row {r}: {g} vs {want} (Σ|w·x| {mag}: {e:.2e})"
                    );
                    worst = worst.max(e);
                }
            }
            // Rows past the token count are untouched.
            assert!(
                got[tokens * rows..].iter().all(|v| v.is_nan()),
                "{fmt:?} {name}"
            );
            println!("{fmt:?} {name} ×{tokens}: worst error / Σ|w·x| {worst:.2e}");
            // Added onto a base: the product, then one add.
            let base = random(n_tok * rows, 99);
            b.put_f32(2, &base);
            b.run(|rec, b| {
                let f = if name == "mm" { ops::mm } else { ops::matvec };
                let p = Product { add: true, ..p };
                f(rec, fmt, b.r(0), b.r(1), b.r(2), p).unwrap()
            });
            let added = b.get_f32(2);
            for i in 0..tokens * rows {
                assert_eq!(
                    added[i].to_bits(),
                    (base[i] + got[i]).to_bits(),
                    "{fmt:?} {name}: {i}"
                );
            }
            results.push(got);
        }
        // The single-token decode product is the many-token one's first row, bit for bit.
        assert_eq!(results[2][..rows], results[0][..rows], "{fmt:?}");
    }
}

/// The 8-bit activations, bit for bit the CPU's Q8_0 quantizer, and the integer products of
/// Q8_0 and Q4_0 weights against the reference's order over them (the CPU's definitions,
/// `quant::kquant_order`).
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn integer_products_match_the_cpus_vec_dot() {
    let vk = vk();
    let (rows, cols) = (21, 768);
    let x = activations(cols);
    let n_tok = x.len() / cols;
    for fmt in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        let ty = ggml(fmt);
        let (w, deq) = weights(ty, rows, cols);
        let sizes = [
            w.len(),
            x.len() * 4,
            ops::q8_bytes(x.len()),
            n_tok * rows * 4,
        ];
        let mut b = Bufs::new(&vk, &sizes, Memory::Device);
        b.put(0, &w);
        b.put_f32(1, &x);
        let p = Product {
            rows,
            cols,
            n_tok,
            add: false,
        };
        b.run(|rec, b| ops::matvec_int(rec, fmt, b.r(0), b.r(1), b.r(2), b.r(3), p).unwrap());
        let got = b.get_f32(3);
        let xq = b.get(2);
        let cpu = kiln::quant::kernels_for(ty, kiln::quant::Isa::Scalar).unwrap();
        assert_eq!(cpu.act, GgmlType::Q8_0);
        let rb = ty.row_bytes(cols).unwrap();
        let mut xq8 = vec![0u8; GgmlType::Q8_0.row_bytes(cols).unwrap()];
        let (mut worst, mut exact) = (0f64, 0usize);
        for t in 0..n_tok {
            (cpu.quantize_act)(&x[t * cols..(t + 1) * cols], &mut xq8);
            // The device's blocks (d as f32, 32 bytes) against the CPU's (d as f16, 32 bytes).
            for blk in 0..cols / 32 {
                let dev = &xq[(t * cols / 32 + blk) * 36..][..36];
                let cpu_blk = &xq8[blk * 34..][..34];
                let d_dev = f32::from_le_bytes(dev[..4].try_into().unwrap());
                let d_cpu = half::f16::from_le_bytes([cpu_blk[0], cpu_blk[1]]).to_f32();
                assert_eq!(
                    d_dev.to_bits(),
                    d_cpu.to_bits(),
                    "{fmt:?}: token {t} block {blk} scale"
                );
                assert_eq!(
                    &dev[4..],
                    &cpu_blk[2..],
                    "{fmt:?}: token {t} block {blk} values"
                );
            }
            // The reference's order on x86 (Q8_0's 8 lanes, Q4_0's whole blocks: it
            // rearranges Q4_0 matrices at load), within the float products' bound: Vulkan lets
            // a driver compute `fma` as a multiply then an add (lavapipe differs from the
            // fused CPU by an ulp or two on some rows).
            for r in 0..rows {
                let wr = &w[r * rb..(r + 1) * rb];
                let want = match fmt {
                    WeightFormat::Q4_0 => kquant_order::t32_dot_blocks(ty, wr, &xq8, cols),
                    _ => kquant_order::t32_dot_lanes(ty, wr, &xq8, cols),
                } as f64;
                let mag: f64 = (0..cols)
                    .map(|c| (deq[r * cols + c] * x[t * cols + c]).abs() as f64)
                    .sum();
                let g = got[t * rows + r];
                let e = (g as f64 - want).abs() / (mag + 1e-30);
                assert!(
                    e <= 2e-6 || (mag == 0.0 && g == 0.0),
                    "{fmt:?}: token {t} row {r}: GPU {g} vs CPU {want} (Σ|w·x| {mag}: {e:.2e})"
                );
                worst = worst.max(e);
                exact += usize::from(g.to_bits() == (want as f32).to_bits());
            }
        }
        println!(
            "{fmt:?} integer matvec (integer dot instructions: {}): {exact}/{} outputs bit for \
             bit the CPU's, worst error / Σ|w·x| {worst:.2e}",
            vk.info.int_dot,
            n_tok * rows
        );
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn rms_norm_matches_the_cpu() {
    let vk = vk();
    let eps = 1e-5f32;
    // Whole rows (576: wider than a workgroup, not a multiple of it), and heads of 64.
    for (n, groups) in [(576usize, 5usize), (64, 24), (4096, 2)] {
        let mut x = random(n * groups, 3);
        x[..n].iter_mut().for_each(|v| *v *= 1e-3);
        let w = random(n, 4);
        let mut b = Bufs::new(&vk, &[x.len() * 4, n * 4, x.len() * 4], Memory::Device);
        b.put_f32(0, &x);
        b.put_f32(1, &w);
        // Out of place, then in place.
        b.run(|rec, b| ops::rms_norm(rec, b.r(0), b.r(1), b.r(2), n, groups, eps).unwrap());
        let out = b.get_f32(2);
        b.run(|rec, b| ops::rms_norm(rec, b.r(0), b.r(1), b.r(0), n, groups, eps).unwrap());
        let inplace = b.get_f32(0);
        assert_eq!(out, inplace, "in place ({n} × {groups})");
        for g in 0..groups {
            let mut want = vec![0f32; n];
            kiln::kernels::ops::rms_norm(&x[g * n..(g + 1) * n], &w, eps, &mut want);
            if vk.info.float64 {
                // The squares summed in f64, as the CPU sums them: the CPU's values.
                let got: Vec<u32> = out[g * n..(g + 1) * n]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{n} × {groups}: group {g}, bit for bit");
            }
            for i in 0..n {
                let o = out[g * n + i];
                assert!(
                    (o - want[i]).abs() <= 2e-6 * want[i].abs() + f32::MIN_POSITIVE,
                    "{n} × {groups}: group {g} value {i}: {o} vs {}",
                    want[i]
                );
            }
        }
    }
}

/// RoPE (normal and NeoX, a partial rotation, a frequency scale) against the CPU's at positions
/// from 0 to 32767, the positions read from the step's buffer.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn rope_matches_the_cpu() {
    let vk = vk();
    let positions = [0u32, 1, 2, 7, 100, 511, 4095, 32767];
    let rows = positions.len();
    for (kind, head_dim, n_dims, freq_scale) in [
        (RopeKind::Normal, 64, 64, 1.0f32),
        (RopeKind::Neox, 128, 128, 1.0),
        (RopeKind::Neox, 64, 32, 0.25),
    ] {
        let heads = 3;
        let stride = heads * head_dim + 16; // a row wider than its heads (q of a fused row)
        let x = random(rows * stride, 5);
        let mut b = Bufs::new(&vk, &[x.len() * 4, rows * 4], Memory::Device);
        b.put_f32(0, &x);
        b.put(1, &u32_bytes(&positions));
        let a = RopeArgs {
            kind,
            rows,
            heads,
            head_dim,
            n_dims,
            stride,
            freq_base: 10000.0,
            freq_scale,
            mscale: 1.0,
        };
        b.run(|rec, b| ops::rope(rec, b.r(0), b.r(1), a).unwrap());
        let got = b.get_f32(0);
        let rope = Rope::new(kind, n_dims, 10000.0, freq_scale, None);
        let mut cs = vec![0f32; n_dims];
        for (j, &pos) in positions.iter().enumerate() {
            let mut want = x[j * stride..j * stride + heads * head_dim].to_vec();
            rope.cos_sin(pos as usize, &mut cs);
            rope.apply(&mut want, head_dim, &cs);
            let row = &got[j * stride..(j + 1) * stride];
            for h in 0..heads {
                for i in 0..head_dim {
                    let k = h * head_dim + i;
                    // The pair's magnitude bounds the error of its rotation.
                    let partner = match kind {
                        RopeKind::Normal => k ^ 1,
                        RopeKind::Neox if i < n_dims / 2 => k + n_dims / 2,
                        RopeKind::Neox if i < n_dims => k - n_dims / 2,
                        RopeKind::Neox => k,
                    };
                    let mag = x[j * stride + k].abs() + x[j * stride + partner].abs();
                    assert!(
                        (row[k] - want[k]).abs() <= 2e-6 * mag,
                        "{kind:?} {n_dims}/{head_dim}: pos {pos} head {h} value {i}: {} vs {}",
                        row[k],
                        want[k]
                    );
                }
            }
            // Values past the heads are untouched.
            assert_eq!(
                &row[heads * head_dim..],
                &x[j * stride + heads * head_dim..(j + 1) * stride]
            );
        }
    }
}

/// The KV store: f32 rows into the f16 cache at their positions, bit for bit `half`'s
/// round-to-nearest-even (ties, subnormals, overflow, infinities, signed zeros).
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn kv_store_rounds_to_f16_bit_for_bit() {
    let vk = vk();
    let width = 64;
    let mut src = random(3 * width, 6);
    let edges = [
        0.0f32,
        -0.0,
        1.0 + 1.0 / 2048.0, // a tie, to even (down)
        1.0 + 3.0 / 2048.0, // a tie, to even (up)
        65504.0,
        65519.0, // rounds to 65504
        65520.0, // rounds to infinity
        1e6,
        -1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        6.1e-5,       // the smallest normals' neighbourhood
        3.0e-6,       // subnormal
        5.96e-8,      // the smallest subnormal
        2.98e-8,      // half of it: to zero
        2.9802326e-8, // 2^-25 exactly: a tie, to zero
        -4.5e-7,
        1e-10,
    ];
    src[width..width + edges.len()].copy_from_slice(&edges);
    let positions = [5u32, 0, 9];
    let cache_rows = 10;
    let mut b = Bufs::new(
        &vk,
        &[src.len() * 4, cache_rows * width * 2, 12],
        Memory::Device,
    );
    b.put_f32(0, &src);
    b.put(1, &vec![0xab; cache_rows * width * 2]);
    b.put(2, &u32_bytes(&positions));
    b.run(|rec, b| ops::store_kv(rec, b.r(0), b.r(1), b.r(2), 3, width, cache_rows).unwrap());
    let cache = b.get(1);
    for (j, &pos) in positions.iter().enumerate() {
        for i in 0..width {
            let o = (pos as usize * width + i) * 2;
            let got = u16::from_le_bytes([cache[o], cache[o + 1]]);
            let want = half::f16::from_f32(src[j * width + i]).to_bits();
            assert_eq!(got, want, "row {j} value {i} ({})", src[j * width + i]);
        }
    }
    // Rows not stored keep their bytes.
    assert!(cache[width * 2..5 * width * 2].iter().all(|&v| v == 0xab));
}

/// The f64 attention of one query head over f16 K and V rows.
fn attention_f64(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<f64> {
    let s: Vec<f64> = k
        .iter()
        .map(|kr| {
            q.iter()
                .zip(kr)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                * scale as f64
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    (0..q.len())
        .map(|d| e.iter().zip(v).map(|(w, vr)| w * vr[d] as f64).sum::<f64>() / sum)
        .collect()
}

/// Decode attention (grouped heads, lengths from one position to several chunks of 64, the
/// scores spread wide) against an f64 softmax over the same f16 cache; and a program recorded
/// once (store K and V, RoPE, attention), run step after step with only the step's positions
/// and lengths changed, matching the same attention at every step.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn decode_attention_matches_an_f64_softmax() {
    let vk = vk();
    for (heads, kv_heads, hd) in [(4usize, 2usize, 64usize), (2, 2, 256), (6, 1, 32)] {
        let cache_rows = 300;
        let lens = [1u32, 63, 64, 65, 300];
        let rows = lens.len();
        let width = kv_heads * hd;
        let k: Vec<f32> = random(cache_rows * width, 12)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let v = random(cache_rows * width, 13);
        let q = random(rows * heads * hd, 14);
        let to_f16 = |x: &[f32]| -> Vec<u8> {
            x.iter()
                .flat_map(|&a| half::f16::from_f32(a).to_le_bytes())
                .collect()
        };
        let sizes = [
            q.len() * 4,
            cache_rows * width * 2,
            cache_rows * width * 2,
            rows * 8,
            q.len() * 4,
        ];
        let mut b = Bufs::new(&vk, &sizes, Memory::Device);
        b.put_f32(0, &q);
        b.put(1, &to_f16(&k));
        b.put(2, &to_f16(&v));
        // The lengths, then each row's first cache row (every row reads from row 0).
        b.put(3, &u32_bytes(&[&lens[..], &[0; 5]].concat()));
        let scale = 1.0 / (hd as f32).sqrt();
        let a = AttnArgs {
            rows,
            heads,
            kv_heads,
            head_dim: hd,
            cache_rows,
            scale,
        };
        b.run(|rec, b| ops::attn_decode(rec, b.r(0), (b.r(1), b.r(2)), b.r(3), b.r(4), a).unwrap());
        let got = b.get_f32(4);
        let f16_rows = |x: &[f32], n: usize, h: usize| -> Vec<Vec<f32>> {
            (0..n)
                .map(|p| {
                    x[p * width + h * hd..p * width + (h + 1) * hd]
                        .iter()
                        .map(|&a| half::f16::from_f32(a).to_f32())
                        .collect()
                })
                .collect()
        };
        let vmax = 1.0f64;
        let mut worst = 0f64;
        for (j, &len) in lens.iter().enumerate() {
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let want = attention_f64(
                    &q[(j * heads + h) * hd..(j * heads + h + 1) * hd],
                    &f16_rows(&k, len as usize, kvh),
                    &f16_rows(&v, len as usize, kvh),
                    scale,
                );
                for d in 0..hd {
                    let g = got[(j * heads + h) * hd + d] as f64;
                    let e = (g - want[d]).abs() / vmax;
                    assert!(
                        e <= 2e-6,
                        "{heads}/{kv_heads}×{hd}: len {len} head {h} value {d}: {g} vs {}",
                        want[d]
                    );
                    worst = worst.max(e);
                }
            }
        }
        println!("attention {heads}/{kv_heads} heads of {hd}: worst error / max|v| {worst:.2e}");
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn a_program_recorded_once_replays_decode_steps() {
    let vk = vk();
    let (heads, kv_heads, hd) = (4usize, 2usize, 32usize);
    let width = kv_heads * hd;
    let steps = 70; // past a chunk of 64 positions
    let cache_rows = 80;
    // Buffers: q, k (this step's rows), the two caches, the step's data (position, length), out.
    let sizes = [
        heads * hd * 4,
        width * 4,
        width * 4,
        cache_rows * width * 2,
        cache_rows * width * 2,
        8,
        heads * hd * 4,
    ];
    let mut b = Bufs::new(&vk, &sizes, Memory::Device);
    let host_layout = {
        let mut l = Layout::default();
        l.take(8);
        l
    };
    let mut host = Arena::new(&vk, host_layout.bytes, Memory::Host).unwrap();
    assert!(host.is_mapped());
    let pos = host.at(0, 4).unwrap();
    let len = host.at(4, 4).unwrap_err(); // not aligned for a binding: refused by name
    assert!(len.to_string().contains("a binding"), "{len}");
    // The length lives in its own aligned region of a second host arena.
    // (The length, then the first cache row: 0.)
    let mut host2 = Arena::new(&vk, 8, Memory::Host).unwrap();
    let len = host2.at(0, 8).unwrap();
    host2.write(4, &0u32.to_le_bytes()).unwrap();
    let rope = |n_heads: usize, stride: usize| RopeArgs {
        kind: RopeKind::Neox,
        rows: 1,
        heads: n_heads,
        head_dim: hd,
        n_dims: hd,
        stride,
        freq_base: 10000.0,
        freq_scale: 1.0,
        mscale: 1.0,
    };
    let scale = 1.0 / (hd as f32).sqrt();
    let mut program = b.program(|rec, b| {
        ops::rope(rec, b.r(0), pos, rope(heads, heads * hd)).unwrap();
        ops::rope(rec, b.r(1), pos, rope(kv_heads, width)).unwrap();
        ops::store_kv(rec, b.r(1), b.r(3), pos, 1, width, cache_rows).unwrap();
        ops::store_kv(rec, b.r(2), b.r(4), pos, 1, width, cache_rows).unwrap();
        let a = AttnArgs {
            rows: 1,
            heads,
            kv_heads,
            head_dim: hd,
            cache_rows,
            scale,
        };
        ops::attn_decode(rec, b.r(0), (b.r(3), b.r(4)), len, b.r(6), a).unwrap();
    });
    let cpu_rope = Rope::new(RopeKind::Neox, hd, 10000.0, 1.0, None);
    let mut cs = vec![0f32; hd];
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let q = random(heads * hd, 100 + step as u64);
        let k = random(width, 200 + step as u64);
        let v = random(width, 300 + step as u64);
        b.put_f32(0, &q);
        b.put_f32(1, &k);
        b.put_f32(2, &v);
        host.write(0, &(step as u32).to_le_bytes()).unwrap();
        host2.write(0, &(step as u32 + 1).to_le_bytes()).unwrap();
        program.run().unwrap();
        let got = b.get_f32(6);
        // The CPU's: RoPE at this position, K and V to f16, attention over every step so far.
        cpu_rope.cos_sin(step, &mut cs);
        let (mut q, mut k) = (q, k);
        cpu_rope.apply(&mut q, hd, &cs);
        cpu_rope.apply(&mut k, hd, &cs);
        let f16 = |x: &[f32]| {
            x.iter()
                .map(|&a| half::f16::from_f32(a).to_f32())
                .collect::<Vec<_>>()
        };
        ks.push(f16(&k));
        vs.push(f16(&v));
        for h in 0..heads {
            let kvh = h / (heads / kv_heads);
            let kh: Vec<Vec<f32>> = ks
                .iter()
                .map(|r| r[kvh * hd..(kvh + 1) * hd].to_vec())
                .collect();
            let vh: Vec<Vec<f32>> = vs
                .iter()
                .map(|r| r[kvh * hd..(kvh + 1) * hd].to_vec())
                .collect();
            let want = attention_f64(&q[h * hd..(h + 1) * hd], &kh, &vh, scale);
            for d in 0..hd {
                let g = got[h * hd + d] as f64;
                // RoPE's cos/sin differ by a few ulps from the CPU's before the attention.
                assert!(
                    (g - want[d]).abs() <= 1e-5,
                    "step {step} head {h} value {d}: {g} vs {}",
                    want[d]
                );
            }
        }
    }
    assert_eq!(program.runs, steps as u64);
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn activations_add_bias_scale_match_the_cpu() {
    let vk = vk();
    let n = 1000;
    let mut gate: Vec<f32> = random(n, 20).iter().map(|v| v * 12.0).collect();
    gate[..6].copy_from_slice(&[0.0, -0.0, 80.0, -80.0, 1e-20, -1e-20]);
    let up = random(n, 21);
    let mut b = Bufs::new(&vk, &[n * 4, n * 4], Memory::Device);
    for act in [Activation::Silu, Activation::GeluTanh] {
        b.put_f32(0, &gate);
        b.put_f32(1, &up);
        b.run(|rec, b| ops::glu(rec, b.r(0), b.r(1), n, act).unwrap());
        let got = b.get_f32(0);
        for i in 0..n {
            let g = gate[i];
            let a = match act {
                Activation::Silu => (g as f64 / (1.0 + (-g as f64).exp())) as f32,
                Activation::GeluTanh => kiln::kernels::ops::gelu_tanh_exact(g),
            };
            let want = a * up[i];
            // GELU's 1 + tanh cancels for large negative x: the device's tanh, a few ulps of 1
            // from the CPU's, then counts against 0.5·|x·up|.
            let cancel = match act {
                Activation::Silu => 0.0,
                Activation::GeluTanh => 1.2e-7 * (g * up[i]).abs(),
            };
            assert!(
                (got[i] - want).abs() <= 2e-6 * want.abs() + cancel + 1e-30,
                "{act:?}({g}) · {}: {} vs {want}",
                up[i],
                got[i]
            );
        }
        // The CPU's SiLU (the same exp, computed the same way, but for `fma`, which lavapipe
        // may split) agrees within the same bound.
        if act == Activation::Silu {
            for i in 0..n {
                let want = kiln::kernels::ops::silu(gate[i]) * up[i];
                assert!(
                    (got[i] - want).abs() <= 2e-6 * want.abs() + 1e-30,
                    "silu {}",
                    gate[i]
                );
            }
        }
    }
    // add and scale: one f32 operation each, bit for bit.
    let (y, x) = (random(n, 22), random(n, 23));
    b.put_f32(0, &y);
    b.put_f32(1, &x);
    b.run(|rec, b| {
        ops::add(rec, b.r(0), b.r(1), n).unwrap();
        ops::scale(rec, b.r(0), n, 0.125 + 1e-3).unwrap();
    });
    let got = b.get_f32(0);
    for i in 0..n {
        let mut want = [y[i]];
        kiln::kernels::ops::add_inplace(&mut want, &x[i..i + 1]);
        kiln::kernels::ops::scale_inplace(&mut want, 0.125 + 1e-3);
        assert_eq!(got[i].to_bits(), want[0].to_bits(), "{i}");
    }
    // A bias of 40 values added to each of 25 rows: one f32 addition each, bit for bit.
    let (rows, width) = (25, 40);
    let bias = random(width, 24);
    b.put_f32(0, &y);
    b.put_f32(1, &bias);
    b.run(|rec, b| ops::bias(rec, b.r(0), b.r(1), rows, width).unwrap());
    let got = b.get_f32(0);
    for i in 0..rows * width {
        let want = y[i] + bias[i % width];
        assert_eq!(got[i].to_bits(), want.to_bits(), "bias {i}");
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn argmax_matches_the_sampler() {
    let vk = vk();
    let n = 1000;
    let nan = f32::NAN;
    let mut rows: Vec<Vec<f32>> = vec![random(n, 30), random(n, 31)];
    let mut ties = random(n, 32);
    ties[700] = 5.0;
    ties[300] = 5.0; // the first wins
    rows.push(ties);
    let mut nans = vec![nan; n];
    nans[999] = f32::NEG_INFINITY;
    rows.push(nans); // -inf beats NaN
    rows.push(vec![nan; n]); // all NaN: 0
    let mut zeros = vec![-1.0; n];
    zeros[10] = -0.0;
    zeros[5] = 0.0;
    rows.push(zeros); // -0 ties +0: the first
    let mut inf = random(n, 33);
    inf[256] = f32::INFINITY;
    inf[900] = f32::INFINITY;
    rows.push(inf);
    let flat: Vec<f32> = rows.concat();
    let r = rows.len();
    let mut b = Bufs::new(&vk, &[flat.len() * 4, r * 4], Memory::Device);
    b.put_f32(0, &flat);
    b.run(|rec, b| ops::argmax(rec, b.r(0), b.r(1), r, n).unwrap());
    let got = b.get(1);
    for (j, row) in rows.iter().enumerate() {
        let g = u32::from_le_bytes(got[j * 4..j * 4 + 4].try_into().unwrap());
        assert_eq!(g, kiln::sampler::argmax(row), "row {j}");
    }
}

/// An arena the host cannot map (a discrete GPU's; forced here) is written and read through the
/// staging buffer, in several rounds past its size, and the kernels see the same bytes.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "needs a Vulkan driver (the suite installs lavapipe only on Debian-like Linux)"
)]
fn a_staged_arena_is_written_and_read_like_a_mapped_one() {
    let vk = vk();
    let n = 5 << 20; // 20 MiB of f32: more than the 16 MiB staging buffer
    let x = random(n, 40);
    let mut b = Bufs::new(&vk, &[n * 4, 4096], Memory::DeviceStaged);
    assert!(!b.dev.is_mapped());
    b.put_f32(0, &x);
    assert_eq!(b.get_f32(0), x);
    b.run(|rec, b| ops::scale(rec, b.r(0), n, 2.0).unwrap());
    let got = b.get_f32(0);
    assert!(got
        .iter()
        .zip(&x)
        .all(|(g, v)| g.to_bits() == (v * 2.0).to_bits()));
    // Reads and writes past the arena, and bindings past a region, are refused by name.
    let mut small = Arena::new(&vk, 64, Memory::DeviceStaged).unwrap();
    let e = small.write(60, &[0u8; 8]).unwrap_err();
    assert!(e.to_string().contains("a write"), "{e}");
    let e = small.at(0, 128).unwrap_err();
    assert!(e.to_string().contains("past the arena"), "{e}");
    let mut rec = Recorder::new(&vk);
    let tiny = small.at(0, 16).unwrap();
    let e = ops::add(&mut rec, tiny, tiny, 100).unwrap_err();
    assert_eq!(e.to_string(), "add: y holds 16 bytes, 400 needed");
}
