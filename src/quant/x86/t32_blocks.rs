//! The 32-element formats over 16-row groups (`quant::repack`, read as in `t32_x16`) in the
//! block-sum order ([`kquant_order::t32_dot_blocks`](crate::quant::kquant_order::t32_dot_blocks)),
//! AVX-512 VNNI: per block, the exact integer dot of all 32 elements, converted and
//! fused-multiply-added with `d_w · d_x` into one f32 sum per row (a minimum's `m_w · s_x`
//! summed apart, added at the end).
//!
//! This is the reference engine's own arithmetic for Q4_0 on x86: it rearranges Q4_0 matrices
//! at load (`q4_0_8x8`, AVX2 and up) and its products over them sum each block in integers
//! before one fused multiply-add, where its plain dot keeps 8 lanes (`t32_x16`). The AVX-512
//! VNNI tier uses it for Q4_0, the AMX tier (`amx`) for every 32-element format. It costs
//! one conversion and one multiply-add per block and activation row instead of 8.
//!
//! A batch decodes the group once into signed bytes. With signed weights the activations are
//! the unsigned operand of `vpdpbusd`: `y + 128` (`y ^ 0x80`), and each weight row's
//! `128 · Σ w` over the block, computed once with the decoding, starts the integer. Formats
//! without an offset (Q4_1, Q5_1: unsigned weights) multiply as stored, the activations signed.

use super::avx2::{prefetch_ahead, Gemm};
use super::t32_x16::{corrections, dx, m16, sx, Group32, Lanes512, MAX_BLOCKS};
use core::arch::x86_64::*;
use core::mem::MaybeUninit;

/// Activation rows a batch runs at a time (independent integer chains for the core to
/// overlap). The decoded group (512 bytes a block) is read once per this many rows: a
/// Llama-1B down projection's 256 blocks are 128 KiB, past L1, so 4 rows a pass read it from
/// L2 128 times a 512-token prompt. 16 rows: that model's pp512 306 → 431-446 tok/s on a
/// Zen 5 (2 threads; 8 rows gave 374-390, 24 and 32 no more than 16).
const ROWS: usize = 16;

/// One 16-row group (`w`) against `nx` activation rows in the block-sum order:
/// `out[j * out_stride + r]` for rows `r < 16`. `n` is a multiple of 32, at most
/// `32 · MAX_BLOCKS`.
///
/// # Safety
/// As `t32_x16::gemm_tf`: AVX-512 F/BW/VL and VNNI; `w` holds `n / 32` repacked blocks, each
/// of the `nx` rows at `x + j·x_stride` holds `n / 32` activation blocks, and `out` has room
/// for every output written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
pub(super) unsafe fn gemm_tf<F: Lanes512>(g: Gemm) {
    let (n, w, _, _, x, _, nx, out, _) = g.parts();
    let nb = n / 32;
    debug_assert!(nb <= MAX_BLOCKS);
    if nx == 1 {
        _mm512_storeu_ps(out, row::<F>(nb, w, x));
    } else {
        batch::<F>(g);
    }
}

/// One activation row (decode; a tile kernel's rows after its last tile): the group streamed
/// once, per block the 8 lanes' `dpbusd` as stored (unsigned weights, signed activations)
/// added in integers, less `OFFSET · Σ y`.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI; `w` holds `nb` blocks of the layout, `x` `nb` activation blocks.
#[inline(always)]
pub(super) unsafe fn row<F: Lanes512>(nb: usize, w: *const u8, x: *const u8) -> __m512 {
    let mut acc = _mm512_setzero_ps();
    let mut ms = _mm512_setzero_ps();
    for b in 0..nb {
        let sb = w.add(b * F::BYTES);
        prefetch_ahead(sb, F::BYTES);
        let xp = x.add(b * F::XB);
        let prod = _mm512_mul_ps(F::d(sb), dx(xp));
        let y = |l: usize| {
            _mm512_set1_epi32(core::ptr::read_unaligned(
                xp.add(F::XQ + 4 * l).cast::<i32>(),
            ))
        };
        // Eight independent lane dots (one chain would wait on each `dpbusd`), then added:
        // integers, so the order does not matter.
        let zero = _mm512_setzero_si512();
        let mut lanes = [zero; 8];
        for j in 0..4 {
            let [lo, hi] = F::values(sb, j);
            lanes[j] = _mm512_dpbusd_epi32(zero, lo, y(j));
            lanes[j + 4] = _mm512_dpbusd_epi32(zero, hi, y(j + 4));
        }
        let s: [__m512i; 4] = core::array::from_fn(|i| _mm512_add_epi32(lanes[i], lanes[i + 4]));
        let dot = _mm512_sub_epi32(
            _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3])),
            _mm512_set1_epi32(offset_sum::<F>(xp)),
        );
        acc = _mm512_fmadd_ps(prod, _mm512_cvtepi32_ps(dot), acc);
        if F::MIN {
            ms = _mm512_fmadd_ps(m16(sb), sx(xp), ms);
        }
    }
    if F::MIN {
        _mm512_add_ps(acc, ms)
    } else {
        acc
    }
}

/// `OFFSET · Σ y` over the activation block's 32 quants (0 for unsigned formats).
///
/// # Safety
/// `xp` points to a whole activation block; AVX-512 F/VL and VNNI.
#[inline(always)]
unsafe fn offset_sum<F: Group32>(xp: *const u8) -> i32 {
    if F::OFFSET == 0 {
        return 0;
    }
    // The lanes' `−OFFSET · Σ y` (the low 8 dwords), added.
    let lanes = _mm512_castsi512_si256(corrections::<F>(xp));
    -_mm512_reduce_add_epi32(_mm512_zextsi256_si512(lanes))
}

/// A batch: the group decoded once ([`Decoded`], with the starts), then the activation rows
/// [`ROWS`] at a time.
///
/// # Safety
/// As [`gemm_tf`], with `nb ≤ MAX_BLOCKS` (the buffers' size: only blocks `< nb` are written,
/// and only those are read).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
unsafe fn batch<F: Lanes512>(g: Gemm) {
    let (_, w, _, _, x, x_stride, nx, out, out_stride) = g.parts();
    let nb = g.n / 32;
    let mut g = Decoded::new();
    g.fill::<F>(nb, w, true);
    let xr = |j: usize| x.add(j * x_stride);
    let flip = _mm256_set1_epi8(-128);
    let mut j = 0;
    while j < nx {
        let t = (nx - j).min(ROWS);
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let mut ms = [_mm512_setzero_ps(); ROWS];
        // The rows' quants, `+128` for signed weights (as unsigned bytes), staged a block
        // ahead: the stores have a block's products to retire before the broadcasts read
        // them back (read at once, they waited on store forwarding). A Llama-1B shape's Q4_0
        // pp512 on a Zen 5, 2 threads: 391-400 → 424-444 tok/s; three blocks ahead, no better.
        let mut ys = [[[0i32; 8]; ROWS]; 2];
        let stage = |ys: &mut [[i32; 8]; ROWS], b: usize| {
            for (i, y) in ys.iter_mut().enumerate().take(t) {
                let q = _mm256_loadu_si256(xr(j + i).add(b * F::XB + F::XQ).cast());
                let q = if F::MIN { q } else { _mm256_xor_si256(q, flip) };
                _mm256_storeu_si256(y.as_mut_ptr().cast(), q);
            }
        };
        stage(&mut ys[0], 0);
        for b in 0..nb {
            let (d, v) = (g.d(b), g.lanes(b));
            if b + 1 < nb {
                stage(&mut ys[(b + 1) % 2], b + 1);
            }
            let cur = &ys[b % 2];
            for i in 0..t {
                let xp = xr(j + i).add(b * F::XB);
                let y = |l: usize| _mm512_set1_epi32(cur[i][l]);
                // Two chains of four (lanes 0-3, 4-7), added: integers, any order.
                let (mut lo, mut hi) = if F::MIN {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                } else {
                    (g.start(b), _mm512_setzero_si512())
                };
                for l in 0..4 {
                    (lo, hi) = if F::MIN {
                        (
                            _mm512_dpbusd_epi32(lo, v[l], y(l)),
                            _mm512_dpbusd_epi32(hi, v[l + 4], y(l + 4)),
                        )
                    } else {
                        (
                            _mm512_dpbusd_epi32(lo, y(l), v[l]),
                            _mm512_dpbusd_epi32(hi, y(l + 4), v[l + 4]),
                        )
                    };
                }
                let dot = _mm512_add_epi32(lo, hi);
                let prod = _mm512_mul_ps(d, dx(xp));
                acc[i] = _mm512_fmadd_ps(prod, _mm512_cvtepi32_ps(dot), acc[i]);
                if F::MIN {
                    ms[i] = _mm512_fmadd_ps(g.m(b), sx(xp), ms[i]);
                }
            }
        }
        for i in 0..t {
            let r = if F::MIN {
                _mm512_add_ps(acc[i], ms[i])
            } else {
                acc[i]
            };
            _mm512_storeu_ps(out.add((j + i) * out_stride), r);
        }
        j += t;
    }
}

/// A group decoded once for a batch, on the stack (`t32_x16::STACK_BYTES`): per block its 8
/// lanes as signed bytes (`v − OFFSET`; formats without an offset as stored, `0 ..= 31`), its
/// 16 rows' `d`, and their `m` (formats with a minimum) or, when asked, the start
/// `−128 · Σ v` of a product with the activations made unsigned (`y + 128`).
pub(super) struct Decoded {
    lanes: [MaybeUninit<[__m512i; 8]>; MAX_BLOCKS],
    ds: [MaybeUninit<__m512>; MAX_BLOCKS],
    extra: [MaybeUninit<__m512i>; MAX_BLOCKS],
}

impl Decoded {
    #[inline(always)]
    pub(super) fn new() -> Decoded {
        Decoded {
            lanes: [const { MaybeUninit::uninit() }; MAX_BLOCKS],
            ds: [const { MaybeUninit::uninit() }; MAX_BLOCKS],
            extra: [const { MaybeUninit::uninit() }; MAX_BLOCKS],
        }
    }

    /// Blocks `0 .. nb` of the group `w` (`starts`: the starts of formats without a minimum).
    ///
    /// # Safety
    /// `w` holds `nb ≤ MAX_BLOCKS` blocks of `F`'s layout; AVX-512 F/BW/VL and VNNI.
    #[inline(always)]
    pub(super) unsafe fn fill<F: Lanes512>(&mut self, nb: usize, w: *const u8, starts: bool) {
        assert!(nb <= MAX_BLOCKS);
        let off = _mm512_set1_epi8(F::OFFSET as i8);
        let high = _mm512_set1_epi8(-128);
        for b in 0..nb {
            let sb = w.add(b * F::BYTES);
            prefetch_ahead(sb, F::BYTES);
            self.ds[b].write(F::d(sb));
            let mut v = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let [lo, hi] = F::values(sb, j);
                // Q8_0's `q ^ 0x80` − 128 wraps back to `q`.
                (v[j], v[j + 4]) = (_mm512_sub_epi8(lo, off), _mm512_sub_epi8(hi, off));
            }
            if F::MIN {
                self.extra[b].write(_mm512_castps_si512(m16(sb)));
            } else if starts {
                let sum = v.iter().fold(_mm512_setzero_si512(), |s, l| {
                    _mm512_dpbusd_epi32(s, high, *l)
                });
                self.extra[b].write(_mm512_sub_epi32(_mm512_setzero_si512(), sum));
            }
            self.lanes[b].write(v);
        }
    }

    /// Block `b`'s lanes (filled: `b < nb`).
    #[inline(always)]
    pub(super) unsafe fn lanes(&self, b: usize) -> &[__m512i; 8] {
        self.lanes[b].assume_init_ref()
    }

    /// Block `b`'s 16 `d` (filled: `b < nb`).
    #[inline(always)]
    pub(super) unsafe fn d(&self, b: usize) -> __m512 {
        self.ds[b].assume_init()
    }

    /// Block `b`'s 16 `m` (filled, a format with a minimum).
    #[inline(always)]
    pub(super) unsafe fn m(&self, b: usize) -> __m512 {
        _mm512_castsi512_ps(self.extra[b].assume_init())
    }

    /// Block `b`'s start (filled with the starts, a format without a minimum).
    #[inline(always)]
    pub(super) unsafe fn start(&self, b: usize) -> __m512i {
        self.extra[b].assume_init()
    }
}
