//! Encoders: BERT, Nomic-BERT and Jina-BERT-v2 (embedding models). Token, token-type (row 0,
//! "sentence A", as the reference hard-codes) and, for BERT, learned absolute position embeddings, then
//! their LayerNorm (`token_embd_norm`); post-norm blocks: `x = LN(x + attn(x))` with the
//! `attn_output_norm`, then `x = LN(x + ffn(x))` with the `layer_output_norm`; q, k, v fused
//! (`attn_qkv`) where the file has them so; biases where the file has them. BERT's FFN is
//! GELU, Nomic-BERT's SwiGLU with NeoX RoPE instead of learned positions. Jina-BERT-v2 has
//! no positions in its inputs: ALiBi biases its attention scores (a maximum bias of 8, as the
//! reference hard-codes), and its FFN is GEGLU where `ffn_up` holds the gate and up halves
//! (the converter's layout), GELU-gated with a separate `ffn_gate`, or plain GELU; its
//! optional q/k LayerNorms and second attention norm are refused by name. Attention is
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

/// Jina-BERT-v2: no positions (ALiBi), GELU; gated or not as its file holds the FFN
/// ([`configure`]).
pub const JINA_BERT_V2: ArchTraits = BERT;

/// ALiBi's maximum bias in Jina-BERT-v2 (the reference sets it in code; no file key).
pub const JINA_ALIBI_MAX_BIAS: f32 = 8.0;

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
        Arch::JinaBertV2 => jina_bert_v2(f, cfg)?,
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

/// Jina-BERT-v2's traits as its file holds them: ALiBi attention (no position embeddings);
/// an FFN whose `ffn_up` has `2·ffn_dim` rows is GEGLU over its halves (gate first, as the
/// reference's `ggml_geglu` splits it), one with an `ffn_gate` is GELU-gated, else plain
/// GELU. The q/k LayerNorms (`attn_q_norm`, `attn_k_norm`, over the whole q and k rows) and
/// the second attention norm (`attn_norm_2`) some variants carry are refused by name.
fn jina_bert_v2(f: &GgufFile, cfg: &mut ModelConfig) -> Result<ArchTraits, ModelError> {
    for i in 0..cfg.n_layers {
        for (name, what) in [
            (names::ATTN_Q_NORM, "q LayerNorm"),
            (names::ATTN_K_NORM, "k LayerNorm"),
            ("attn_norm_2", "second attention norm"),
        ] {
            let t = names::blk(i, &format!("{name}.weight"));
            if f.tensor_info(&t).is_some() {
                return Err(ModelError::BadConfig(format!(
                    "tensor '{t}': jina-bert-v2's {what} is not supported"
                )));
            }
        }
    }
    cfg.alibi = Some(JINA_ALIBI_MAX_BIAS);
    let mut t = JINA_BERT_V2;
    let up_rows = f
        .tensor_info(&names::blk(0, names::FFN_UP))
        .and_then(|u| u.shape.get(1).copied());
    if f.tensor_info(&names::blk(0, names::FFN_GATE)).is_some() {
        t.gated_ffn = true;
    } else if up_rows == Some(2 * cfg.ffn_dim) {
        t.gated_ffn = true;
        t.fused_gate_up = true;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use crate::fixtures::{random_f32, RECIPES};
    use crate::gguf::{GgufFile, GgufWriter};
    use crate::model::{Model, ModelError};

    /// The random model of recipe `name`, edited by `edit`.
    fn load(name: &str, edit: &dyn Fn(&mut GgufWriter)) -> Result<Model, ModelError> {
        let (_, recipe) = RECIPES.iter().find(|(n, _)| *n == name).expect("recipe");
        let f = GgufFile::from_bytes(random_f32(recipe).to_bytes()).expect("parse");
        let mut w = GgufWriter::from_file(&f);
        edit(&mut w);
        Model::from_gguf(GgufFile::from_bytes(w.to_bytes()).expect("parse"))
    }

    /// Jina-BERT-v2: ALiBi (maximum bias 8) and no position embeddings; its FFN as the file
    /// holds it: GEGLU halves of `ffn_up`, a separate `ffn_gate`, or plain GELU. BERT has
    /// positions and no ALiBi.
    #[test]
    fn jina_bert_v2_reads_alibi_and_its_ffn_layout() {
        let m = load("jina-bert-v2", &|_| {}).expect("load");
        assert_eq!(m.config.alibi, Some(super::JINA_ALIBI_MAX_BIAS));
        assert!(m.weights.pos_embd.is_none() && !m.config.causal);
        assert!(m.traits.gated_ffn && m.traits.fused_gate_up);
        let (gate, up) = (&m.weights.layers[0].ffn_gate, &m.weights.layers[0].ffn_up);
        assert_eq!(gate.as_ref().map(|g| g.out_dim), Some(m.config.ffn_dim));
        assert_eq!(up.as_ref().map(|u| u.out_dim), Some(m.config.ffn_dim));
        let (d, ff) = (m.config.dim, m.config.ffn_dim);
        let layers = m.config.n_layers;
        // A separate gate: GELU-gated.
        let split = load("jina-bert-v2", &|w| {
            for l in 0..layers {
                for t in ["ffn_gate", "ffn_up"] {
                    let name = format!("blk.{l}.{t}.weight");
                    w.remove_tensor(&name);
                    w.add_f32_tensor(name, &[d, ff], &vec![0.01; d * ff]);
                }
            }
        })
        .expect("load");
        assert!(split.traits.gated_ffn && !split.traits.fused_gate_up);
        // An `ffn_up` of `ffn_dim` rows alone: plain GELU.
        let plain = load("jina-bert-v2", &|w| {
            for l in 0..layers {
                let name = format!("blk.{l}.ffn_up.weight");
                w.remove_tensor(&name);
                w.add_f32_tensor(name, &[d, ff], &vec![0.01; d * ff]);
            }
        })
        .expect("load");
        assert!(!plain.traits.gated_ffn && plain.weights.layers[0].ffn_gate.is_none());
        let bert = load("bert", &|_| {}).expect("load");
        assert!(bert.config.alibi.is_none() && bert.weights.pos_embd.is_some());
    }

    /// What kiln does not compute of a Jina-BERT-v2 file is refused, naming the tensor.
    #[test]
    fn jina_bert_v2_refuses_qk_norms_and_second_attention_norm() {
        for t in ["attn_q_norm", "attn_k_norm", "attn_norm_2"] {
            let name = format!("blk.2.{t}.weight");
            let e = load("jina-bert-v2", &|w| {
                w.add_f32_tensor(name.clone(), &[256], &[1.0; 256]);
            })
            .err()
            .expect("refused")
            .to_string();
            assert!(e.contains(&name) && e.contains("not supported"), "{t}: {e}");
        }
    }
}
