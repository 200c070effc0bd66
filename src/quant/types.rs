//! The tensor element / block formats a GGUF file can name, with their block geometry.
//!
//! Ids are ggml's `enum ggml_type`; a GGUF tensor info stores them as a `u32`.

use std::fmt;

/// The pattern of the super-block formats (256 elements a block, dotted with Q8_K): one list
/// for every `match` that treats them alike.
macro_rules! super_block_types {
    () => {
        GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q8K
            | GgmlType::IQ2XXS
            | GgmlType::IQ2XS
            | GgmlType::IQ2S
            | GgmlType::IQ4XS
            | GgmlType::IQ3XXS
            | GgmlType::IQ1S
            | GgmlType::IQ3S
            | GgmlType::IQ1M
    };
}
pub(super) use super_block_types;

/// A GGUF/ggml tensor type. Every variant here is one the engine can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    /// Internal activation partner of Q4_1 / Q5_1 (scale plus sum).
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// Internal activation partner of the k-quants.
    Q8K,
    /// 256 elements as 32 groups of 8 on a 256-entry grid of magnitudes, 7-bit even-parity
    /// signs and a 4-bit scale per 32, one f16 scale.
    IQ2XXS,
    /// 256 elements as 32 groups of 8 on a 512-entry grid, 7-bit signs, a 4-bit scale per 16.
    IQ2XS,
    /// 256 elements as sign-flipped 4-value points of a 256-entry grid, a 4-bit scale per 32.
    IQ3XXS,
    /// 256 elements as 8-value points of a ternary 2048-entry grid, a 3-bit scale and a
    /// shift per 32.
    IQ1S,
    /// 32 elements on a fixed non-linear grid of 16 values, one f16 scale.
    IQ4NL,
    /// 256 elements as sign-flipped 4-value points of a 512-entry grid, a 4-bit scale per 32.
    IQ3S,
    /// 256 elements as 32 groups of 8 on a 1024-entry grid, 8 free signs per group, a 4-bit
    /// scale per 16.
    IQ2S,
    /// 256 elements on IQ4_NL's grid, a 6-bit scale per 32 under one f16 scale.
    IQ4XS,
    /// IQ1_S's grid with a 3-bit scale per 16 and a shift per 8; the f16 scale spread over
    /// the sub-block scales' spare bits.
    IQ1M,
    BF16,
    /// 32 elements in E2M1 (4-bit floats, OCP microscaling), one E8M0 power-of-two scale.
    MXFP4,
}

impl GgmlType {
    /// Every type, in ggml id order.
    pub const ALL: [GgmlType; 25] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ3XXS,
        GgmlType::IQ1S,
        GgmlType::IQ4NL,
        GgmlType::IQ3S,
        GgmlType::IQ2S,
        GgmlType::IQ4XS,
        GgmlType::IQ1M,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// The ggml type id (as stored in GGUF tensor infos).
    pub const fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::IQ2XXS => 16,
            GgmlType::IQ2XS => 17,
            GgmlType::IQ2S => 22,
            GgmlType::IQ3XXS => 18,
            GgmlType::IQ1S => 19,
            GgmlType::IQ4NL => 20,
            GgmlType::IQ3S => 21,
            GgmlType::IQ4XS => 23,
            GgmlType::IQ1M => 29,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// The type for a ggml id, or `None` for ids this engine does not read
    /// (integer tensors, removed Q4_2/Q4_3, the ternary TQ1_0/TQ2_0, ...).
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// A human name for an id, including ones we cannot read (for error messages).
    pub fn name_of_id(id: u32) -> &'static str {
        match Self::from_id(id) {
            Some(t) => t.name(),
            None => match id {
                4 | 5 => "Q4_2/Q4_3 (removed)",
                24 => "I8",
                25 => "I16",
                26 => "I32",
                27 => "I64",
                28 => "F64",
                34 => "TQ1_0",
                35 => "TQ2_0",
                _ => "unknown",
            },
        }
    }

    /// The name as llama.cpp prints it.
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::IQ2XXS => "IQ2_XXS",
            GgmlType::IQ2XS => "IQ2_XS",
            GgmlType::IQ2S => "IQ2_S",
            GgmlType::IQ3XXS => "IQ3_XXS",
            GgmlType::IQ1S => "IQ1_S",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ3S => "IQ3_S",
            GgmlType::IQ4XS => "IQ4_XS",
            GgmlType::IQ1M => "IQ1_M",
            GgmlType::BF16 => "BF16",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// Parse a name such as `q8_0`, `Q4_K`, `f16` (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        let up = s.to_ascii_uppercase();
        Self::ALL.into_iter().find(|t| t.name() == up)
    }

    /// Elements per block (1 for the float formats).
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::IQ4NL
            | GgmlType::MXFP4 => 32,
            super_block_types!() => 256,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Q8K => 292,
            GgmlType::IQ2XXS => 66,
            GgmlType::IQ2XS => 74,
            GgmlType::IQ2S => 82,
            GgmlType::IQ4NL => 18,
            GgmlType::IQ3XXS => 98,
            GgmlType::IQ1S => 50,
            GgmlType::IQ3S => 110,
            GgmlType::IQ4XS => 136,
            GgmlType::IQ1M => 56,
            GgmlType::MXFP4 => 17,
        }
    }

    /// True for the formats that only exist as activation partners (never in a GGUF we load).
    pub const fn is_internal(self) -> bool {
        matches!(self, GgmlType::Q8_1 | GgmlType::Q8K)
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// Bits per weight, for display.
    pub fn bits_per_weight(self) -> f64 {
        self.type_size() as f64 * 8.0 / self.block_size() as f64
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        }
        assert_eq!(GgmlType::from_id(24), None);
        assert_eq!(GgmlType::from_id(16), Some(GgmlType::IQ2XXS));
        assert_eq!(GgmlType::from_name("iq2_s"), Some(GgmlType::IQ2S));
        assert_eq!(GgmlType::IQ2XS.row_bytes(512), Some(2 * 74));
        assert_eq!(GgmlType::IQ2XXS.row_bytes(128), None);
        assert_eq!(GgmlType::name_of_id(23), "IQ4_XS");
        assert_eq!(GgmlType::from_id(20), Some(GgmlType::IQ4NL));
        assert_eq!(GgmlType::from_name("iq4_xs"), Some(GgmlType::IQ4XS));
        assert_eq!(GgmlType::name_of_id(18), "IQ3_XXS");
        for (id, name, bytes) in [
            (18, "IQ3_XXS", 98),
            (19, "IQ1_S", 50),
            (21, "IQ3_S", 110),
            (29, "IQ1_M", 56),
        ] {
            let t = GgmlType::from_id(id).unwrap();
            assert_eq!((t.name(), t.row_bytes(512)), (name, Some(2 * bytes)));
        }
        assert_eq!(GgmlType::from_id(39), Some(GgmlType::MXFP4));
        assert_eq!(GgmlType::MXFP4.row_bytes(2880), Some(90 * 17));
        assert_eq!(GgmlType::MXFP4.row_bytes(2881), None);
    }

    #[test]
    fn row_bytes_checks_blocks() {
        assert_eq!(GgmlType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(GgmlType::Q4_0.row_bytes(33), None);
        assert_eq!(GgmlType::Q4K.row_bytes(256), Some(144));
        assert_eq!(GgmlType::F32.row_bytes(usize::MAX), None);
    }
}
