//! Buffers allocated once: an [`Arena`] is one `VkBuffer` over one allocation, carved into
//! regions by a [`Layout`] before it is made (weights, KV slots, scratch), so nothing is
//! allocated while a model runs.
//!
//! [`Memory::Device`] arenas live in device-local memory; where the host can map that memory
//! (lavapipe, integrated GPUs, resizable BAR) they are written and read in place, else through
//! a host-visible staging buffer and a copy on the queue. [`Memory::Host`] arenas are
//! host-visible and mapped, for what the host changes every step (positions, lengths).

use std::sync::Arc;

use ash::vk;

use super::{Check, Vk, VulkanError};

/// Record into `cmd` a global memory barrier: the accesses `src.1` of stages `src.0` before it
/// are made visible to the accesses `dst.1` of stages `dst.0` after it.
///
/// # Safety
///
/// `cmd` is a command buffer of `d` in the recording state.
pub(crate) unsafe fn barrier(
    d: &ash::Device,
    cmd: vk::CommandBuffer,
    src: (vk::PipelineStageFlags, vk::AccessFlags),
    dst: (vk::PipelineStageFlags, vk::AccessFlags),
) {
    let b = vk::MemoryBarrier::default()
        .src_access_mask(src.1)
        .dst_access_mask(dst.1);
    // SAFETY: the caller's: `cmd` is recording on `d`.
    unsafe {
        d.cmd_pipeline_barrier(
            cmd,
            src.0,
            dst.0,
            vk::DependencyFlags::empty(),
            &[b],
            &[],
            &[],
        )
    };
}

/// Offsets of regions in an arena-to-be, each aligned for a storage-buffer binding.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub bytes: u64,
}

/// A region's alignment: a multiple of every device's `minStorageBufferOffsetAlignment`
/// (at most 256 by the specification).
pub const ALIGN: u64 = 256;

impl Layout {
    /// Reserve `bytes` (at least 4) and return their offset.
    pub fn take(&mut self, bytes: usize) -> u64 {
        let off = self.bytes.next_multiple_of(ALIGN);
        self.bytes = off + (bytes as u64).max(4).next_multiple_of(4);
        off
    }
}

/// Where an arena lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Device-local, mapped only where the device allows it.
    Device,
    /// Device-local, never mapped: always written and read through the staging buffer (what a
    /// discrete GPU does; the tests force it on devices that could map).
    DeviceStaged,
    /// Host-visible and coherent, mapped.
    Host,
}

/// A buffer and its memory.
struct Raw {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    /// The mapping, where the memory is mapped.
    map: Option<*mut u8>,
}

impl Raw {
    fn new(vk: &Vk, bytes: u64, mem: Memory, what: &'static str) -> Result<Raw, VulkanError> {
        let d = &vk.device;
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(bytes.max(4))
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info on a live device; the buffer is destroyed in `free`.
        let buffer = unsafe { d.create_buffer(&info, None) }.check("vkCreateBuffer")?;
        // SAFETY: the buffer was just made on this device.
        let req = unsafe { d.get_buffer_memory_requirements(buffer) };
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        let ty = match mem {
            Memory::Host => vk.memory_type(req.memory_type_bits, host),
            Memory::Device | Memory::DeviceStaged => vk
                .memory_type(req.memory_type_bits, local)
                .or_else(|| vk.memory_type(req.memory_type_bits, Default::default())),
        };
        let Some(ty) = ty else {
            // SAFETY: the buffer is unused.
            unsafe { d.destroy_buffer(buffer, None) };
            return Err(VulkanError::NoMemory { what, bytes });
        };
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(ty);
        // SAFETY: a valid allocate info; the memory is freed in `free`.
        let memory = match unsafe { d.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(r) => {
                // SAFETY: the buffer is unused.
                unsafe { d.destroy_buffer(buffer, None) };
                return Err(VulkanError::Api {
                    call: "vkAllocateMemory",
                    result: format!("{r:?} ({what}, {bytes} bytes)"),
                });
            }
        };
        let mut raw = Raw {
            buffer,
            memory,
            map: None,
        };
        // SAFETY: the memory fits the buffer's requirements and neither is bound yet.
        if let Err(e) =
            unsafe { d.bind_buffer_memory(buffer, memory, 0) }.check("vkBindBufferMemory")
        {
            raw.free(vk);
            return Err(e);
        }
        let mappable = vk.memory.memory_types[ty as usize]
            .property_flags
            .contains(host);
        if mappable && mem != Memory::DeviceStaged {
            // SAFETY: host-visible memory, mapped whole once, unmapped when freed.
            match unsafe { d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) } {
                Ok(p) => raw.map = Some(p.cast()),
                Err(r) => {
                    raw.free(vk);
                    return Err(VulkanError::Api {
                        call: "vkMapMemory",
                        result: format!("{r:?}"),
                    });
                }
            }
        } else if mem == Memory::Host {
            raw.free(vk);
            return Err(VulkanError::NoMemory { what, bytes });
        }
        Ok(raw)
    }

    fn free(&mut self, vk: &Vk) {
        // SAFETY: the owner waited for the device (or never submitted work using these); the
        // mapping goes with the memory.
        unsafe {
            vk.device.destroy_buffer(self.buffer, None);
            vk.device.free_memory(self.memory, None);
        }
    }
}

/// A buffer allocated once, addressed by byte offsets (a [`Layout`]'s).
pub struct Arena {
    vk: Arc<Vk>,
    raw: Raw,
    bytes: u64,
    /// Where the arena is not mapped: the staging buffer, and the commands that copy through it.
    staging: Option<Staging>,
}

struct Staging {
    raw: Raw,
    bytes: u64,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
}

/// The staging buffer's size: copies larger than this go in several rounds.
const STAGING_BYTES: u64 = 16 << 20;

// SAFETY: the mapping is a plain pointer into memory the arena owns; every access goes through
// `&self`/`&mut self` methods that bound-check it, and the Vulkan handles may be used from any
// thread (the queue is behind `Vk`'s mutex).
unsafe impl Send for Arena {}
// SAFETY: as above; shared access only reads (`read`) or hands out handles.
unsafe impl Sync for Arena {}

impl Arena {
    /// An arena of `bytes` in `mem`.
    pub fn new(vk: &Arc<Vk>, bytes: u64, mem: Memory) -> Result<Arena, VulkanError> {
        let raw = Raw::new(vk, bytes, mem, "an arena")?;
        let mut arena = Arena {
            vk: vk.clone(),
            raw,
            bytes: bytes.max(4),
            staging: None,
        };
        if arena.raw.map.is_none() {
            arena.staging = Some(Staging::new(vk)?);
        }
        Ok(arena)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the host writes and reads the arena in place.
    pub fn is_mapped(&self) -> bool {
        self.raw.map.is_some()
    }

    fn check(&self, off: u64, len: usize, what: &'static str) -> Result<(), VulkanError> {
        if off
            .checked_add(len as u64)
            .is_none_or(|end| end > self.bytes)
        {
            return Err(VulkanError::Bounds {
                what,
                detail: format!("{len} bytes at {off} past the arena's {}", self.bytes),
            });
        }
        Ok(())
    }

    /// A region for a kernel's binding: `len` bytes at `off`.
    pub fn at(&self, off: u64, len: usize) -> Result<Region, VulkanError> {
        self.check(off, len, "a binding")?;
        if !off.is_multiple_of(self.vk.offset_align) {
            return Err(VulkanError::Bounds {
                what: "a binding",
                detail: format!("offset {off} is not a multiple of {}", self.vk.offset_align),
            });
        }
        if len as u64 > self.vk.info.max_storage_range {
            return Err(VulkanError::Bounds {
                what: "a binding",
                detail: format!(
                    "{len} bytes exceed the device's largest storage binding ({})",
                    self.vk.info.max_storage_range
                ),
            });
        }
        Ok(Region {
            buffer: self.raw.buffer,
            off,
            len: (len as u64).max(4).next_multiple_of(4),
        })
    }

    /// Copy `src` to the arena at `off` (the device must not be using that region).
    pub fn write(&mut self, off: u64, src: &[u8]) -> Result<(), VulkanError> {
        self.check(off, src.len(), "a write")?;
        if let Some(p) = self.raw.map {
            // SAFETY: the range was checked to lie inside the mapped allocation, which the
            // device does not use now (no submission of ours is pending: every submit waits).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p.add(off as usize), src.len()) };
            return Ok(());
        }
        let st = self
            .staging
            .as_ref()
            .expect("an unmapped arena has a staging buffer");
        let p = st.raw.map.expect("the staging buffer is mapped");
        let mut done = 0usize;
        while done < src.len() {
            let n = (src.len() - done).min(st.bytes as usize);
            // SAFETY: `n` is at most the staging buffer's mapped size.
            unsafe { std::ptr::copy_nonoverlapping(src[done..].as_ptr(), p, n) };
            st.copy(
                &self.vk,
                st.raw.buffer,
                0,
                self.raw.buffer,
                off + done as u64,
                n as u64,
            )?;
            done += n;
        }
        Ok(())
    }

    /// Copy the arena's bytes at `off` into `dst` (after the work writing them has finished).
    pub fn read(&self, off: u64, dst: &mut [u8]) -> Result<(), VulkanError> {
        self.check(off, dst.len(), "a read")?;
        if let Some(p) = self.raw.map {
            // SAFETY: the range lies inside the mapped allocation; the work that wrote it ended
            // (every submission is waited for) and the memory is coherent.
            unsafe {
                std::ptr::copy_nonoverlapping(p.add(off as usize), dst.as_mut_ptr(), dst.len())
            };
            return Ok(());
        }
        let st = self
            .staging
            .as_ref()
            .expect("an unmapped arena has a staging buffer");
        let p = st.raw.map.expect("the staging buffer is mapped");
        let mut done = 0usize;
        while done < dst.len() {
            let n = (dst.len() - done).min(st.bytes as usize);
            st.copy(
                &self.vk,
                self.raw.buffer,
                off + done as u64,
                st.raw.buffer,
                0,
                n as u64,
            )?;
            // SAFETY: the copy ended (waited for) and wrote `n` bytes at the mapping's start.
            unsafe { std::ptr::copy_nonoverlapping(p, dst[done..].as_mut_ptr(), n) };
            done += n;
        }
        Ok(())
    }

    /// [`Arena::write`] of f32 values.
    pub fn write_f32(&mut self, off: u64, v: &[f32]) -> Result<(), VulkanError> {
        self.write(off, zerocopy::IntoBytes::as_bytes(v))
    }

    /// [`Arena::read`] of f32 values.
    pub fn read_f32(&self, off: u64, v: &mut [f32]) -> Result<(), VulkanError> {
        self.read(off, zerocopy::IntoBytes::as_mut_bytes(v))
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Work using the arena may still run where a submission failed midway.
        let _ = self.vk.wait_idle();
        if let Some(mut st) = self.staging.take() {
            // SAFETY: the device is idle; the command buffer goes with its pool.
            unsafe {
                self.vk.device.destroy_fence(st.fence, None);
                self.vk.device.destroy_command_pool(st.pool, None);
            }
            st.raw.free(&self.vk);
        }
        self.raw.free(&self.vk);
    }
}

impl Staging {
    fn new(vk: &Vk) -> Result<Staging, VulkanError> {
        let mut raw = Raw::new(vk, STAGING_BYTES, Memory::Host, "the staging buffer")?;
        let d = &vk.device;
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(vk.queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create infos on a live device; destroyed in `Arena::drop` (or below).
        let made = unsafe {
            d.create_command_pool(&pool_info, None)
                .check("vkCreateCommandPool")
                .and_then(|pool| {
                    let a = vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1);
                    let cmd = d
                        .allocate_command_buffers(&a)
                        .check("vkAllocateCommandBuffers");
                    let fence = d
                        .create_fence(&vk::FenceCreateInfo::default(), None)
                        .check("vkCreateFence");
                    match (cmd, fence) {
                        (Ok(c), Ok(f)) => Ok((pool, c[0], f)),
                        (c, f) => {
                            if let Ok(f) = f {
                                d.destroy_fence(f, None);
                            }
                            d.destroy_command_pool(pool, None);
                            Err(c.err().or(f.err()).expect("one failed"))
                        }
                    }
                })
        };
        match made {
            Ok((pool, cmd, fence)) => Ok(Staging {
                raw,
                bytes: STAGING_BYTES,
                pool,
                cmd,
                fence,
            }),
            Err(e) => {
                raw.free(vk);
                Err(e)
            }
        }
    }

    /// Copy `n` bytes between buffers on the queue, and wait.
    fn copy(
        &self,
        vk: &Vk,
        src: vk::Buffer,
        src_off: u64,
        dst: vk::Buffer,
        dst_off: u64,
        n: u64,
    ) -> Result<(), VulkanError> {
        let d = &vk.device;
        let region = vk::BufferCopy {
            src_offset: src_off,
            dst_offset: dst_off,
            size: n,
        };
        let q = vk.queue.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the command buffer is ours and idle (every copy waits for its fence before
        // returning); the regions lie inside the buffers (checked by the callers); the queue is
        // held for the submission and the wait.
        unsafe {
            d.begin_command_buffer(
                self.cmd,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .check("vkBeginCommandBuffer")?;
            d.cmd_copy_buffer(self.cmd, src, dst, &[region]);
            barrier(
                d,
                self.cmd,
                (
                    vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::TRANSFER_WRITE,
                ),
                (
                    vk::PipelineStageFlags::HOST | vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::AccessFlags::HOST_READ | vk::AccessFlags::SHADER_READ,
                ),
            );
            d.end_command_buffer(self.cmd).check("vkEndCommandBuffer")?;
            let cmds = [self.cmd];
            let submit = vk::SubmitInfo::default().command_buffers(&cmds);
            d.queue_submit(*q, &[submit], self.fence)
                .check("vkQueueSubmit")?;
            let waited = d
                .wait_for_fences(&[self.fence], true, u64::MAX)
                .check("vkWaitForFences");
            d.reset_fences(&[self.fence]).check("vkResetFences")?;
            waited
        }
    }
}

/// A region of an arena, for a kernel's binding.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub(crate) buffer: vk::Buffer,
    pub(crate) off: u64,
    pub(crate) len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_every_region() {
        let mut l = Layout::default();
        assert_eq!(l.take(10), 0);
        assert_eq!(l.take(1), 256);
        assert_eq!(l.bytes, 260);
        assert_eq!(l.take(0), 512);
        assert_eq!(l.bytes, 516);
    }
}
