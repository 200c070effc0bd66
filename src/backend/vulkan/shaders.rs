//! The kernels' sources (WGSL, in `shaders/`) and their translation by `naga`: to SPIR-V for
//! Vulkan at first use, and to MSL (the route to Metal).
//!
//! A kernel is `common.wgsl` (every kernel), the pieces it builds on, its interface and its
//! text. The pieces: for the products `weights.wgsl` (byte readers of a weight matrix) with the
//! format's `fmt_*.wgsl` (`deq32`: 32 values of a row as f32) or `dot_*.wgsl` (`block_d` and
//! `lane_dot`: a block's scale and the integer product of 4 of its values with 8-bit
//! activations), and for the kernels that sum over a workgroup `reduce.wgsl` (`part_sum`: the
//! tree every such kernel adds in). The interface (the push constants `p` and the storage
//! bindings) is written here from a table ([`Interface`]), which also gives the pipeline's
//! binding count and push-constant size; a kernel's `fn main(GROUP_BUILTINS)` takes the
//! builtins every kernel reads ([`GROUP_BUILTINS`]). The element-wise kernels (add, bias,
//! scale, the gated activation) are one text, `elementwise.wgsl`, with the op's expression.

use naga::back::spv;
use naga::valid::{Capabilities, ValidationFlags, Validator};

use super::VulkanError;
use crate::quant::GgmlType;

const COMMON: &str = include_str!("shaders/common.wgsl");
const WEIGHTS: &str = include_str!("shaders/weights.wgsl");
const REDUCE: &str = include_str!("shaders/reduce.wgsl");
/// The type of `reduce.wgsl`'s sums.
const SUM_F32: &str = "alias sum_t = f32;";
const SUM_F64: &str = "alias sum_t = f64;";

/// The kernels, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// The decode product of a weight format over f32 inputs (weights dequantized).
    Matvec(WeightFormat),
    /// The prompt product, tiled.
    Mm(WeightFormat),
    /// The integer decode product of a format of 32-value blocks with 8-bit activations.
    MatvecInt(WeightFormat),
    QuantizeQ8_0,
    /// The embedding gather of a format.
    Embed(WeightFormat),
    /// A gather of f32 rows by index.
    Gather,
    /// RMSNorm, the squares summed in f32.
    RmsNorm,
    /// RMSNorm, the squares summed in f64 (the CPU's sum; for devices with `shaderFloat64`).
    RmsNormF64,
    Rope,
    StoreKv,
    AttnDecode,
    Glu,
    Add,
    /// A product's bias added to each row.
    Bias,
    Scale,
    Argmax,
}

/// The weight formats the products read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    Q8_0,
    Q4_0,
    Q4K,
    Q6K,
}

impl WeightFormat {
    /// The format of a file's tensor type, where the kernels read it.
    pub fn of(ty: GgmlType) -> Option<WeightFormat> {
        Some(match ty {
            GgmlType::F32 => WeightFormat::F32,
            GgmlType::F16 => WeightFormat::F16,
            GgmlType::Q8_0 => WeightFormat::Q8_0,
            GgmlType::Q4_0 => WeightFormat::Q4_0,
            GgmlType::Q4K => WeightFormat::Q4K,
            GgmlType::Q6K => WeightFormat::Q6K,
            _ => return None,
        })
    }

    pub const ALL: [WeightFormat; 6] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4K,
        WeightFormat::Q6K,
    ];

    fn deq(self) -> &'static str {
        match self {
            WeightFormat::F32 => include_str!("shaders/fmt_f32.wgsl"),
            WeightFormat::F16 => include_str!("shaders/fmt_f16.wgsl"),
            WeightFormat::Q8_0 => include_str!("shaders/fmt_q8_0.wgsl"),
            WeightFormat::Q4_0 => include_str!("shaders/fmt_q4_0.wgsl"),
            WeightFormat::Q4K => include_str!("shaders/fmt_q4_k.wgsl"),
            WeightFormat::Q6K => include_str!("shaders/fmt_q6_k.wgsl"),
        }
    }

    /// The integer product's block scale and lane dot, for the formats that have one.
    fn block_dot(self) -> Option<&'static str> {
        match self {
            WeightFormat::Q8_0 => Some(include_str!("shaders/dot_q8_0.wgsl")),
            WeightFormat::Q4_0 => Some(include_str!("shaders/dot_q4_0.wgsl")),
            _ => None,
        }
    }

    /// Whether the format has an integer product ([`KernelId::MatvecInt`]).
    pub fn has_int(self) -> bool {
        self.block_dot().is_some()
    }
}

/// A storage binding's access.
#[derive(Clone, Copy)]
enum Access {
    Read,
    ReadWrite,
}
use Access::{Read as R, ReadWrite as RW};

/// A kernel's interface, written ahead of its text: the push-constant block `p` (4-byte fields,
/// by name and type) and the storage bindings in binding order (name, access, element type).
struct Interface {
    push: &'static [(&'static str, &'static str)],
    bindings: &'static [(&'static str, Access, &'static str)],
}

impl Interface {
    fn wgsl(&self) -> String {
        let mut s = String::from("struct P {\n");
        for (name, ty) in self.push {
            s += &format!("    {name}: {ty},\n");
        }
        s += "}\n\nvar<push_constant> p: P;\n";
        for (i, (name, access, elem)) in self.bindings.iter().enumerate() {
            let access = match access {
                R => "read",
                RW => "read_write",
            };
            s +=
                &format!("@group(0) @binding({i}) var<storage, {access}> {name}: array<{elem}>;\n");
        }
        s
    }
}

/// The products' push constants (the shape of [`super::ops::Product`] and the weights' row
/// bytes).
const PRODUCT_PUSH: &[(&str, &str)] = &[
    ("rows", "u32"),
    ("cols", "u32"),
    ("n_tok", "u32"),
    ("add", "u32"),
    ("row_bytes", "u32"),
];
const PRODUCT: Interface = Interface {
    push: PRODUCT_PUSH,
    bindings: &[("w", R, "u32"), ("x", R, "f32"), ("y", RW, "f32")],
};

/// The entry point's builtins, for a kernel's `fn main(GROUP_BUILTINS)`: the workgroup's id and
/// the grid's size (for `group_index`) and the thread's index in its workgroup.
const GROUP_BUILTINS: &str = "
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
";

/// An element-wise kernel's `y[i] = expr` (`elementwise.wgsl`).
fn elementwise(expr: &str) -> String {
    include_str!("shaders/elementwise.wgsl").replace("EXPR", expr)
}

/// A kernel's source: its interface (storage bindings, push-constant bytes) and WGSL text.
pub struct Source {
    pub name: String,
    /// Whether it computes in f64 (a device with `shaderFloat64`; no Metal translation).
    pub float64: bool,
    pub bindings: u32,
    pub push_bytes: u32,
    pub wgsl: String,
}

impl KernelId {
    pub fn source(self) -> Result<Source, VulkanError> {
        let text = |main: &'static str| main.to_string();
        let (name, pieces, iface, main): (String, Vec<&str>, Interface, String) = match self {
            KernelId::Matvec(f) => (
                format!("matvec_{f:?}"),
                vec![WEIGHTS, SUM_F32, REDUCE, f.deq()],
                PRODUCT,
                text(include_str!("shaders/matvec.wgsl")),
            ),
            KernelId::Mm(f) => (
                format!("mm_{f:?}"),
                vec![WEIGHTS, f.deq()],
                PRODUCT,
                text(include_str!("shaders/mm.wgsl")),
            ),
            KernelId::MatvecInt(f) => {
                let dot = f.block_dot().ok_or_else(|| {
                    VulkanError::Unsupported(format!("an integer product of {f:?}"))
                })?;
                (
                    format!("matvec_int_{f:?}"),
                    vec![WEIGHTS, dot],
                    Interface {
                        push: PRODUCT_PUSH,
                        bindings: &[("w", R, "u32"), ("xq", R, "u32"), ("y", RW, "f32")],
                    },
                    text(include_str!("shaders/matvec_int.wgsl")),
                )
            }
            KernelId::QuantizeQ8_0 => (
                "quantize_q8_0".into(),
                vec![],
                Interface {
                    push: &[("blocks", "u32")],
                    bindings: &[("x", R, "f32"), ("xq", RW, "u32")],
                },
                text(include_str!("shaders/quantize_q8_0.wgsl")),
            ),
            KernelId::Embed(f) => (
                format!("embed_{f:?}"),
                vec![WEIGHTS, f.deq()],
                Interface {
                    push: &[
                        ("rows", "u32"),
                        ("cols", "u32"),
                        ("row_bytes", "u32"),
                        ("scale", "f32"),
                    ],
                    bindings: &[("w", R, "u32"), ("tokens", R, "u32"), ("x", RW, "f32")],
                },
                text(include_str!("shaders/embed.wgsl")),
            ),
            KernelId::Gather => (
                "gather".into(),
                vec![],
                Interface {
                    push: &[("rows", "u32"), ("n", "u32")],
                    bindings: &[("src", R, "f32"), ("idx", R, "u32"), ("dst", RW, "f32")],
                },
                text(include_str!("shaders/gather.wgsl")),
            ),
            KernelId::RmsNorm | KernelId::RmsNormF64 => {
                let (name, sum) = match self {
                    KernelId::RmsNorm => ("rms_norm", SUM_F32),
                    _ => ("rms_norm_f64", SUM_F64),
                };
                (
                    name.into(),
                    vec![sum, REDUCE],
                    Interface {
                        push: &[("n", "u32"), ("groups", "u32"), ("eps", "f32")],
                        bindings: &[("x", R, "f32"), ("nw", R, "f32"), ("y", RW, "f32")],
                    },
                    text(include_str!("shaders/rms_norm.wgsl")),
                )
            }
            KernelId::Rope => (
                "rope".into(),
                vec![],
                Interface {
                    push: &[
                        ("rows", "u32"),
                        ("heads", "u32"),
                        ("head_dim", "u32"),
                        ("n_dims", "u32"),
                        ("neox", "u32"),
                        ("stride", "u32"),
                        ("theta_scale", "f32"),
                        ("freq_scale", "f32"),
                        ("mscale", "f32"),
                    ],
                    bindings: &[("v", RW, "f32"), ("pos", R, "u32")],
                },
                text(include_str!("shaders/rope.wgsl")),
            ),
            KernelId::StoreKv => (
                "store_kv".into(),
                vec![],
                Interface {
                    push: &[("rows", "u32"), ("width", "u32")],
                    bindings: &[("src", R, "f32"), ("cache", RW, "u32"), ("pos", R, "u32")],
                },
                text(include_str!("shaders/store_kv.wgsl")),
            ),
            KernelId::AttnDecode => (
                "attn_decode".into(),
                vec![],
                Interface {
                    push: &[
                        ("rows", "u32"),
                        ("heads", "u32"),
                        ("kv_heads", "u32"),
                        ("head_dim", "u32"),
                        ("scale", "f32"),
                    ],
                    bindings: &[
                        ("q", R, "f32"),
                        ("kc", R, "u32"),
                        ("vc", R, "u32"),
                        ("lens", R, "u32"),
                        ("o", RW, "f32"),
                    ],
                },
                text(include_str!("shaders/attn_decode.wgsl")),
            ),
            // gate = act(gate)·up.
            KernelId::Glu => (
                "glu".into(),
                vec![include_str!("shaders/glu.wgsl")],
                Interface {
                    push: &[("n", "u32"), ("gelu", "u32")],
                    bindings: &[("y", RW, "f32"), ("x", R, "f32")],
                },
                elementwise("act(y[i]) * x[i]"),
            ),
            // y += x.
            KernelId::Add => (
                "add".into(),
                vec![],
                Interface {
                    push: &[("n", "u32")],
                    bindings: &[("y", RW, "f32"), ("x", R, "f32")],
                },
                elementwise("y[i] + x[i]"),
            ),
            // A product's bias added to each of its rows (after the product's sum, as the CPU
            // adds it).
            KernelId::Bias => (
                "bias".into(),
                vec![],
                Interface {
                    push: &[("n", "u32"), ("width", "u32")],
                    bindings: &[("y", RW, "f32"), ("b", R, "f32")],
                },
                elementwise("y[i] + b[i % p.width]"),
            ),
            // y *= s.
            KernelId::Scale => (
                "scale".into(),
                vec![],
                Interface {
                    push: &[("n", "u32"), ("s", "f32")],
                    bindings: &[("y", RW, "f32")],
                },
                elementwise("y[i] * p.s"),
            ),
            KernelId::Argmax => (
                "argmax".into(),
                vec![],
                Interface {
                    push: &[("rows", "u32"), ("n", "u32")],
                    bindings: &[("x", R, "f32"), ("out", RW, "u32")],
                },
                text(include_str!("shaders/argmax.wgsl")),
            ),
        };
        let mut wgsl = String::from(COMMON);
        for p in pieces {
            wgsl.push('\n');
            wgsl.push_str(p);
        }
        wgsl.push('\n');
        wgsl.push_str(&iface.wgsl());
        wgsl.push('\n');
        wgsl.push_str(&main.replace("GROUP_BUILTINS", GROUP_BUILTINS));
        Ok(Source {
            float64: self == KernelId::RmsNormF64,
            name,
            bindings: iface.bindings.len() as u32,
            push_bytes: iface.push.len() as u32 * 4,
            wgsl,
        })
    }

    /// Every kernel.
    pub fn all() -> Vec<KernelId> {
        let mut v = Vec::new();
        for f in WeightFormat::ALL {
            v.push(KernelId::Matvec(f));
            v.push(KernelId::Mm(f));
            v.push(KernelId::Embed(f));
            if f.has_int() {
                v.push(KernelId::MatvecInt(f));
            }
        }
        v.extend([
            KernelId::QuantizeQ8_0,
            KernelId::Gather,
            KernelId::RmsNorm,
            KernelId::RmsNormF64,
            KernelId::Rope,
            KernelId::StoreKv,
            KernelId::AttnDecode,
            KernelId::Glu,
            KernelId::Add,
            KernelId::Bias,
            KernelId::Scale,
            KernelId::Argmax,
        ]);
        v
    }
}

fn module(
    src: &Source,
    target: &'static str,
) -> Result<(naga::Module, naga::valid::ModuleInfo), VulkanError> {
    let err = |reason: String| VulkanError::Shader {
        name: src.name.clone(),
        target,
        reason,
    };
    let mut module =
        naga::front::wgsl::parse_str(&src.wgsl).map_err(|e| err(e.emit_to_string(&src.wgsl)))?;
    // The shared pieces' functions a kernel does not call are dropped.
    naga::compact::compact(&mut module, naga::compact::KeepUnused::No);
    let info = Validator::new(
        ValidationFlags::all(),
        Capabilities::PUSH_CONSTANT
            | Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | Capabilities::FLOAT64,
    )
    .validate(&module)
    .map_err(|e| err(format!("{:?}", e.into_inner())))?;
    Ok((module, info))
}

/// The kernel's SPIR-V; with `int_dot`, the packed 8-bit dot products are the device's
/// instructions (`SPV_KHR_integer_dot_product`), else plain integer arithmetic (same results).
pub fn spirv(src: &Source, int_dot: bool) -> Result<Vec<u32>, VulkanError> {
    let (module, info) = module(src, "SPIR-V")?;
    let mut caps = naga::FastHashSet::default();
    caps.insert(spv::Capability::Shader);
    if src.float64 {
        caps.insert(spv::Capability::Float64);
    }
    if int_dot {
        caps.insert(spv::Capability::DotProduct);
        caps.insert(spv::Capability::DotProductInput4x8BitPacked);
    }
    let options = spv::Options {
        lang_version: (1, 3),
        flags: spv::WriterFlags::empty(),
        capabilities: Some(caps),
        // The kernels bound every loop themselves.
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| VulkanError::Shader {
        name: src.name.clone(),
        target: "SPIR-V",
        reason: e.to_string(),
    })
}

/// The kernel in Metal Shading Language (2.4), as a Metal backend would compile it.
pub fn msl(src: &Source) -> Result<String, VulkanError> {
    use naga::back::msl;
    if src.float64 {
        return Err(VulkanError::Shader {
            name: src.name.clone(),
            target: "MSL",
            reason: "Metal has no f64".into(),
        });
    }
    let (module, info) = module(src, "MSL")?;
    let options = msl::Options {
        lang_version: (2, 4),
        fake_missing_bindings: true,
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, "main".into())),
        ..Default::default()
    };
    msl::write_string(&module, &info, &options, &pipeline)
        .map(|(s, _)| s)
        .map_err(|e| VulkanError::Shader {
            name: src.name.clone(),
            target: "MSL",
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel translates to SPIR-V, with and without the integer-dot instructions, and to
    /// MSL (no device needed).
    #[test]
    fn every_kernel_translates() {
        for k in KernelId::all() {
            let src = k.source().unwrap();
            for int_dot in [false, true] {
                let words = spirv(&src, int_dot).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(words[0], 0x0723_0203, "{}: SPIR-V magic", src.name);
            }
            if src.float64 {
                assert!(msl(&src).is_err(), "{}: Metal has no f64", src.name);
                continue;
            }
            let m = msl(&src).unwrap_or_else(|e| panic!("{e}"));
            assert!(m.contains("kernel void"), "{}: {m}", src.name);
        }
    }

    /// docs/gpu.md shows the MSL of two kernels (`add` and `rms_norm`) as the translation writes
    /// it: each block (after its `<!-- msl: NAME -->` marker) is the translation's text.
    #[test]
    fn the_documented_msl_is_the_translations() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/gpu.md")).unwrap();
        let mut stale = Vec::new();
        for (name, id) in [("add", KernelId::Add), ("rms_norm", KernelId::RmsNorm)] {
            let marker = format!("<!-- msl: {name} -->");
            let at = doc
                .find(&marker)
                .unwrap_or_else(|| panic!("docs/gpu.md lacks {marker}"));
            let rest = &doc[at..];
            let start = rest
                .find("```metal\n")
                .expect("a ```metal block after the marker")
                + 9;
            let len = rest[start..].find("```").expect("the block's end");
            let want = msl(&id.source().unwrap()).unwrap();
            if rest[start..start + len] != want {
                // What the translation writes now, to put in the docs.
                let out = concat!(env!("CARGO_MANIFEST_DIR"), "/target/msl");
                std::fs::create_dir_all(out).unwrap();
                let path = format!("{out}/{name}.metal");
                std::fs::write(&path, &want).unwrap();
                stale.push(path);
            }
        }
        assert!(
            stale.is_empty(),
            "docs/gpu.md's MSL is not what the translation writes: {stale:?}"
        );
    }

    /// The integer products use the packed dot instruction (OpSDot, 4450) only where asked.
    #[test]
    fn integer_dot_instructions_only_where_the_device_has_them() {
        let src = KernelId::MatvecInt(WeightFormat::Q8_0).source().unwrap();
        let has_sdot = |w: &[u32]| {
            // Walk the instructions (word count in the high half, opcode in the low).
            let mut i = 5;
            while i < w.len() {
                if w[i] & 0xffff == 4450 {
                    return true;
                }
                i += (w[i] >> 16).max(1) as usize;
            }
            false
        };
        assert!(has_sdot(&spirv(&src, true).unwrap()));
        assert!(!has_sdot(&spirv(&src, false).unwrap()));
        assert!(KernelId::MatvecInt(WeightFormat::Q4K).source().is_err());
    }
}
