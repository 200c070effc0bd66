//! Block formats: layouts, scalar reference (de)quantizers and the fast dot-product kernels.

mod types;

pub use types::GgmlType;
