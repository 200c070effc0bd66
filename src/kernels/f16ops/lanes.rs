//! The x86 paths' kernels whose operations are the same lane for lane at any vector width:
//! [`lane_kernels!`] writes them once, and the AVX2 and AVX-512 paths each expand it with their
//! own registers and intrinsics. Each kernel runs the scalar definition's operations in its
//! order, element by element, so the two expansions give the same bits.

/// Defines, in the calling module, the path's table `$table` (named `$name`) and these kernels
/// over vectors `$v` of `$w` f32 lanes, compiled
/// for the target features `$feat`:
///
/// - the table's entries `dot`, `mad`, `scale`, `vkq_multi`, `key_tile`, `softmax_tile`,
///   `scale_max`, `swiglu`, `geglu`, `gelu` and `vkq_acc`: each checks its shapes and runs
///   the kernel below, or the path's `softmax_tile_impl` / `scale_max_impl` (the path writes
///   the entries `vec_keys`, `kq_tile` and `kq_rows`);
/// - `dot_impl(q, k)`: the reference's `BLOCK`-element blocks into `BLOCK / $w` accumulators,
///   reduced by `$reduce`, the tail in f64;
/// - `mad_impl(y, x, v)`, `scale_impl(y, v)`: the f16 accumulate and rescale, whole vectors,
///   the tail through the scalar definition;
/// - `vkq_multi_impl::<G>`: `G` accumulator rows, `$c` vectors of columns at a time;
/// - `kq_tile_impl::<R>(q, hd, kt, out, col0)`: `R` query rows against the 4 vectors of keys
///   from column `col0` of a transposed tile;
/// - `key_tile_impl(k, kt, hd)`: `$w × $w` blocks of keys transposed by `$transpose`;
/// - `swiglu_impl`, `gelu_impl`: whole vectors (`$exp`, `$gelu` the vector forms);
/// - `vkq_acc_impl`: 4 vectors, then one, of the accumulator in registers across the keys;
/// - `cap_lanes(x, cap)`: the scalar soft cap on each lane;
/// - `exp_poly(x)`: the range reduction and polynomial of `super::expf_approx` on each lane
///   (each path scales the result by `2ⁿ` its own way in `$exp`).
///
/// The operations come in as the path's intrinsics: `$ld`/`$st` (unaligned f32 load/store),
/// `$ldh` (8 or 16 f16 → f32 from a `*const u16`), `$set1`, `$zero`, `$fma`, `$fnmadd`,
/// `$mul`, `$add`, `$sub`, `$div`, and `$round` (to f16 and back).
macro_rules! lane_kernels {
    (
        table: $table:ident, name: $name:literal,
        feat: $feat:literal, v: $v:ty, w: $w:literal, vkq_vectors: $c:literal,
        ld: $ld:ident, st: $st:ident, ldh: $ldh:ident, set1: $set1:ident, zero: $zero:ident,
        fma: $fma:ident, fnmadd: $fnmadd:ident, mul: $mul:ident, add: $add:ident,
        sub: $sub:ident, div: $div:ident, round: $round:ident, reduce: $reduce:ident,
        exp: $exp:ident, gelu: $gelu:ident, transpose: $transpose:ident $(,)?
    ) => {
        pub const $table: super::F16Ops = super::F16Ops {
            dot,
            mad,
            scale,
            vec_keys,
            kq_tile,
            key_tile,
            kq_rows,
            vkq_multi,
            softmax_tile,
            scale_max,
            vkq_acc,
            swiglu,
            geglu,
            gelu,
            name: $name,
        };

        // SAFETY (every entry): a path's table is selected only when its features were
        // detected at run time; each entry checks the shapes its kernel relies on.
        fn dot(q: &[f32], k: &[f16]) -> f32 {
            assert_eq!(q.len(), k.len());
            // SAFETY: see above.
            unsafe { dot_impl(q, k) }
        }

        fn mad(y: &mut [f32], x: &[f16], v: f32) {
            assert_eq!(y.len(), x.len());
            // SAFETY: see above.
            unsafe { mad_impl(y, x, v) }
        }

        fn scale(y: &mut [f32], v: f32) {
            // SAFETY: see above.
            unsafe { scale_impl(y, v) }
        }

        fn vkq_multi(a: super::Vkq) {
            let blocks = [
                vkq_multi_impl::<1>,
                vkq_multi_impl::<2>,
                vkq_multi_impl::<3>,
                vkq_multi_impl::<4>,
            ];
            // SAFETY: see above; `vkq_multi_blocked` checks the rows.
            unsafe { super::vkq_multi_blocked(vkq_acc, $c * $w, blocks, a) }
        }

        fn key_tile(k: &[f16], kt: &mut [f32]) {
            let hd = kt.len() / KV_TILE;
            assert!(hd > 0 && k.len().is_multiple_of(hd) && k.len() / hd <= KV_TILE);
            // SAFETY: see above.
            unsafe { key_tile_impl(k, kt, hd) }
        }

        fn softmax_tile(s: &mut [f32; KV_TILE], m: f32) -> f64 {
            // SAFETY: see above.
            unsafe { softmax_tile_impl(s, m) }
        }

        fn scale_max(s: &mut [f32; KV_TILE], sc: ScoreScale, lo: usize, hi: usize) -> f32 {
            // SAFETY: see above; the visible range is clamped to the tile.
            unsafe { scale_max_impl(s, sc, lo.min(KV_TILE), hi.min(KV_TILE)) }
        }

        fn swiglu(gate: &mut [f32], up: &[f32]) {
            assert!(up.len() >= gate.len());
            // SAFETY: see above.
            unsafe { swiglu_impl(gate, up) }
        }

        fn geglu(gate: &mut [f32], up: &[f32]) {
            // SAFETY: see above; `gelu_with` checks `up`'s length.
            unsafe { super::gelu_with(gate, Some(up), $w, gelu_impl) }
        }

        fn gelu(x: &mut [f32]) {
            // SAFETY: see above.
            unsafe { super::gelu_with(x, None, $w, gelu_impl) }
        }

        fn vkq_acc(acc: &mut [f32], p: &[f32], v: &[f16]) {
            assert_eq!(v.len(), p.len() * acc.len());
            // SAFETY: see above.
            unsafe { vkq_acc_impl(acc, p, v) }
        }

        /// `Σ q·k` in the reference's order: per `BLOCK` elements, `BLOCK / $w` accumulators
        /// (the reference's four of 16 lanes), reduced by `$reduce`; the tail in f64.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_impl(q: &[f32], k: &[f16]) -> f32 {
            let n = q.len();
            let np = n & !(BLOCK - 1);
            let mut sumf = 0.0f64;
            if np > 0 {
                let mut acc = [$zero(); BLOCK / $w];
                let (qp, kp) = (q.as_ptr(), k.as_ptr() as *const u16);
                // SAFETY: every load reads `$w` elements at `i + $w·h < np <= n`.
                unsafe {
                    for i in (0..np).step_by(BLOCK) {
                        for (h, a) in acc.iter_mut().enumerate() {
                            let o = i + $w * h;
                            *a = $fma($ld(qp.add(o)), $ldh(kp.add(o)), *a);
                        }
                    }
                }
                sumf = $reduce(acc) as f64;
            }
            for i in np..n {
                sumf += (q[i] * k[i].to_f32()) as f64;
            }
            sumf as f32
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn mad_impl(y: &mut [f32], x: &[f16], v: f32) {
            let n = y.len();
            let vv = $set1(v);
            let mut i = 0;
            let (yp, xp) = (y.as_mut_ptr(), x.as_ptr() as *const u16);
            // SAFETY: loads and stores of `$w` elements at `i` with `i + $w <= n`.
            unsafe {
                while i + $w <= n {
                    let r = $fma($ldh(xp.add(i)), vv, $ld(yp.add(i)));
                    $st(yp.add(i), $round(r));
                    i += $w;
                }
            }
            super::mad_scalar(&mut y[i..], &x[i..], v);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn scale_impl(y: &mut [f32], v: f32) {
            let n = y.len();
            let vv = $set1(v);
            let mut i = 0;
            let yp = y.as_mut_ptr();
            // SAFETY: loads and stores of `$w` elements at `i` with `i + $w <= n`.
            unsafe {
                while i + $w <= n {
                    $st(yp.add(i), $round($mul($ld(yp.add(i)), vv)));
                    i += $w;
                }
            }
            super::scale_scalar(&mut y[i..], v);
        }

        /// `G` accumulator rows (`hdv` a multiple of `$c·$w`), `$c·$w` columns at a time:
        /// `$c` vectors per row stay in registers across the `n` keys, each value block
        /// converted once for the `G` rows.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn vkq_multi_impl<const G: usize>(
            acc: &mut [f32],
            acc_stride: usize,
            p: &[f32],
            p_stride: usize,
            v: &[f16],
            n: usize,
            hdv: usize,
        ) {
            let (ap, pp, vp) = (acc.as_mut_ptr(), p.as_ptr(), v.as_ptr() as *const u16);
            for d0 in (0..hdv).step_by($c * $w) {
                // SAFETY: rows `g < G` of `acc` hold `hdv >= d0 + $c·$w` elements at
                // `g·acc_stride`; value row `j < n` holds `hdv`; weight row `g` holds `n` at
                // `g·p_stride`.
                unsafe {
                    let mut a: [[$v; $c]; G] = std::array::from_fn(|g| {
                        std::array::from_fn(|c| $ld(ap.add(g * acc_stride + d0 + $w * c)))
                    });
                    for j in 0..n {
                        let x: [$v; $c] =
                            std::array::from_fn(|c| $ldh(vp.add(j * hdv + d0 + $w * c)));
                        for (g, ag) in a.iter_mut().enumerate() {
                            let pv = $set1(*pp.add(g * p_stride + j));
                            for (c, ac) in ag.iter_mut().enumerate() {
                                *ac = $fma(x[c], pv, *ac);
                            }
                        }
                    }
                    for (g, ag) in a.iter().enumerate() {
                        for (c, ac) in ag.iter().enumerate() {
                            $st(ap.add(g * acc_stride + d0 + $w * c), *ac);
                        }
                    }
                }
            }
        }

        /// `R` query rows (`hd` apart in `q`) against keys `col0 .. col0 + 4·$w` of the
        /// transposed tile, into those columns of `R` rows of `out`.
        #[target_feature(enable = $feat)]
        unsafe fn kq_tile_impl<const R: usize>(
            q: &[f32],
            hd: usize,
            kt: &[f32],
            out: &mut [f32],
            col0: usize,
        ) {
            let mut acc = [[$zero(); 4]; R];
            let (kp, qp) = (kt.as_ptr().add(col0), q.as_ptr());
            for d in 0..hd {
                // SAFETY: `d * KV_TILE + col0 + 4·$w <= kt.len()`, row `i < R` of `q` has
                // `hd` elements.
                unsafe {
                    let kv: [$v; 4] = std::array::from_fn(|c| $ld(kp.add(d * KV_TILE + $w * c)));
                    for (i, a) in acc.iter_mut().enumerate() {
                        let qv = $set1(*qp.add(i * hd + d));
                        for (c, ac) in a.iter_mut().enumerate() {
                            *ac = $fma(kv[c], qv, *ac);
                        }
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                for (c, ac) in a.iter().enumerate() {
                    // SAFETY: row `i < R` of `out` holds KV_TILE floats.
                    unsafe { $st(out.as_mut_ptr().add(i * KV_TILE + col0 + $w * c), *ac) };
                }
            }
        }

        /// `$w × $w` blocks: `$w` key rows converted to f32, transposed in registers, stored
        /// as `$w` dimension rows of `kt`; leftover dimensions (`hd % $w`) element by element.
        #[target_feature(enable = $feat)]
        unsafe fn key_tile_impl(k: &[f16], kt: &mut [f32], hd: usize) {
            let n = k.len() / hd;
            let dw = hd / $w * $w;
            let (kp, ktp) = (k.as_ptr() as *const u16, kt.as_mut_ptr());
            for j0 in (0..n).step_by($w) {
                let nj = (n - j0).min($w);
                for d0 in (0..dw).step_by($w) {
                    let mut r = [$zero(); $w];
                    for (i, ri) in r.iter_mut().enumerate().take(nj) {
                        // SAFETY: row `j0 + i < n` has `hd >= d0 + $w` elements.
                        *ri = unsafe { $ldh(kp.add((j0 + i) * hd + d0)) };
                    }
                    for (d, v) in $transpose(r).into_iter().enumerate() {
                        // SAFETY: row `d0 + d < hd` of `kt`, columns `j0..j0 + $w <= KV_TILE`.
                        unsafe { $st(ktp.add((d0 + d) * KV_TILE + j0), v) };
                    }
                }
                for j in j0..j0 + nj {
                    for d in dw..hd {
                        kt[d * KV_TILE + j] = k[j * hd + d].to_f32();
                    }
                }
            }
        }

        /// `x / (1 + expf(0 − x)) · g`, `$w` lanes at a time, the tail through the scalar
        /// definition (the same arithmetic per element). Caller: `up` is no shorter than
        /// `gate`.
        #[target_feature(enable = $feat)]
        unsafe fn swiglu_impl(gate: &mut [f32], up: &[f32]) {
            let nw = gate.len() / $w * $w;
            let one = $set1(1.0);
            let mut i = 0;
            while i < nw {
                // SAFETY: `$w` elements at `i + $w <= nw` of `gate` (and of `up`, no shorter).
                unsafe {
                    let x = $ld(gate.as_ptr().add(i));
                    let g = $ld(up.as_ptr().add(i));
                    let e = $exp($sub($zero(), x));
                    let silu = $div(x, $add(one, e));
                    $st(gate.as_mut_ptr().add(i), $mul(silu, g));
                }
                i += $w;
            }
            super::swiglu_scalar(&mut gate[nw..], &up[nw..]);
        }

        /// GELU of the whole `$w`-lane blocks of `x` (times `up` when given), the tail left
        /// alone. Caller: `up` is at least as long as `x`; `table` points at the GELU table.
        #[target_feature(enable = $feat)]
        unsafe fn gelu_impl(x: &mut [f32], up: Option<&[f32]>, table: *const u16) {
            let nw = x.len() / $w * $w;
            let mut i = 0;
            while i < nw {
                // SAFETY: `$w` elements at `i + $w <= nw` of `x` (and of `up`, no shorter);
                // the table as the caller promises.
                unsafe {
                    let p = x.as_mut_ptr().add(i);
                    let mut y = $gelu($ld(p), table);
                    if let Some(u) = up {
                        y = $mul(y, $ld(u.as_ptr().add(i)));
                    }
                    $st(p, y);
                }
                i += $w;
            }
        }

        /// Four vectors of the accumulator stay in registers across all the keys, then one;
        /// the leftover columns element by element. Each element takes the keys' `fma`s in
        /// order, as the scalar definition.
        #[target_feature(enable = $feat)]
        unsafe fn vkq_acc_impl(acc: &mut [f32], p: &[f32], v: &[f16]) {
            let dv = acc.len();
            let vp = v.as_ptr() as *const u16;
            let mut d0 = 0;
            while d0 + 4 * $w <= dv {
                // SAFETY: loads/stores of `$w` elements at `d0 + $w·r < dv`; V row `j` has
                // `dv` elements.
                unsafe {
                    let ap = acc.as_mut_ptr().add(d0);
                    let mut a: [$v; 4] = std::array::from_fn(|r| $ld(ap.add($w * r)));
                    for (j, &pj) in p.iter().enumerate() {
                        let pv = $set1(pj);
                        for (r, ar) in a.iter_mut().enumerate() {
                            *ar = $fma($ldh(vp.add(j * dv + d0 + $w * r)), pv, *ar);
                        }
                    }
                    for (r, ar) in a.iter().enumerate() {
                        $st(ap.add($w * r), *ar);
                    }
                }
                d0 += 4 * $w;
            }
            while d0 + $w <= dv {
                // SAFETY: as above, one vector.
                unsafe {
                    let ap = acc.as_mut_ptr().add(d0);
                    let mut a = $ld(ap);
                    for (j, &pj) in p.iter().enumerate() {
                        a = $fma($ldh(vp.add(j * dv + d0)), $set1(pj), a);
                    }
                    $st(ap, a);
                }
                d0 += $w;
            }
            for d in d0..dv {
                for (j, &pj) in p.iter().enumerate() {
                    acc[d] = v[j * dv + d].to_f32().mul_add(pj, acc[d]);
                }
            }
        }

        /// The soft cap ([`super::cap_score`], the reference's `tanhf` per element) on each
        /// lane of `x`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn cap_lanes(x: $v, cap: Option<f32>) -> $v {
            let mut l = [0.0f32; $w];
            // SAFETY: `$w` floats.
            unsafe {
                $st(l.as_mut_ptr(), x);
                l.iter_mut().for_each(|v| *v = super::cap_score(cap, *v));
                $ld(l.as_ptr())
            }
        }

        /// [`super::expf_approx`]'s range reduction and polynomial on each lane: `n`, the
        /// whole number nearest `x·log2(e)`, and `j`, the polynomial of what is left; `$exp`
        /// scales `j` by `2ⁿ`.
        #[target_feature(enable = $feat)]
        #[inline]
        fn exp_poly(x: $v) -> ($v, $v) {
            let c = |b: u32| $set1(f32::from_bits(b));
            let r = c(0x4b40_0000);
            let z = $fma(x, c(0x3fb8_aa3b), r);
            let n = $sub(z, r);
            let b = $fnmadd(n, c(0x35bf_be8e), $fnmadd(n, c(0x3f31_7200), x));
            let u = $mul(b, b);
            let j = $fma(
                $fma(
                    $fma(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                    u,
                    $fma(c(0x3e2a_af33), b, c(0x3eff_fedb)),
                ),
                u,
                $fma(c(0x3f7f_fff6), b, $set1(1.0)),
            );
            (n, j)
        }
    };
}
