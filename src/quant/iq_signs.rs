//! The sign tables the 2- and 3-bit i-quants share (ggml's `ksigns_iq2xs` and `kmask_iq2xs`).
//!
//! IQ2_XXS, IQ2_XS and IQ3_XXS store the signs of 8 grid values in 7 bits; the eighth sign is
//! whatever makes the number of minus signs even. `KSIGNS_IQ2XS[i]` is the full 8-bit sign mask
//! for the stored 7 bits `i`: bit `j` set means element `j` is negated.

/// The 8-bit sign mask of each 7-bit sign index: `i` with bit 7 set when `i` has an odd number
/// of set bits (so that every mask has even parity).
pub(crate) const KSIGNS_IQ2XS: [u8; 128] = ksigns();

/// `KMASK_IQ2XS[j]`: the bit of element `j` in a sign mask.
pub(super) const KMASK_IQ2XS: [u8; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

const fn ksigns() -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        let odd = (i as u8).count_ones() & 1;
        t[i] = i as u8 | ((odd as u8) << 7);
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first and last rows of ggml-common.h's `ksigns_iq2xs`, as printed there.
    #[test]
    fn ksigns_match_the_reference_table() {
        assert_eq!(
            KSIGNS_IQ2XS[..16],
            [0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15]
        );
        assert_eq!(
            KSIGNS_IQ2XS[112..],
            [240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255]
        );
        for (i, &m) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(m & 0x7f, i as u8);
            assert_eq!(m.count_ones() % 2, 0, "mask {m:#010b} has odd parity");
            assert_eq!(
                KMASK_IQ2XS.iter().filter(|&&b| m & b != 0).count(),
                m.count_ones() as usize
            );
        }
    }
}
