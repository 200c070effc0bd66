//! The GPU: its context, the one stream every op goes on, the compiled kernels, and a typed
//! launcher per kernel (the one place where argument lists meet `kernels/*.cu`).
//!
//! Buffers are addressed by raw device pointers (`u64`) taken once from the buffers a session
//! owns, so an op is a launch with pointers and sizes. Every device allocation goes through
//! [`Gpu::alloc`] / [`Gpu::upload`], which count them: the tests check that decode steps make
//! none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};

use super::{nvrtc, CudaError};

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

/// One kernel argument (pointers as `u64`, C `int` as `I`, `long` as `L`, `float` as `F`).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

/// An opened GPU with its kernels loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    funcs: HashMap<String, CudaFunction>,
    /// The device's name and the architecture the kernels were built for.
    pub name: String,
    pub arch: &'static str,
    allocations: AtomicUsize,
    allocated_bytes: AtomicUsize,
}

/// The NVRTC architecture for a compute capability: native code for the GPUs kiln knows,
/// else PTX that the driver compiles for what it finds.
fn arch_for(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => "compute_75",
    }
}

impl Gpu {
    /// Open GPU 0, build (or load from the cache) every kernel file, and load its kernels.
    pub fn open() -> Result<Arc<Gpu>, CudaError> {
        if !super::driver_present() {
            return Err(CudaError::NoDriver);
        }
        let ctx = CudaContext::new(0)?;
        // SAFETY: kiln uses one stream per GPU, so cudarc's cross-stream events are not needed;
        // without them, a decode step can be captured into a graph.
        unsafe { ctx.disable_event_tracking() };
        // Not the legacy default stream: that one cannot be captured.
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_for(major, minor);
        let dir = nvrtc::cache_dir();
        let mut funcs = HashMap::new();
        for (file, src) in nvrtc::KERNELS {
            let ptx = nvrtc::compile_cached(&dir, file, src, arch)?;
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx))?;
            for entry in nvrtc::entries(src) {
                let f = module.load_function(&entry)?;
                funcs.insert(entry, f);
            }
        }
        Ok(Arc::new(Gpu {
            name: ctx.name()?,
            ctx,
            stream,
            funcs,
            arch,
            allocations: AtomicUsize::new(0),
            allocated_bytes: AtomicUsize::new(0),
        }))
    }

    /// Device allocations made so far, and their bytes.
    pub fn allocations(&self) -> (usize, usize) {
        (
            self.allocations.load(Ordering::Relaxed),
            self.allocated_bytes.load(Ordering::Relaxed),
        )
    }

    fn count<T>(&self, n: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.allocated_bytes
            .fetch_add(n * std::mem::size_of::<T>(), Ordering::Relaxed);
    }

    /// `n` zeroed elements on the device (at least one, so every buffer has an address).
    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.count::<T>(n.max(1));
        Ok(self.stream.alloc_zeros::<T>(n.max(1))?)
    }

    /// A copy of `host` on the device.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.count::<T>(host.len());
        Ok(self.stream.clone_htod(host)?)
    }

    /// The device address of a buffer.
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    /// Copy `host` into the start of `dst` (stream-ordered).
    pub fn write<T: DeviceRepr>(
        &self,
        host: &[T],
        dst: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        let mut view = dst.slice_mut(..host.len());
        Ok(self.stream.memcpy_htod(host, &mut view)?)
    }

    /// Copy the first `host.len()` elements of `src` at element offset `at` into `host`, and
    /// wait for it.
    pub fn read<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        at: usize,
        host: &mut [T],
    ) -> Result<(), CudaError> {
        let view = src.slice(at..at + host.len());
        self.stream.memcpy_dtoh(&view, host)?;
        Ok(self.stream.synchronize()?)
    }

    /// Bytes free and total on the device.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Launch kernel `name` over `grid` blocks of `block` threads.
    pub fn launch(&self, name: &str, grid: u32, block: u32, args: &[Arg]) -> Result<(), CudaError> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::Driver(format!("no kernel named {name}")))?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(v) => b.arg(v),
                Arg::I(v) => b.arg(v),
                Arg::L(v) => b.arg(v),
                Arg::F(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.max(1), 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the typed launchers in `ops` pass each kernel the arguments its definition in
        // kernels/*.cu declares, in order and width, with pointers into live buffers of the
        // sizes the kernel indexes (checked by the op tests against the CPU).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// Alignment of every buffer in an arena (what `cudaMalloc` guarantees).
pub const ALIGN: usize = 256;

/// Buffers packed one after another, each starting and ending on [`ALIGN`]: the byte offsets of
/// one device allocation, computed before it is made (the memory plan uses the same).
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    pub bytes: usize,
}

impl Layout {
    /// Room for `n` bytes; returns their offset.
    pub fn take(&mut self, n: usize) -> usize {
        let off = self.bytes;
        self.bytes = (off + n).next_multiple_of(ALIGN);
        off
    }
}

/// One device allocation holding many buffers at [`Layout`] offsets.
pub struct Arena {
    buf: CudaSlice<u8>,
    base: u64,
}

impl Arena {
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Arena, CudaError> {
        let buf = gpu.alloc::<u8>(bytes)?;
        let base = gpu.ptr(&buf);
        Ok(Arena { buf, base })
    }

    /// The device address of offset `off`.
    pub fn ptr(&self, off: usize) -> u64 {
        self.base + off as u64
    }

    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// Copy `data` to offset `off`.
    pub fn write(&mut self, gpu: &Gpu, off: usize, data: &[u8]) -> Result<(), CudaError> {
        let mut view = self.buf.slice_mut(off..off + data.len());
        Ok(gpu.stream.memcpy_htod(data, &mut view)?)
    }

    /// Copy `out.len()` bytes from offset `off`, and wait for them.
    pub fn read(&self, gpu: &Gpu, off: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let view = self.buf.slice(off..off + out.len());
        gpu.stream.memcpy_dtoh(&view, out)?;
        Ok(gpu.stream.synchronize()?)
    }
}

/// Blocks for a grid-stride loop over `n` elements with 256 threads.
pub fn blocks_for(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 65_535) as u32
}
