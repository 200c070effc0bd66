//! Compute pipelines: a [`Kernel`] per [`KernelId`], built once per device at first use
//! (`Vk::kernel`) from the kernel's SPIR-V.

use std::ffi::CStr;

use ash::vk;

use super::shaders::{self, KernelId};
use super::{Check, VulkanError};

/// The name of the entry point every kernel has.
const MAIN: &CStr = c"main";

/// A compute pipeline and its interface.
pub struct Kernel {
    pub name: String,
    bindings: u32,
    push_bytes: u32,
    module: vk::ShaderModule,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

impl Kernel {
    pub(crate) fn build(
        d: &ash::Device,
        id: KernelId,
        int_dot: bool,
    ) -> Result<Kernel, VulkanError> {
        let src = id.source()?;
        let words = shaders::spirv(&src, int_dot)?;
        let mut k = Kernel {
            name: src.name,
            bindings: src.bindings,
            push_bytes: src.push_bytes,
            module: vk::ShaderModule::null(),
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
        };
        // SAFETY: valid create infos on a live device, each pointing to data that outlives the
        // call; on failure what was made is destroyed (`destroy` skips null handles).
        let made = unsafe {
            (|| {
                k.module = d
                    .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                    .check("vkCreateShaderModule")?;
                let binds: Vec<_> = (0..k.bindings)
                    .map(|i| {
                        vk::DescriptorSetLayoutBinding::default()
                            .binding(i)
                            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                            .descriptor_count(1)
                            .stage_flags(vk::ShaderStageFlags::COMPUTE)
                    })
                    .collect();
                k.set_layout = d
                    .create_descriptor_set_layout(
                        &vk::DescriptorSetLayoutCreateInfo::default().bindings(&binds),
                        None,
                    )
                    .check("vkCreateDescriptorSetLayout")?;
                let ranges = [vk::PushConstantRange::default()
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
                    .offset(0)
                    .size(k.push_bytes)];
                let sets = [k.set_layout];
                k.layout = d
                    .create_pipeline_layout(
                        &vk::PipelineLayoutCreateInfo::default()
                            .set_layouts(&sets)
                            .push_constant_ranges(&ranges),
                        None,
                    )
                    .check("vkCreatePipelineLayout")?;
                let stage = vk::PipelineShaderStageCreateInfo::default()
                    .stage(vk::ShaderStageFlags::COMPUTE)
                    .module(k.module)
                    .name(MAIN);
                let info = vk::ComputePipelineCreateInfo::default()
                    .stage(stage)
                    .layout(k.layout);
                k.pipeline = d
                    .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                    .map_err(|(_, r)| r)
                    .check("vkCreateComputePipelines")?[0];
                Ok(())
            })()
        };
        match made {
            Ok(()) => Ok(k),
            Err(e) => {
                k.destroy(d);
                Err(e)
            }
        }
    }

    pub(crate) fn bindings(&self) -> u32 {
        self.bindings
    }

    pub(crate) fn push_bytes(&self) -> u32 {
        self.push_bytes
    }

    pub(crate) fn set_layout(&self) -> vk::DescriptorSetLayout {
        self.set_layout
    }

    pub(crate) fn layout(&self) -> vk::PipelineLayout {
        self.layout
    }

    pub(crate) fn pipeline(&self) -> vk::Pipeline {
        self.pipeline
    }

    /// Destroy the handles (the device must not be using them).
    pub(crate) fn destroy(&self, d: &ash::Device) {
        // SAFETY: called once, when nothing on the device uses the kernel (the device is idle
        // and every program holding it is gone); null handles are ignored by Vulkan.
        unsafe {
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            d.destroy_shader_module(self.module, None);
        }
    }
}
