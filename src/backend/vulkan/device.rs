//! The Vulkan instance, the devices present, and the chosen one: its compute queue, memory
//! types and the features the kernels may use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ash::vk;

use super::pipeline::Kernel;
use super::shaders::KernelId;
use super::{Check, VulkanError};

/// One device the driver offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its index in the driver's list (what `KILN_VULKAN_DEVICE` names).
    pub index: usize,
    pub name: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` or `other`.
    pub kind: &'static str,
    /// The Vulkan version it implements, `major.minor.patch`.
    pub api: String,
    /// Whether it has `VK_KHR_shader_integer_dot_product` (or Vulkan 1.3) with the feature on:
    /// the quantized products then use its 8-bit dot instructions.
    pub int_dot: bool,
    /// Whether it has f64 arithmetic in shaders (`shaderFloat64`, enabled when present): the
    /// norms then sum their squares in f64, as the CPU does.
    pub float64: bool,
    /// The largest storage-buffer binding (one tensor's bytes must fit it).
    pub max_storage_range: u64,
}

/// An opened device: the instance, the logical device with one compute queue, and what the
/// kernels and buffers need to know of it.
pub struct Vk {
    // Kept for the loader's lifetime: the function pointers below come from it.
    _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    pub(crate) device: ash::Device,
    pub(crate) queue: Mutex<vk::Queue>,
    pub(crate) queue_family: u32,
    pub(crate) memory: vk::PhysicalDeviceMemoryProperties,
    /// Storage-buffer bindings start at multiples of this.
    pub(crate) offset_align: u64,
    pub(crate) max_groups: [u32; 3],
    /// The kernels built so far ([`Vk::kernel`]).
    pub(crate) kernels: Mutex<HashMap<KernelId, Arc<Kernel>>>,
    pub info: DeviceInfo,
}

/// Open the loader (fails with [`VulkanError::NoLoader`] where there is none).
fn load() -> Result<ash::Entry, VulkanError> {
    // SAFETY: loading libvulkan runs its initializers, as in any Vulkan program; the entry keeps
    // the library loaded for as long as it (and everything made from it, held beside it in
    // `Vk`) lives.
    unsafe { ash::Entry::load() }.map_err(|e| VulkanError::NoLoader(e.to_string()))
}

fn instance(entry: &ash::Entry) -> Result<ash::Instance, VulkanError> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"kiln")
        .engine_name(c"kiln")
        .api_version(vk::API_VERSION_1_1);
    // Devices behind a portability layer (MoltenVK) are listed only when asked for.
    // SAFETY: a plain query of the loader.
    let exts = unsafe { entry.enumerate_instance_extension_properties(None) }
        .check("vkEnumerateInstanceExtensionProperties")?;
    let portability = exts
        .iter()
        .any(|e| e.extension_name_as_c_str() == Ok(ash::khr::portability_enumeration::NAME));
    let names = [ash::khr::portability_enumeration::NAME.as_ptr()];
    let mut info = vk::InstanceCreateInfo::default().application_info(&app);
    if portability {
        info = info
            .enabled_extension_names(&names)
            .flags(vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR);
    }
    // SAFETY: the create info and the strings it points to outlive the call.
    unsafe { entry.create_instance(&info, None) }.check("vkCreateInstance")
}

fn kind(t: vk::PhysicalDeviceType) -> &'static str {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
        vk::PhysicalDeviceType::CPU => "cpu",
        _ => "other",
    }
}

/// A physical device's description, its compute queue family (None: it has none) and whether
/// it must enable the integer-dot extension by name (a device older than Vulkan 1.3).
struct Candidate {
    pd: vk::PhysicalDevice,
    info: DeviceInfo,
    family: Option<u32>,
    dot_ext: bool,
    props: vk::PhysicalDeviceProperties,
}

fn candidates(instance: &ash::Instance) -> Result<Vec<Candidate>, VulkanError> {
    // SAFETY: queries of a live instance; the returned handles live as long as it.
    let pds =
        unsafe { instance.enumerate_physical_devices() }.check("vkEnumeratePhysicalDevices")?;
    let mut out = Vec::with_capacity(pds.len());
    for (index, pd) in pds.into_iter().enumerate() {
        // SAFETY: `pd` is one of the instance's devices.
        let props = unsafe { instance.get_physical_device_properties(pd) };
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
        let family = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .map(|i| i as u32);
        // SAFETY: as above.
        let exts = unsafe { instance.enumerate_device_extension_properties(pd) }
            .check("vkEnumerateDeviceExtensionProperties")?;
        let has_ext = exts
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::khr::shader_integer_dot_product::NAME));
        let v13 = props.api_version >= vk::API_VERSION_1_3;
        let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        if v13 || has_ext {
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut dot);
            // SAFETY: the chain holds one structure the device knows (it has the extension or
            // Vulkan 1.3), which outlives the call.
            unsafe { instance.get_physical_device_features2(pd, &mut f2) };
        }
        // SAFETY: as above.
        let features = unsafe { instance.get_physical_device_features(pd) };
        let name = props
            .device_name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let v = props.api_version;
        out.push(Candidate {
            pd,
            info: DeviceInfo {
                index,
                name,
                kind: kind(props.device_type),
                api: format!(
                    "{}.{}.{}",
                    vk::api_version_major(v),
                    vk::api_version_minor(v),
                    vk::api_version_patch(v)
                ),
                int_dot: dot.shader_integer_dot_product == vk::TRUE,
                float64: features.shader_float64 == vk::TRUE,
                max_storage_range: props.limits.max_storage_buffer_range as u64,
            },
            family,
            dot_ext: !v13 && has_ext,
            props,
        });
    }
    Ok(out)
}

/// The devices the driver offers, in its order.
pub fn list() -> Result<Vec<DeviceInfo>, VulkanError> {
    let entry = load()?;
    let instance = instance(&entry)?;
    let r = candidates(&instance).map(|c| c.into_iter().map(|c| c.info).collect());
    // SAFETY: nothing made from the instance outlives this function.
    unsafe { instance.destroy_instance(None) };
    r
}

/// Which of the candidates to open: `want` by index, else the first discrete GPU, else the
/// first integrated one, else the first with a compute queue.
fn choose(c: &[Candidate], want: Option<usize>) -> Result<usize, VulkanError> {
    if let Some(index) = want {
        return match c.get(index) {
            Some(d) if d.family.is_some() => Ok(index),
            Some(_) => Err(VulkanError::NoDevice),
            None => Err(VulkanError::BadIndex {
                index,
                count: c.len(),
            }),
        };
    }
    let usable = |kind: &str| {
        c.iter()
            .position(|d| d.family.is_some() && (kind.is_empty() || d.info.kind == kind))
    };
    usable("discrete")
        .or_else(|| usable("integrated"))
        .or_else(|| usable(""))
        .ok_or(VulkanError::NoDevice)
}

impl Vk {
    /// Open device `want` (by index), or the best one present.
    pub fn open(want: Option<usize>) -> Result<Vk, VulkanError> {
        let entry = load()?;
        let instance = instance(&entry)?;
        match Self::open_on(entry, &instance, want) {
            Ok(vk) => Ok(vk),
            Err(e) => {
                // SAFETY: the device was not made (or was destroyed) on failure.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    fn open_on(
        entry: ash::Entry,
        instance: &ash::Instance,
        want: Option<usize>,
    ) -> Result<Vk, VulkanError> {
        let c = candidates(instance)?;
        let chosen = &c[choose(&c, want)?];
        let family = chosen.family.ok_or(VulkanError::NoDevice)?;
        let prio = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&prio)];
        let ext_names: Vec<*const std::ffi::c_char> = if chosen.dot_ext && chosen.info.int_dot {
            vec![ash::khr::shader_integer_dot_product::NAME.as_ptr()]
        } else {
            Vec::new()
        };
        let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
            .shader_integer_dot_product(true);
        let features = vk::PhysicalDeviceFeatures::default().shader_float64(chosen.info.float64);
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&ext_names)
            .enabled_features(&features);
        if chosen.info.int_dot {
            info = info.push_next(&mut dot);
        }
        // SAFETY: the create info and everything it points to outlive the call; the features
        // asked for are ones the device reported.
        let device =
            unsafe { instance.create_device(chosen.pd, &info, None) }.check("vkCreateDevice")?;
        // SAFETY: queue 0 of the family the device was made with.
        let queue = unsafe { device.get_device_queue(family, 0) };
        // SAFETY: a query of a live instance's device.
        let memory = unsafe { instance.get_physical_device_memory_properties(chosen.pd) };
        let limits = &chosen.props.limits;
        Ok(Vk {
            _entry: entry,
            instance: instance.clone(),
            device,
            queue: Mutex::new(queue),
            queue_family: family,
            memory,
            offset_align: limits.min_storage_buffer_offset_alignment.max(16),
            max_groups: limits.max_compute_work_group_count,
            kernels: Mutex::new(HashMap::new()),
            info: chosen.info.clone(),
        })
    }

    /// The index of a memory type among `allowed` (a bit mask) with all of `flags`.
    pub(crate) fn memory_type(&self, allowed: u32, flags: vk::MemoryPropertyFlags) -> Option<u32> {
        (0..self.memory.memory_type_count).find(|&i| {
            allowed & (1 << i) != 0
                && self.memory.memory_types[i as usize]
                    .property_flags
                    .contains(flags)
        })
    }

    /// The device's kernel `id`, built at first use.
    pub fn kernel(&self, id: KernelId) -> Result<Arc<Kernel>, VulkanError> {
        let mut ks = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = ks.get(&id) {
            return Ok(k.clone());
        }
        let k = Arc::new(Kernel::build(&self.device, id, self.info.int_dot)?);
        ks.insert(id, k.clone());
        Ok(k)
    }

    /// Wait until the device is idle (before destroying what it may use).
    pub fn wait_idle(&self) -> Result<(), VulkanError> {
        let _q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the queue is held, so no submission races the wait.
        unsafe { self.device.device_wait_idle() }.check("vkDeviceWaitIdle")
    }
}

impl Drop for Vk {
    fn drop(&mut self) {
        // SAFETY: everything made on the device (arenas, programs) holds an `Arc<Vk>`, so none
        // is alive here; waiting first lets any submitted work end.
        unsafe {
            let _ = self.device.device_wait_idle();
            for k in self
                .kernels
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .values()
            {
                k.destroy(&self.device);
            }
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// The device's name as the driver gives it, for messages.
pub fn describe(info: &DeviceInfo) -> String {
    format!(
        "{} ({}, Vulkan {}, integer dot {}, f64 {})",
        info.name,
        info.kind,
        info.api,
        if info.int_dot { "yes" } else { "no" },
        if info.float64 { "yes" } else { "no" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(kind: &'static str, compute: bool) -> Candidate {
        Candidate {
            pd: vk::PhysicalDevice::null(),
            info: DeviceInfo {
                index: 0,
                name: String::new(),
                kind,
                api: String::new(),
                int_dot: false,
                float64: false,
                max_storage_range: 0,
            },
            family: compute.then_some(0),
            dot_ext: false,
            props: vk::PhysicalDeviceProperties::default(),
        }
    }

    #[test]
    fn a_discrete_gpu_is_preferred_and_an_index_is_obeyed() {
        let c = [
            cand("cpu", true),
            cand("integrated", true),
            cand("discrete", true),
        ];
        assert_eq!(choose(&c, None), Ok(2));
        assert_eq!(choose(&c[..2], None), Ok(1));
        assert_eq!(choose(&c[..1], None), Ok(0));
        assert_eq!(choose(&c, Some(0)), Ok(0));
        assert_eq!(
            choose(&c, Some(3)),
            Err(VulkanError::BadIndex { index: 3, count: 3 })
        );
        assert_eq!(choose(&[], None), Err(VulkanError::NoDevice));
        // A device without a compute queue is never chosen.
        assert_eq!(
            choose(&[cand("discrete", false)], None),
            Err(VulkanError::NoDevice)
        );
        assert_eq!(
            choose(&[cand("discrete", false)], Some(0)),
            Err(VulkanError::NoDevice)
        );
    }
}
