//! A session's attention: the keys and values of a step into the cache (unless the RoPE
//! stored them), then the attention kernels for its rows: decode split over the keys and
//! merged, prompt rows of long passes in tiles, the others one block per row and head
//! (kernels/attention.cu).

use super::{Arg, Buf, CudaKv, CudaSession};
use crate::backend::SeqBatch;
use crate::cache::KvType;
use crate::kernels::attention::TILE_Q;
use crate::model::config::ModelConfig;

/// The prompt attention kernel for `rows` rows and its grid: 64 query vectors per block
/// (`attend_tile_*`), or 32 or 16 where 64 would make fewer than 256 blocks (models with few
/// kv heads: more blocks, each reading its keys for fewer queries). `KILN_CUDA_TILE_Q` (64, 32
/// or 16, read once) sets it.
fn tile_kernel(c: &ModelConfig, rows: usize, q8: bool) -> (&'static str, usize) {
    let group = c.n_heads / c.n_kv_heads;
    let blocks = |per: usize| (rows * group).div_ceil(per) * c.n_kv_heads;
    let per = crate::tuning::get().cuda_tile_q.unwrap_or_else(|| {
        [64, 32, 16]
            .into_iter()
            .find(|&p| blocks(p) >= 256)
            .unwrap_or(16)
    });
    let name = match (per, q8) {
        (16, false) => "attend_tile16_f16",
        (16, true) => "attend_tile16_q8_0",
        (32, false) => "attend_tile32_f16",
        (32, true) => "attend_tile32_q8_0",
        (_, false) => "attend_tile_f16",
        (_, true) => "attend_tile_q8_0",
    };
    (name, blocks(per))
}

/// Whether a sequence's pass of `n_tokens` attends in tiles (its rows' mode 3), with tiles
/// on (`CudaSession::tile`).
pub(super) fn tiles(tile: bool, n_tokens: usize) -> bool {
    tile && n_tokens >= TILE_Q
}

impl CudaSession {
    /// Whether a sequence's pass of `n_tokens` attends in tiles (its rows' mode 3).
    pub(super) fn tiled(&self, n_tokens: usize) -> bool {
        tiles(self.tile, n_tokens)
    }

    /// Attention of a step's rows of layer `layer` (`window` 0: none) into `Attn`.
    pub(super) fn attention(
        &mut self,
        c: &ModelConfig,
        layer: usize,
        window: usize,
        seqs: &[SeqBatch<'_, CudaKv>],
        rows: usize,
    ) {
        let decode = super::decode_rows(seqs);
        self.xq_holds = None;
        let at = self.layout.kv[layer];
        let (ctx, ring) = (self.sizes.n_ctx as i32, at.rows as i32);
        // The caches, the rows' positions and sequences, the slot strides and the kv heads'
        // shape: both kernels'.
        let (kc, vc) = self.kv_at(layer);
        let (kc, vc) = (Arg::P(kc), Arg::P(vc));
        let (pos, seq) = (
            Arg::P(self.at(self.layout.pos)),
            Arg::P(self.at(self.layout.seq)),
        );
        let (sk, sv) = (
            Arg::L(at.slot_stride.0 as i64),
            Arg::L(at.slot_stride.1 as i64),
        );
        let [n_kv_heads, hdk, hdv] =
            [c.n_kv_heads, c.head_dim_k, c.head_dim_v].map(|d| Arg::I(d as i32));
        let store = [
            Arg::P(self.buf(Buf::K)),
            Arg::P(self.buf(Buf::V)),
            kc,
            vc,
            pos,
            seq,
            sk,
            sv,
            n_kv_heads,
            hdk,
            hdv,
            Arg::I(ring),
        ];
        let q8 = self.layout.kv_type == KvType::Q8_0;
        // (Unless the RoPE stored this layer's keys and values.)
        if self.kv_stored.take() != Some(layer) {
            let store_kernel = if q8 { "kv_store_q8_0" } else { "kv_store_f16" };
            self.go(store_kernel, rows as u32, 256, &store);
        }
        // A soft cap divides the scale and caps the scaled scores (`cap` 0: none), as the
        // CPU's `ScoreScale` does.
        let (scale, cap) = match c.attn_softcap {
            Some(cap) => (c.attn_scale / cap, cap),
            None => (c.attn_scale, 0.0),
        };
        let attend = [
            Arg::P(self.buf(Buf::Q)),
            kc,
            vc,
            pos,
            seq,
            sk,
            sv,
            Arg::P(self.buf(Buf::Attn)),
            Arg::I(c.n_heads as i32),
            n_kv_heads,
            hdk,
            hdv,
            Arg::I(ctx),
            Arg::I(ring),
            Arg::F(scale),
            Arg::I(window as i32),
            Arg::P(self.at(self.layout.mode)),
            Arg::F(cap),
            // (gpt-oss's sinks, one logit per query head; 0: none.)
            Arg::P(self.w.sinks(layer)),
        ];
        let block = c.head_dim_v.next_multiple_of(32).clamp(128, 1024) as u32;
        match self.layout.split {
            // Decode: the keys split over many blocks, merged by the last of them.
            Some(sp) if decode && rows <= sp.rows => {
                let (part, counts) = (self.at(sp.part), self.at(sp.counts));
                // The row kernel's arguments with `part` and `counts` after `out`, then the
                // split's.
                let split: [Arg; 23] = std::array::from_fn(|i| match i {
                    0..=7 => attend[i],
                    8 => Arg::P(part),
                    9 => Arg::P(counts),
                    10..=17 => attend[i - 2],
                    18 => Arg::I(sp.n_split as i32),
                    19 => Arg::I(sp.chunk as i32),
                    20 => Arg::I(self.mirror as i32),
                    _ => attend[i - 4],
                });
                let grid = (rows * c.n_heads * sp.n_split) as u32;
                let name = if q8 {
                    "attend_split_q8_0"
                } else {
                    "attend_split_f16"
                };
                self.go(name, grid, block, &split);
            }
            _ => {
                // Rows of tiled passes (mode 3) in tiles, the others (if any) one block per
                // row and head.
                // (A pass computed as decode steps is not tiled: its rows' mode is a
                // decode row's.)
                let tiled = |sq: &SeqBatch<'_, CudaKv>| !sq.alone && self.tiled(sq.n_tokens);
                let (any, all) = (seqs.iter().any(tiled), seqs.iter().all(tiled));
                if any {
                    // The row kernel's arguments with the row count after `out` and
                    // without `ctx` (a tile's keys are its rows' own).
                    let tile: [Arg; 19] = std::array::from_fn(|i| match i {
                        0..=7 => attend[i],
                        8 => Arg::I(rows as i32),
                        9..=12 => attend[i - 1],
                        _ => attend[i],
                    });
                    let (name, tiles) = tile_kernel(c, rows, q8);
                    self.go(name, tiles as u32, 256, &tile);
                }
                if !all {
                    let name = if q8 { "attend_q8_0" } else { "attend_f16" };
                    self.go(name, (rows * c.n_heads) as u32, block, &attend)
                }
            }
        }
    }
}
