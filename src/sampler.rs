//! Logits → next token.
//!
//! The pipeline follows llama.cpp's common sampler chain, in this order:
//!
//! 0. **logit bias** (OpenAI's and llama.cpp's `logit_bias`): each listed token's bias added
//!    to its logit (`-inf` bans it; a token listed twice gets both), before anything else;
//! 1. **penalties** over the last `repeat_last_n` tokens of the history: the repeat penalty
//!    (CTRL-style: positive logits are divided by it, negative ones multiplied), then the
//!    OpenAI-style frequency (`count × f`) and presence (`f` once) penalties, subtracted;
//! 2. **top-k**: keep the `k` largest logits, found by partial selection (not a full sort);
//! 3. **top-p** (nucleus): keep the smallest prefix of the sorted candidates whose probability
//!    mass reaches `p`;
//! 4. **min-p**: keep the candidates whose probability is at least `min_p ×` the top one
//!    (done on logits: `logit >= max + ln(min_p)`);
//! 5. **temperature**: scale the logits by `1/t`, relative to the best one (`(l - max) / t`, never
//!    above 0, so no positive `t` overflows: as `t` shrinks toward 0 every token below the best
//!    gets probability 0 and the draw becomes uniform among the tokens tied at the best logit,
//!    the limit of `softmax(l / t)`); `t <= 0` means greedy (argmax after the bias and penalties);
//! 6. **softmax** and a draw with [`Rng`], our own small xoshiro256** generator, so a seed gives
//!    the same tokens on every platform and every kiln version.
//!
//! Every filter keeps at least one candidate (llama.cpp's `min_keep = 1`), so `top_p = 0` and
//! `min_p = 1` reduce to "keep the best token".
//!
//! Bad logits are defined, not undefined: a NaN logit is treated as `-inf` (never drawn); if some
//! logits are `+inf` the draw is uniform over them; if every logit is `-inf` or NaN (an all-masked
//! row) the draw is uniform over the whole row (see [`softmax_in_place`]).
//!
//! [`Sampler`] allocates all its buffers in [`Sampler::new`]; [`Sampler::sample`] never touches
//! the heap (tests/sampler_alloc.rs checks this with a counting global allocator).

use std::cmp::Ordering;

/// How to pick the next token. The "off" value of each knob is noted beside it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplerConfig {
    /// Divides the logits before the draw. `<= 0` = greedy (argmax after bias and penalties).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens. `0` = off.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p`. `1` = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p ×` the most likely one. `0` = off.
    pub min_p: f32,
    /// CTRL repeat penalty on tokens seen in the last `repeat_last_n`. `1` = off.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalties look at. `0` = penalties off.
    pub repeat_last_n: usize,
    /// Subtracted from a token's logit once per occurrence in the window. `0` = off.
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit if it occurs in the window at all. `0` = off.
    pub presence_penalty: f32,
    /// Seed of the draw. [`SamplerConfig::default`] picks a fresh random one; set it for
    /// reproducible output.
    pub seed: u64,
    /// `(token id, bias)`: added to the token's logit before every other stage (`-inf` bans
    /// it); ids outside the logits row are skipped. Empty = off.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty
    /// 1.0 (off) over the last 64 tokens, no frequency/presence penalty.
    ///
    /// The seed is **random** (different on every call, like llama.cpp's `-s -1`); set
    /// `seed` explicitly to reproduce a run.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: random_seed(),
            logit_bias: Vec::new(),
        }
    }
}

/// A knob of [`SamplerConfig`] outside its meaningful range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerConfigError {
    #[error("sampler {name} = {value} is out of range (expected {expected})")]
    OutOfRange {
        name: &'static str,
        value: f32,
        expected: &'static str,
    },
}

impl SamplerConfig {
    /// The greedy configuration: argmax, no penalties. Deterministic, so the seed is fixed.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            seed: 0,
            ..SamplerConfig::default()
        }
    }

    /// Check every knob is in range. Call this on configurations that come from users (CLI
    /// flags, server requests) to report a typed error; [`Sampler::new`] itself never fails
    /// and instead clamps out-of-range values (see [`SamplerConfig::sanitized`]).
    pub fn validate(&self) -> Result<(), SamplerConfigError> {
        let check = |name, value: f32, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(SamplerConfigError::OutOfRange {
                    name,
                    value,
                    expected,
                })
            }
        };
        let t = self.temperature;
        check(
            "temperature",
            t,
            t.is_finite(),
            "a finite number; <= 0 for greedy",
        )?;
        let p = self.top_p;
        check("top_p", p, (0.0..=1.0).contains(&p), "0..=1")?;
        let m = self.min_p;
        check("min_p", m, (0.0..=1.0).contains(&m), "0..=1")?;
        let r = self.repeat_penalty;
        check(
            "repeat_penalty",
            r,
            r.is_finite() && r > 0.0,
            "a finite number > 0",
        )?;
        let f = self.frequency_penalty;
        check("frequency_penalty", f, f.is_finite(), "a finite number")?;
        let pr = self.presence_penalty;
        check("presence_penalty", pr, pr.is_finite(), "a finite number")?;
        for &(_, b) in &self.logit_bias {
            let ok = b.is_finite() || b == f32::NEG_INFINITY;
            check("logit_bias", b, ok, "a finite number, or -inf to ban")?;
        }
        Ok(())
    }

    /// The same configuration with every out-of-range value replaced by the nearest meaningful
    /// one: NaN knobs become "off" (NaN temperature becomes greedy), probabilities are clamped to
    /// `0..=1`, an infinite temperature becomes `f32::MAX`.
    pub fn sanitized(&self) -> Self {
        let finite_or = |x: f32, off: f32| if x.is_finite() { x } else { off };
        let temperature = if self.temperature.is_nan() {
            0.0
        } else {
            self.temperature.clamp(f32::MIN, f32::MAX)
        };
        SamplerConfig {
            temperature,
            top_p: if self.top_p.is_nan() {
                1.0
            } else {
                self.top_p.clamp(0.0, 1.0)
            },
            min_p: if self.min_p.is_nan() {
                0.0
            } else {
                self.min_p.clamp(0.0, 1.0)
            },
            repeat_penalty: if self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0 {
                self.repeat_penalty
            } else {
                1.0
            },
            frequency_penalty: finite_or(self.frequency_penalty, 0.0),
            presence_penalty: finite_or(self.presence_penalty, 0.0),
            // (NaN: no bias; +inf: the largest finite one.)
            logit_bias: (self.logit_bias.iter())
                .filter(|b| !b.1.is_nan())
                .map(|&(id, b)| (id, b.min(f32::MAX)))
                .collect(),
            ..self.clone()
        }
    }

    /// Whether a stage changes the logits before top-k (a bias or a penalty): then every token
    /// is a candidate, and no shortcut over the raw logits applies.
    fn edits_logits(&self) -> bool {
        self.penalties_on() || !self.logit_bias.is_empty()
    }

    fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// A seed that differs between calls and processes (std's randomly keyed hasher, the clock and a
/// counter), for [`SamplerConfig::default`].
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Relaxed));
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

/// xoshiro256** (Blackman & Vigna), seeded through splitmix64. Small, fast, and fully specified,
/// so a seed means the same stream everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// Expand a 64-bit seed into the 256-bit state with splitmix64 (never all zero).
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Logits at the edges of the comparisons (NaN, ±0, ±∞ and two ordinary values), for tests
/// of the one-pass scans.
#[cfg(test)]
pub(crate) const SPECIAL_LOGITS: [f32; 7] = [
    f32::NAN,
    -0.0,
    0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1.0,
    -1.0,
];

/// Index of the largest logit; the first one wins ties. NaN entries are skipped; an empty slice
/// or one with no comparable value (all NaN) gives 0. The one rule of every greedy pick: the
/// sampler's ([`Sampler::sample`] at temperature 0) and the executors'
/// ([`crate::backend::exec::Executor::argmax`]) alike, so that a greedy step gives the same
/// token wherever its row is picked.
#[must_use]
pub fn argmax(logits: &[f32]) -> u32 {
    first_max(logits, greedy_key) as u32
}

/// The order of a greedy pick as integers: NaN below everything (−∞ included), −0 as +0 (so
/// that the two tie and the first wins), else [`f32::total_cmp`]'s order.
#[inline(always)]
fn greedy_key(v: f32) -> i32 {
    let k = order_key(v + 0.0);
    if v.is_nan() {
        i32::MIN
    } else {
        k
    }
}

/// `f32::total_cmp`'s order as integers: `order_key(a) < order_key(b)` exactly when `a`
/// comes before `b` in it.
#[inline(always)]
fn order_key(v: f32) -> i32 {
    let b = v.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// The first index of the largest `key(logit)` (0 for an empty row), in one pass the compiler
/// vectorizes: 16 lanes each keep their largest key and the chunk it came first in. A
/// vocabulary of 262,144 logits took about 90 µs in the two passes this replaced (a Zen 5).
fn first_max(logits: &[f32], key: impl Fn(f32) -> i32) -> usize {
    const LANES: usize = 16;
    let mut most = [i32::MIN; LANES];
    let mut chunk_of = [0u32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, ch) in chunks.enumerate() {
        let c = c as u32;
        for l in 0..LANES {
            let k = key(ch[l]);
            let rise = k > most[l];
            most[l] = if rise { k } else { most[l] };
            chunk_of[l] = if rise { c } else { chunk_of[l] };
        }
    }
    // A lane that never rose keeps chunk 0 and `i32::MIN`: it can win only as index 0's lane,
    // with every key `i32::MIN` (or an empty row), and index 0 is then the answer.
    let mut best = (i32::MIN, 0usize);
    for (l, (&m, &at)) in most.iter().zip(&chunk_of).enumerate() {
        let i = at as usize * LANES + l;
        if m > best.0 || (m == best.0 && i < best.1) {
            best = (m, i);
        }
    }
    let base = logits.len() - tail.len();
    for (j, &v) in tail.iter().enumerate() {
        if key(v) > best.0 {
            best = (key(v), base + j);
        }
    }
    best.1
}

/// Replace logits by probabilities in place, numerically stable (max subtracted, sum in f64).
///
/// Defined on every input, never producing NaN:
/// - NaN entries count as `-inf` (probability 0);
/// - if any entry is `+inf`, the `+inf` entries share the mass uniformly;
/// - if no entry is above `-inf` (an all-masked row), the result is uniform over the row;
/// - an empty slice is left empty.
pub fn softmax_in_place(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        let u = 1.0 / x.len() as f32;
        x.fill(u);
        return;
    }
    if max == f32::INFINITY {
        let n = x.iter().filter(|&&v| v == f32::INFINITY).count();
        let u = 1.0 / n as f32;
        for v in x.iter_mut() {
            *v = if *v == f32::INFINITY { u } else { 0.0 };
        }
        return;
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        // NaN - max is NaN and exp(NaN) is NaN: map NaN to 0 explicitly.
        *v = if v.is_nan() { 0.0 } else { (*v - max).exp() };
        sum += *v as f64;
    }
    // sum >= 1 because the max entry contributes exp(0) = 1.
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `ln p(token)` under `softmax(logits)`, in f64, for perplexity. Stable (max subtracted, the sum
/// accumulated in f64). Follows [`softmax_in_place`]'s conventions: a NaN logit for `token` gives
/// `-inf`; an all-masked row gives `-ln(n)`; with `+inf` logits present, the `+inf` tokens get
/// `-ln(count)` and all others `-inf`.
///
/// # Panics
/// If `token` is out of range (a caller bug: token ids come from the same vocabulary).
#[must_use]
pub fn log_softmax(logits: &[f32], token: u32) -> f64 {
    let t = token as usize;
    assert!(
        t < logits.len(),
        "log_softmax: token {token} outside a vocabulary of {}",
        logits.len()
    );
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let x = logits[t];
    if max == f32::NEG_INFINITY {
        return -(logits.len() as f64).ln();
    }
    if x.is_nan() {
        return f64::NEG_INFINITY;
    }
    if max == f32::INFINITY {
        if x != f32::INFINITY {
            return f64::NEG_INFINITY;
        }
        let n = logits.iter().filter(|&&v| v == f32::INFINITY).count();
        return -(n as f64).ln();
    }
    let max = max as f64;
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v as f64 - max).exp())
        .sum();
    (x as f64 - max) - sum.ln()
}

/// Descending by logit, then ascending by id: a total order, so even the unstable sort and
/// selection give one well-defined result (ties go to the lower id, as in [`argmax`]).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// How many of the best candidates the nucleus (top-p) step first tries to sort, before
/// falling back to sorting them all: the mass of a typical LLM distribution is concentrated in
/// far fewer tokens, so a full sort of 50k–260k entries is rarely needed.
const TOP_P_PROBE: usize = 256;

/// The sampling pipeline with its buffers. One per generation stream.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    /// `[vocab]` (token id, logit) pairs still in the running; shrinks as filters apply.
    candidates: Vec<(u32, f32)>,
    /// `[vocab]` probabilities of the surviving candidates, parallel to `candidates`.
    probs: Vec<f32>,
    /// `[vocab]` occurrences of each token in the penalty window; all zero between calls.
    counts: Vec<u32>,
}

impl Sampler {
    /// Build a sampler for a vocabulary of `vocab_size` tokens. Allocates every buffer now.
    /// Out-of-range config values are clamped ([`SamplerConfig::sanitized`]); use
    /// [`SamplerConfig::validate`] first to reject them instead.
    pub fn new(cfg: SamplerConfig, vocab_size: usize) -> Sampler {
        let cfg = cfg.sanitized();
        Sampler {
            rng: Rng::new(cfg.seed),
            cfg,
            candidates: Vec::with_capacity(vocab_size),
            probs: Vec::with_capacity(vocab_size),
            counts: vec![0; vocab_size],
        }
    }

    /// The (sanitized) configuration in use.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Whether every draw is the plain argmax of the logits (greedy, no bias, no penalties):
    /// then a GPU session can pick the token on the device.
    pub fn is_argmax(&self) -> bool {
        self.cfg.temperature <= 0.0 && !self.cfg.edits_logits()
    }

    /// Restart the random stream from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.cfg.seed = seed;
        self.rng = Rng::new(seed);
    }

    /// Pick the next token from `logits` (`[vocab]`), given the tokens so far (`history`, oldest
    /// first; only its last `repeat_last_n` entries matter, ids outside the vocabulary are
    /// ignored). Allocation-free as long as `logits.len() <= vocab_size` given to `new`
    /// (longer rows grow the buffers once).
    ///
    /// # Panics
    /// If `logits` is empty (there is no token to return).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "Sampler::sample: empty logits row");
        let n = logits.len();
        if self.counts.len() < n {
            self.counts.resize(n, 0);
        }

        let k = self.cfg.top_k;
        let edits = self.cfg.edits_logits();
        if !edits && self.cfg.temperature <= 0.0 {
            return argmax(logits);
        }
        if !edits && self.cfg.temperature > 0.0 && k > 0 && k < n {
            // Only the k best can be drawn: find them in one pass over the logits instead of
            // making a candidate of every token and selecting among them (Gemma-3's 262,144
            // tokens: 40 µs against 535 on a Zen 5).
            top_k_of(logits, k, &mut self.candidates);
            return self.draw_from_candidates(true);
        }

        // Candidates in id order (so candidates[id] is token id until the first reorder),
        // NaN replaced by -inf so the ordering and the filters below are total.
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, if l.is_nan() { f32::NEG_INFINITY } else { l })),
        );

        apply_bias(&mut self.candidates, &self.cfg.logit_bias);
        if self.cfg.penalties_on() {
            let start = history.len().saturating_sub(self.cfg.repeat_last_n);
            apply_penalties(
                &mut self.candidates,
                &mut self.counts,
                &history[start..],
                &self.cfg,
            );
        }

        if self.cfg.temperature <= 0.0 {
            // (never NaN: `new` sanitized it)
            // Greedy. top-k / top-p / min-p all keep the maximum, so they cannot change it.
            return best_candidate(&self.candidates);
        }

        if k > 0 && k < n {
            top_k(&mut self.candidates, k);
            self.candidates.sort_unstable_by(by_logit_desc);
        }
        self.draw_from_candidates(k > 0 && k < n)
    }

    /// The steps after top-k (`sorted`: the candidates are best first): top-p, min-p, the
    /// temperature, and the draw.
    fn draw_from_candidates(&mut self, sorted: bool) -> u32 {
        let mut sorted = sorted;
        if self.cfg.top_p < 1.0 {
            top_p(&mut self.candidates, self.cfg.top_p);
            sorted = true;
        }
        if self.cfg.min_p > 0.0 {
            min_p(&mut self.candidates, self.cfg.min_p, sorted);
        }

        // `l / t` overflows to +inf for a tiny `t` (7.5 / 1e-38), and a softmax over tied
        // infinities would draw among every overflowed token. `(l - max) / t` is at most 0 for
        // any positive `t`, the same distribution wherever `l / t` is finite. With a +inf logit
        // (or none above -inf) the logits go as they are: softmax shares the mass among the +inf
        // ones (or uniformly).
        let t = self.cfg.temperature;
        let max = self
            .candidates
            .iter()
            .fold(f32::NEG_INFINITY, |m, &(_, l)| m.max(l));
        self.probs.clear();
        if max.is_finite() {
            self.probs
                .extend(self.candidates.iter().map(|&(_, l)| (l - max) / t));
        } else {
            self.probs.extend(self.candidates.iter().map(|&(_, l)| l));
        }
        softmax_in_place(&mut self.probs);
        let i = draw(&self.probs, self.rng.next_f64());
        self.candidates[i].0
    }
}

/// Add each `(id, bias)` to candidate `id`'s logit (`candidates` still in id order); ids
/// outside the row are skipped. `-inf + inf` (a masked token given an infinite bias) stays
/// masked.
fn apply_bias(candidates: &mut [(u32, f32)], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(c) = candidates.get_mut(id as usize) {
            let l = c.1 + b;
            c.1 = if l.is_nan() { f32::NEG_INFINITY } else { l };
        }
    }
}

/// Apply the repeat, frequency and presence penalties for the tokens in `window`.
/// `candidates` must still be in id order; `counts` is all zero on entry and on exit.
fn apply_penalties(
    candidates: &mut [(u32, f32)],
    counts: &mut [u32],
    window: &[u32],
    cfg: &SamplerConfig,
) {
    let n = candidates.len();
    for &id in window {
        if (id as usize) < n {
            counts[id as usize] += 1;
        }
    }
    // Second pass: each distinct id is penalized once (its count is reset after use).
    for &id in window {
        let id = id as usize;
        if id >= n || counts[id] == 0 {
            continue;
        }
        let c = counts[id];
        counts[id] = 0;
        let l = &mut candidates[id].1;
        if *l <= 0.0 {
            *l *= cfg.repeat_penalty;
        } else {
            *l /= cfg.repeat_penalty;
        }
        *l -= c as f32 * cfg.frequency_penalty + cfg.presence_penalty;
        // inf - inf (an infinite logit meeting an overflowing penalty): treat as masked.
        if l.is_nan() {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// The id of the best candidate by [`argmax`]'s rule (the first of the largest, ±0 equal; the
/// candidates hold no NaN).
fn best_candidate(candidates: &[(u32, f32)]) -> u32 {
    let mut best = candidates[0];
    for &c in &candidates[1..] {
        if greedy_key(c.1) > greedy_key(best.1) {
            best = c;
        }
    }
    best.0
}

/// The `k` best of `logits` (`0 < k < logits.len()`; NaN counts as −∞) by [`by_logit_desc`],
/// best first, in `out`: the candidates [`top_k`] keeps of the whole vocabulary, in one pass.
/// A chunk of logits is looked at only when one of them reaches `floor`, the k-th best value
/// of the candidates kept so far (a value below it has k better ones, so it is not among the
/// k best); the kept candidates are cut back to the k best whenever they reach `4k` (at
/// least 1,024).
fn top_k_of(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    const CHUNK: usize = 16;
    let cap = (4 * k).max(1024);
    out.clear();
    let mut floor = f32::NEG_INFINITY;
    for (c, chunk) in logits.chunks(CHUNK).enumerate() {
        // (an `|` of comparisons, which vectorizes; NaN compares false, and counts as −∞,
        // which only a floor of −∞ admits)
        let reaches = chunk.iter().fold(false, |a, &v| a | (v >= floor));
        if !reaches && floor != f32::NEG_INFINITY {
            continue;
        }
        for (i, &v) in chunk.iter().enumerate() {
            let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
            if v >= floor {
                out.push(((c * CHUNK + i) as u32, v));
            }
        }
        if out.len() >= cap {
            top_k(out, k);
            floor = out.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
        }
    }
    top_k(out, k);
    out.sort_unstable_by(by_logit_desc);
}

/// Keep the `k` best candidates (unordered), by partial selection: O(n), no sort.
fn top_k(candidates: &mut Vec<(u32, f32)>, k: usize) {
    if k >= candidates.len() {
        return;
    }
    candidates.select_nth_unstable_by(k - 1, by_logit_desc);
    candidates.truncate(k);
}

/// Keep the smallest prefix of the candidates, sorted best first, whose probability mass is at
/// least `p` (always at least one). Leaves the survivors sorted.
fn top_p(candidates: &mut Vec<(u32, f32)>, p: f32) {
    // The normalizer over all current candidates (no NaN here; handle +inf like softmax).
    let max = candidates
        .iter()
        .map(|c| c.1)
        .fold(f32::NEG_INFINITY, f32::max);
    let weight = |l: f32| -> f64 {
        if max == f32::NEG_INFINITY {
            1.0 // all masked: uniform
        } else if max == f32::INFINITY {
            if l == f32::INFINITY {
                1.0
            } else {
                0.0
            }
        } else {
            ((l - max) as f64).exp()
        }
    };
    let total: f64 = candidates.iter().map(|c| weight(c.1)).sum();
    let target = p as f64 * total;

    // Sort just the best TOP_P_PROBE first; sort everything only if they do not reach p.
    let n = candidates.len();
    let mut sorted_len = n;
    if n > TOP_P_PROBE {
        candidates.select_nth_unstable_by(TOP_P_PROBE - 1, by_logit_desc);
        candidates[..TOP_P_PROBE].sort_unstable_by(by_logit_desc);
        sorted_len = TOP_P_PROBE;
        let probe_mass: f64 = candidates[..TOP_P_PROBE].iter().map(|c| weight(c.1)).sum();
        if probe_mass < target {
            candidates.sort_unstable_by(by_logit_desc);
            sorted_len = n;
        }
    } else {
        candidates.sort_unstable_by(by_logit_desc);
    }

    let mut cum = 0.0f64;
    let mut keep = sorted_len;
    for (i, c) in candidates[..sorted_len].iter().enumerate() {
        cum += weight(c.1);
        if cum >= target {
            keep = i + 1;
            break;
        }
    }
    candidates.truncate(keep.max(1));
}

/// Keep the candidates with `logit >= max + ln(p)` (probability at least `p ×` the best's);
/// always at least the best. `sorted`: the candidates are sorted best first.
fn min_p(candidates: &mut Vec<(u32, f32)>, p: f32, sorted: bool) {
    let max = if sorted {
        candidates[0].1
    } else {
        candidates
            .iter()
            .map(|c| c.1)
            .fold(f32::NEG_INFINITY, f32::max)
    };
    let threshold = max + p.ln();
    // threshold <= max always (ln p <= 0, and inf/-inf stay themselves), so the max survives.
    candidates.retain(|c| c.1 >= threshold);
}

/// Inverse-CDF draw of an index from `probs` (summing to ~1) with `r` uniform in `[0, 1)`.
/// Rounding may leave the cumulative sum short of `r`; then the last index with non-zero
/// probability is taken.
fn draw(probs: &[f32], r: f64) -> usize {
    let total: f64 = probs.iter().map(|&p| p as f64).sum();
    let r = r * total;
    let mut cum = 0.0f64;
    let mut last_nonzero = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cum += p as f64;
            last_nonzero = i;
            if r < cum {
                return i;
            }
        }
    }
    last_nonzero
}

#[cfg(test)]
mod tests;
