//! The executor of the device an [`ExecSpec`] names (kept apart from the seam: the executors
//! drive the forward pass, a layer above it).

use std::sync::Arc;

use super::cpu::exec::CpuExec;
use super::cuda::exec::CudaExec;
use super::exec::{ExecError, ExecSpec, Executor};
use super::vulkan::exec::VkExec;
use super::Device;
use crate::model::Model;

/// An executor for `model` on `spec.device`, everything allocated once; `progress(bytes done,
/// bytes in all)` is called while the weights go to a device (never on the CPU, whose
/// weights are the model's).
pub fn executor(
    model: Arc<Model>,
    spec: &ExecSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn Executor>, ExecError> {
    Ok(match spec.device {
        Device::Cpu => Box::new(CpuExec::new(model, spec)?),
        Device::Cuda => Box::new(CudaExec::new(model, spec, progress)?),
        Device::Vulkan => Box::new(VkExec::new(model, spec, progress)?),
    })
}
