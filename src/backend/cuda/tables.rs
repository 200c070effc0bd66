//! The lookup tables of the non-linear formats as CUDA C arrays, written from the CPU's own
//! tables (`quant::iq_tables`, `quant::blocks`) so that the two cannot drift apart: the
//! i-quants' grids and sign masks, and IQ4_NL's and MXFP4's 16 values. Prepended to every
//! kernel file after `common.cuh` (nvrtc.rs), so `blocks.cuh`'s dequantizers and the products'
//! `dot_*` read them; global memory (`static __device__ const`, as the reference's CUDA backend
//! keeps them: a warp's lanes look up different entries, which constant memory would
//! serialize). `KILN_TABLE` set before them gives them another storage class (the tests' host
//! build of `blocks.cuh`: `static const`).

use std::fmt::Write;
use std::sync::OnceLock;

use crate::quant::blocks::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};

/// One C array definition: `KILN_TABLE ty name[len] = {...};`, eight entries a line.
fn array<T: Copy>(out: &mut String, ty: &str, name: &str, v: &[T], fmt: impl Fn(T) -> String) {
    let _ = writeln!(out, "KILN_TABLE {ty} {name}[{}] = {{", v.len());
    for line in v.chunks(8) {
        let items: Vec<String> = line.iter().map(|&x| fmt(x)).collect();
        let _ = writeln!(out, "    {},", items.join(", "));
    }
    out.push_str("};\n");
}

/// The tables' C source (built once).
pub fn source() -> &'static str {
    static SRC: OnceLock<String> = OnceLock::new();
    SRC.get_or_init(|| {
        let mut s = String::from(
            "// The non-linear formats' tables (written by tables.rs from the CPU's).\n\
             #ifndef KILN_TABLE\n#define KILN_TABLE static __device__ const\n#endif\n",
        );
        let u64s = |x: u64| format!("0x{x:016x}ull");
        let u32s = |x: u32| format!("0x{x:08x}u");
        array(
            &mut s,
            "unsigned long long",
            "iq2xxs_grid",
            &IQ2XXS_GRID,
            u64s,
        );
        array(
            &mut s,
            "unsigned long long",
            "iq2xs_grid",
            &IQ2XS_GRID,
            u64s,
        );
        array(&mut s, "unsigned long long", "iq2s_grid", &IQ2S_GRID, u64s);
        array(&mut s, "unsigned long long", "iq1s_grid", &IQ1S_GRID, u64s);
        array(&mut s, "unsigned int", "iq3xxs_grid", &IQ3XXS_GRID, u32s);
        array(&mut s, "unsigned int", "iq3s_grid", &IQ3S_GRID, u32s);
        array(
            &mut s,
            "unsigned char",
            "ksigns_iq2xs",
            &KSIGNS_IQ2XS,
            |x| x.to_string(),
        );
        let i8s = |x: i8| x.to_string();
        array(&mut s, "signed char", "kvalues_iq4nl", &KVALUES_IQ4NL, i8s);
        array(&mut s, "signed char", "kvalues_mxfp4", &KVALUES_MXFP4, i8s);
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table is there whole, and an entry reads back as the CPU's.
    #[test]
    fn tables_hold_the_cpus_entries() {
        let s = source();
        for (name, len) in [
            ("iq2xxs_grid", 256),
            ("iq2xs_grid", 512),
            ("iq2s_grid", 1024),
            ("iq1s_grid", 2048),
            ("iq3xxs_grid", 256),
            ("iq3s_grid", 512),
            ("ksigns_iq2xs", 128),
            ("kvalues_iq4nl", 16),
            ("kvalues_mxfp4", 16),
        ] {
            let head = format!(" {name}[{len}] = {{\n");
            let at = s.find(&head).unwrap_or_else(|| panic!("{name}[{len}]"));
            let body = &s[at + head.len()..];
            let body = &body[..body.find("};").unwrap()];
            let n = body.split(',').filter(|e| !e.trim().is_empty()).count();
            assert_eq!(n, len, "{name}");
        }
        assert!(s.contains(&format!("0x{:016x}ull", IQ1S_GRID[2047])));
        assert!(s.contains("-127, -104, -83, -65, -49, -35, -22, -10,"));
    }
}
