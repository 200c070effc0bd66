//! Encoders: BERT and Nomic-BERT (embedding models). Token, token-type (row 0, "sentence A",
//! as the reference hard-codes) and, for BERT, learned absolute position embeddings, then
//! their LayerNorm (`token_embd_norm`); post-norm blocks: `x = LN(x + attn(x))` with the
//! `attn_output_norm`, then `x = LN(x + ffn(x))` with the `layer_output_norm`; q, k, v fused
//! (`attn_qkv`) where the file has them so; biases where the file has them. BERT's FFN is
//! GELU, Nomic-BERT's SwiGLU with NeoX RoPE instead of learned positions. Attention is
//! bidirectional (`{arch}.attention.causal = false`, as the converter writes it) over the
//! whole input; there is no final norm and no output head: the last block's output is what
//! the pooling reads.

use super::config::{Activation, Arch, ArchTraits, ModelConfig, NormKind, RopeKind};
use super::weights::names;
use super::ModelError;
use crate::gguf::GgufFile;

pub const BERT: ArchTraits = ArchTraits {
    norm: NormKind::Layer,
    act: Activation::GeluTanh,
    gated_ffn: false,
    rope: None,
    fused_qkv: false,
    qk_norm: false,
    input_norms: true,
    post_norms: false,
    scale_embeddings: false,
    fused_gate_up: false,
    longrope: false,
};

pub const NOMIC_BERT: ArchTraits = ArchTraits {
    act: Activation::Silu,
    gated_ffn: true,
    rope: Some(RopeKind::Neox),
    ..BERT
};

/// The metadata key of the token-type count (BERT's segment embeddings).
pub const TOKEN_TYPE_COUNT: &str = "tokenizer.ggml.token_type_count";

/// The traits of `arch` as this file stores it (fused q, k, v or not, as the reference reads
/// either), and the token-type count the reference requires of an encoder.
pub fn configure(
    f: &GgufFile,
    arch: Arch,
    cfg: &mut ModelConfig,
) -> Result<ArchTraits, ModelError> {
    let mut t = match arch {
        Arch::NomicBert => NOMIC_BERT,
        _ => BERT,
    };
    t.fused_qkv = f.tensor_info(&names::blk(0, names::ATTN_QKV)).is_some();
    let types = f.opt_u32(TOKEN_TYPE_COUNT)?.unwrap_or(0) as usize;
    if types == 0 {
        return Err(ModelError::BadConfig(format!(
            "an encoder needs token types: '{TOKEN_TYPE_COUNT}' is missing or 0"
        )));
    }
    cfg.token_types = types;
    // As the reference: causal unless the file says otherwise (the converter writes false).
    cfg.causal = f.opt_bool(&f.arch_key("attention.causal"))?.unwrap_or(true);
    Ok(t)
}
