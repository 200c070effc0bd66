//! [`Program`]s: a sequence of dispatches (and buffer copies) recorded once into a command
//! buffer, with their descriptor sets, and submitted as often as wanted. What changes between
//! submissions (positions, lengths) is data the kernels read from a host-visible arena, written
//! before [`Program::run`]; the recording never changes.

use std::sync::Arc;

use ash::vk;

use super::arena::{barrier, Region};
use super::pipeline::Kernel;
use super::shaders::KernelId;
use super::{Check, Vk, VulkanError};

const COMPUTE: vk::PipelineStageFlags = vk::PipelineStageFlags::COMPUTE_SHADER;

/// One recorded command.
enum Command {
    Dispatch {
        kernel: Arc<Kernel>,
        regions: Vec<Region>,
        push: Vec<u32>,
        groups: [u32; 3],
    },
    /// Copy `src`'s bytes to `dst` (regions of equal length).
    Copy { src: Region, dst: Region },
}

/// The dispatches of a program, in order (each waits for the writes of those before it).
pub struct Recorder {
    vk: Arc<Vk>,
    commands: Vec<Command>,
}

impl Recorder {
    pub fn new(vk: &Arc<Vk>) -> Recorder {
        Recorder {
            vk: vk.clone(),
            commands: Vec::new(),
        }
    }

    /// The device the program is for.
    pub fn device(&self) -> &super::device::DeviceInfo {
        &self.vk.info
    }

    /// Workgroups for `n` of them: as many as the first dimension takes, the rest in rows of
    /// it (the kernels index `y·width + x` and ignore the extra ones).
    pub fn grid(&self, n: usize) -> Result<[u32; 3], VulkanError> {
        let w = (self.vk.max_groups[0] as usize).min(65535);
        let h = n.div_ceil(w).max(1);
        if h > self.vk.max_groups[1] as usize {
            return Err(VulkanError::Bounds {
                what: "a dispatch",
                detail: format!("{n} workgroups exceed the device's grid"),
            });
        }
        Ok([n.clamp(1, w) as u32, h as u32, 1])
    }

    /// Dispatch kernel `id` over `groups` with its bindings and push constants (words; f32
    /// values as their bits).
    pub fn dispatch(
        &mut self,
        id: KernelId,
        regions: &[Region],
        push: &[u32],
        groups: [u32; 3],
    ) -> Result<(), VulkanError> {
        let kernel = self.vk.kernel(id)?;
        if regions.len() != kernel.bindings() as usize
            || push.len() * 4 != kernel.push_bytes() as usize
        {
            return Err(VulkanError::Bounds {
                what: "a dispatch",
                detail: format!(
                    "{} takes {} bindings and {} bytes of constants, given {} and {}",
                    kernel.name,
                    kernel.bindings(),
                    kernel.push_bytes(),
                    regions.len(),
                    push.len() * 4
                ),
            });
        }
        self.commands.push(Command::Dispatch {
            kernel,
            regions: regions.to_vec(),
            push: push.to_vec(),
            groups,
        });
        Ok(())
    }

    /// Copy region `src` to region `dst` (of the same length) on the queue.
    pub fn copy(&mut self, src: Region, dst: Region) -> Result<(), VulkanError> {
        if src.len != dst.len {
            return Err(VulkanError::Bounds {
                what: "a copy",
                detail: format!("{} bytes to a region of {}", src.len, dst.len),
            });
        }
        self.commands.push(Command::Copy { src, dst });
        Ok(())
    }

    /// Commands recorded so far.
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Record the commands once.
    pub fn finish(self) -> Result<Program, VulkanError> {
        Program::record(&self.vk, self.commands)
    }
}

/// Dispatches recorded once into a command buffer, submitted by [`Program::run`].
pub struct Program {
    vk: Arc<Vk>,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    descriptors: vk::DescriptorPool,
    // The kernels the recording uses stay alive with it.
    _commands: Vec<Command>,
    /// How many times the program ran.
    pub runs: u64,
}

impl Program {
    fn record(vk: &Arc<Vk>, commands: Vec<Command>) -> Result<Program, VulkanError> {
        let d = &vk.device;
        let dispatches = || {
            commands.iter().filter_map(|c| match c {
                Command::Dispatch {
                    kernel, regions, ..
                } => Some((kernel, regions)),
                Command::Copy { .. } => None,
            })
        };
        let n_sets = dispatches().count().max(1) as u32;
        let n_bufs: u32 = dispatches()
            .map(|(_, regions)| regions.len() as u32)
            .sum::<u32>()
            .max(1);
        let mut p = Program {
            vk: vk.clone(),
            pool: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            descriptors: vk::DescriptorPool::null(),
            _commands: Vec::new(),
            runs: 0,
        };
        // SAFETY: valid create infos on a live device; every handle made is kept in `p`, whose
        // `Drop` destroys them (null ones are ignored); the regions' buffers belong to arenas
        // that the caller keeps alive while the program runs (see `Program::run`), and each
        // region lies inside its buffer (`Arena::at` checks it), so copies stay in bounds.
        unsafe {
            p.pool = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default().queue_family_index(vk.queue_family),
                    None,
                )
                .check("vkCreateCommandPool")?;
            p.cmd = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(p.pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .check("vkAllocateCommandBuffers")?[0];
            p.fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .check("vkCreateFence")?;
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: n_bufs,
            }];
            p.descriptors = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(n_sets)
                        .pool_sizes(&sizes),
                    None,
                )
                .check("vkCreateDescriptorPool")?;
            let layouts: Vec<_> = dispatches().map(|(k, _)| k.set_layout()).collect();
            let sets = if layouts.is_empty() {
                Vec::new()
            } else {
                d.allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(p.descriptors)
                        .set_layouts(&layouts),
                )
                .check("vkAllocateDescriptorSets")?
            };
            for ((_, regions), &set) in dispatches().zip(&sets) {
                let infos: Vec<[vk::DescriptorBufferInfo; 1]> = regions
                    .iter()
                    .map(|r| {
                        [vk::DescriptorBufferInfo {
                            buffer: r.buffer,
                            offset: r.off,
                            range: r.len,
                        }]
                    })
                    .collect();
                let writes: Vec<_> = infos
                    .iter()
                    .enumerate()
                    .map(|(i, info)| {
                        vk::WriteDescriptorSet::default()
                            .dst_set(set)
                            .dst_binding(i as u32)
                            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                            .buffer_info(info)
                    })
                    .collect();
                d.update_descriptor_sets(&writes, &[]);
            }
            d.begin_command_buffer(p.cmd, &vk::CommandBufferBeginInfo::default())
                .check("vkBeginCommandBuffer")?;
            let mut sets = sets.iter();
            for c in &commands {
                match c {
                    Command::Dispatch {
                        kernel,
                        push,
                        groups,
                        ..
                    } => {
                        let set = *sets.next().expect("a set per dispatch");
                        d.cmd_bind_pipeline(
                            p.cmd,
                            vk::PipelineBindPoint::COMPUTE,
                            kernel.pipeline(),
                        );
                        d.cmd_bind_descriptor_sets(
                            p.cmd,
                            vk::PipelineBindPoint::COMPUTE,
                            kernel.layout(),
                            0,
                            &[set],
                            &[],
                        );
                        d.cmd_push_constants(
                            p.cmd,
                            kernel.layout(),
                            vk::ShaderStageFlags::COMPUTE,
                            0,
                            zerocopy::IntoBytes::as_bytes(&push[..]),
                        );
                        d.cmd_dispatch(p.cmd, groups[0], groups[1], groups[2]);
                    }
                    Command::Copy { src, dst } => {
                        let region = vk::BufferCopy {
                            src_offset: src.off,
                            dst_offset: dst.off,
                            size: src.len,
                        };
                        d.cmd_copy_buffer(p.cmd, src.buffer, dst.buffer, &[region]);
                    }
                }
                barrier(
                    d,
                    p.cmd,
                    (
                        COMPUTE | vk::PipelineStageFlags::TRANSFER,
                        vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE,
                    ),
                    (
                        COMPUTE | vk::PipelineStageFlags::TRANSFER,
                        vk::AccessFlags::SHADER_READ
                            | vk::AccessFlags::SHADER_WRITE
                            | vk::AccessFlags::TRANSFER_READ
                            | vk::AccessFlags::TRANSFER_WRITE,
                    ),
                );
            }
            // The host reads what the program wrote, after its fence.
            barrier(
                d,
                p.cmd,
                (
                    COMPUTE | vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE,
                ),
                (
                    vk::PipelineStageFlags::HOST | vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::HOST_READ | vk::AccessFlags::TRANSFER_READ,
                ),
            );
            d.end_command_buffer(p.cmd).check("vkEndCommandBuffer")?;
        }
        p._commands = commands;
        Ok(p)
    }

    /// Submit the recording and wait for it. The arenas its regions lie in must be alive (the
    /// owner of a program keeps them beside it).
    pub fn run(&mut self) -> Result<(), VulkanError> {
        let d = &self.vk.device;
        let q = self.vk.queue.lock().unwrap_or_else(|e| e.into_inner());
        let cmds = [self.cmd];
        let submit = vk::SubmitInfo::default().command_buffers(&cmds);
        // SAFETY: the command buffer was recorded once and is not pending (every run waits for
        // its fence); the queue is held for the submission and the wait.
        unsafe {
            d.queue_submit(*q, &[submit], self.fence)
                .check("vkQueueSubmit")?;
            let waited = d
                .wait_for_fences(&[self.fence], true, u64::MAX)
                .check("vkWaitForFences");
            d.reset_fences(&[self.fence]).check("vkResetFences")?;
            waited?;
        }
        self.runs += 1;
        Ok(())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.vk.wait_idle();
        // SAFETY: the device is idle, so nothing uses these; null handles are ignored; the
        // command buffer and descriptor sets go with their pools.
        unsafe {
            let d = &self.vk.device;
            d.destroy_fence(self.fence, None);
            d.destroy_descriptor_pool(self.descriptors, None);
            d.destroy_command_pool(self.pool, None);
        }
    }
}
