//! The Vulkan backend's driver layer (with the kernels' sources beside it): the GPUs CUDA does
//! not reach (AMD, Intel, NVIDIA without the CUDA stack, Apple through MoltenVK), and Mesa's
//! software implementation (lavapipe), on which the tests run.
//!
//! The Vulkan loader is opened at run time (`ash`'s `Entry::load`), so one binary builds and
//! runs everywhere: without a loader or a device, [`open`] refuses `--device vulkan` with one
//! line. Kernels are WGSL files in `shaders/`, translated at first use by `naga` to SPIR-V for
//! the device present (and to MSL for Metal: [`shaders::msl`]), so nothing is installed beyond
//! the crates and the system's loader.
//!
//! - [`device`]: instance, the devices present, the chosen one's queue and features;
//! - [`arena`]: buffers allocated once (device memory, and host-visible memory for what each
//!   step changes), written and read through a staging buffer where the host cannot map them;
//! - [`shaders`]: the kernels' sources and their translation;
//! - [`pipeline`]: a compute pipeline per kernel, built at first use;
//! - [`program`]: a command buffer recorded once and submitted again and
//!   again (a step's positions and lengths are data in a host-visible buffer the kernels read:
//!   the CUDA backend's graph replay, in Vulkan's terms);
//! - [`ops`]: the kernels' typed dispatches;
//! - [`weights`]: a model's weights on the device, and the check of its features;
//! - [`exec`]: the executor that drives a model's forward passes through the ops
//!   (`--device vulkan`), tested against the reference engine's logits
//!   (tests/vulkan_golden.rs).

pub mod arena;
pub mod device;
pub mod exec;
pub mod ops;
pub mod pipeline;
pub mod program;
pub mod shaders;
pub mod weights;

pub use arena::{Arena, Layout, Memory};
pub use device::{DeviceInfo, Vk};
pub use pipeline::Kernel;
pub use program::{Program, Recorder};

/// Why the Vulkan device cannot be used, or what failed on it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VulkanError {
    #[error("no Vulkan loader on this machine ({0}): --device vulkan needs libvulkan.so.1 and a driver (Debian: libvulkan1 and mesa-vulkan-drivers); use --device cpu")]
    NoLoader(String),
    #[error("no Vulkan device with a compute queue on this machine: --device vulkan needs a Vulkan driver (Debian's mesa-vulkan-drivers has a software one); use --device cpu")]
    NoDevice,
    #[error("Vulkan device {index} does not exist: {count} found (KILN_VULKAN_DEVICE picks one by index; `vulkaninfo --summary` lists them)")]
    BadIndex { index: usize, count: usize },
    #[error("kernel {name} does not translate to {target}: {reason}")]
    Shader {
        name: String,
        target: &'static str,
        reason: String,
    },
    #[error("Vulkan: {call} failed: {result}")]
    Api { call: &'static str, result: String },
    #[error("no Vulkan memory type for {what} ({bytes} bytes)")]
    NoMemory { what: &'static str, bytes: u64 },
    #[error("{what}: {detail}")]
    Bounds { what: &'static str, detail: String },
    #[error("not supported on Vulkan yet: {0}")]
    Unsupported(String),
}

/// `Result<T, vk::Result>` → [`VulkanError::Api`] naming the call.
pub(crate) trait Check<T> {
    fn check(self, call: &'static str) -> Result<T, VulkanError>;
}

impl<T> Check<T> for Result<T, ash::vk::Result> {
    fn check(self, call: &'static str) -> Result<T, VulkanError> {
        self.map_err(|r| VulkanError::Api {
            call,
            result: format!("{r:?}"),
        })
    }
}

/// The process's device, once opened.
static VK: std::sync::Mutex<Option<std::sync::Arc<Vk>>> = std::sync::Mutex::new(None);

/// Open the Vulkan device (once per process): the one `KILN_VULKAN_DEVICE` names by index
/// among [`device::list`]'s, else the first discrete GPU, else the first integrated one, else
/// the first device.
pub fn open() -> Result<std::sync::Arc<Vk>, VulkanError> {
    let mut g = VK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(vk) = g.as_ref() {
        return Ok(vk.clone());
    }
    let vk = std::sync::Arc::new(Vk::open(crate::tuning::get().vulkan_device)?);
    *g = Some(vk.clone());
    Ok(vk)
}

#[cfg(test)]
mod tests {
    use super::super::Device;

    #[test]
    fn device_vulkan_parses() {
        assert_eq!("vulkan".parse::<Device>(), Ok(Device::Vulkan));
        let e = "metal".parse::<Device>().unwrap_err();
        assert!(e.contains("vulkan") && !e.contains('\n'), "{e}");
    }
}
