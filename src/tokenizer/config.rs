//! Reading a tokenizer's metadata (`tokenizer.*` keys) out of a GGUF file.

use super::{SpecialIds, TokenizerConfig, TokenizerError};

/// Read the `tokenizer.*` keys of a GGUF file.
pub fn config_from_gguf(f: &crate::gguf::GgufFile) -> Result<TokenizerConfig, TokenizerError> {
    use crate::gguf::Array;
    let wrong = |key: &str, found: &Array, expected: &'static str| TokenizerError::WrongType {
        key: key.to_string(),
        found: found.type_name().to_string(),
        expected,
    };

    let model = f.get_str("tokenizer.ggml.model")?.to_string();
    let pre = f.opt_str("tokenizer.ggml.pre")?.map(str::to_string);

    let key = "tokenizer.ggml.tokens";
    let arr = f.get_array(key)?;
    let tokens = arr
        .as_strings()
        .ok_or_else(|| wrong(key, arr, "array[string]"))?
        .to_vec();

    let key = "tokenizer.ggml.scores";
    let scores = match f.opt_array(key)? {
        None => None,
        Some(Array::F32(v)) => Some(v.clone()),
        // llama.cpp also accepts integer scores.
        Some(Array::I32(v)) => Some(v.iter().map(|&x| x as f32).collect()),
        Some(other) => return Err(wrong(key, other, "array[f32] or array[i32]")),
    };

    let key = "tokenizer.ggml.token_type";
    let token_types = match f.opt_array(key)? {
        None => None,
        Some(a) => Some(
            a.as_i32s()
                .ok_or_else(|| wrong(key, a, "array[i32]"))?
                .to_vec(),
        ),
    };

    let key = "tokenizer.ggml.merges";
    let merges = match f.opt_array(key)? {
        None if model == "gpt2" || model == "gemma4" => {
            return Err(TokenizerError::MissingKey(key.to_string()))
        }
        None => Vec::new(),
        Some(a) => a
            .as_strings()
            .ok_or_else(|| wrong(key, a, "array[string]"))?
            .to_vec(),
    };

    // A special id stored with an unusable type is ignored (llama.cpp would refuse the file
    // for some of these keys, but an unusable pad or mask id should not stop a model).
    let id = |name: &str| -> Option<u32> {
        let key = format!("tokenizer.ggml.{name}");
        match f.opt_u32(&key) {
            Ok(v) => v,
            Err(e) => {
                log::warn!("ignoring {key}: {e}");
                None
            }
        }
    };
    let special = SpecialIds {
        bos: id("bos_token_id"),
        eos: id("eos_token_id"),
        eot: id("eot_token_id"),
        eom: id("eom_token_id"),
        unk: id("unknown_token_id"),
        sep: id("seperator_token_id"),
        pad: id("padding_token_id"),
        mask: id("mask_token_id"),
        fim_pre: id("prefix_token_id").or_else(|| id("fim_pre_token_id")),
        fim_suf: id("suffix_token_id").or_else(|| id("fim_suf_token_id")),
        fim_mid: id("middle_token_id").or_else(|| id("fim_mid_token_id")),
        fim_pad: id("fim_pad_token_id"),
        fim_rep: id("fim_rep_token_id"),
        fim_sep: id("fim_sep_token_id"),
    };

    Ok(TokenizerConfig {
        model,
        pre,
        tokens,
        scores,
        token_types,
        merges,
        special,
        add_bos: f.opt_bool("tokenizer.ggml.add_bos_token")?,
        add_eos: f.opt_bool("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: f.opt_bool("tokenizer.ggml.add_space_prefix")?,
        lowercase: f.opt_bool("tokenizer.ggml.normalizer.lowercase")?,
        strip_accents: f.opt_bool("tokenizer.ggml.normalizer.strip_accents")?,
        chat_template: f.opt_str("tokenizer.chat_template")?.map(str::to_string),
        architecture: f.opt_str("general.architecture")?.map(str::to_string),
    })
}
