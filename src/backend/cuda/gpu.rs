//! The GPU: its context, the one stream every op goes on, the compiled kernels, and a typed
//! launcher per kernel (the one place where argument lists meet `kernels/*.cu`).
//!
//! Buffers are addressed by raw device pointers (`u64`) taken once from the buffers a session
//! owns, so an op is a launch with pointers and sizes. Every device allocation goes through
//! [`Gpu::alloc`] / [`Gpu::upload`], which count them: the tests check that decode steps make
//! none.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaStream, LaunchConfig, PushKernelArg,
};

use super::blas::Blas;
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

/// An opened GPU with its kernels loaded: a real one through the driver, or the software GPU
/// of the tests ([`Gpu::emulated`]), which runs the same kernels on the host.
pub struct Gpu {
    engine: Engine,
    /// The stream of work that is not a session's (uploading weights).
    default: Stream,
    /// The device's name and the architecture the kernels were built for.
    pub name: String,
    pub arch: &'static str,
    allocations: AtomicUsize,
    allocated_bytes: AtomicUsize,
}

enum Engine {
    Cuda {
        ctx: Arc<CudaContext>,
        funcs: HashMap<String, CudaFunction>,
        /// Launch with programmatic stream serialization (sm_90 and later; on an H100 SmolLM2
        /// decoded 898 tok/s with it, 851 without, 2026-11-26, 32875fb): a kernel's blocks may
        /// be placed while the kernel before it in the stream finishes, and wait on the device
        /// (`pdl_begin` in common.cuh) until its writes are visible, instead of the launch
        /// waiting for it.
        pdl: bool,
        /// For prompt-sized products (none without libcublas).
        blas: Option<Mutex<Blas>>,
    },
    Emulated {
        launch: EmuLaunch,
        /// Held while a launch runs: the emulator runs one at a time.
        running: Mutex<()>,
        _lib: libloading::Library,
    },
}

/// An ordered queue of work on the GPU. Each session has its own, so that recording one
/// session's decode step never catches another's launches. The flag: its launches may be
/// programmatic (`Gpu::stream_in_order` makes one whose are not).
pub struct Stream(StreamKind, bool);

impl Stream {
    /// The driver's stream (none on the software GPU).
    pub fn cuda(&self) -> Option<&Arc<CudaStream>> {
        match &self.0 {
            StreamKind::Cuda(s) => Some(s),
            StreamKind::Emulated(_) => None,
        }
    }
}

enum StreamKind {
    Cuda(Arc<CudaStream>),
    /// The launches of a graph being recorded, if one is.
    Emulated(Mutex<Option<Vec<Launch>>>),
}

/// `kiln_emu_launch(name, grid, block, params)` of the emulator library.
type EmuLaunch = unsafe extern "C" fn(*const c_char, u32, u32, *mut *mut c_void) -> i32;

/// A recorded launch (the emulator's graphs are lists of them).
#[derive(Clone, Debug)]
pub struct Launch {
    name: CString,
    grid: u32,
    block: u32,
    args: Vec<Arg>,
}

/// A recorded sequence of launches, replayed as one.
pub enum Graph {
    Cuda(CudaGraph),
    Emulated(Vec<Launch>),
}

// SAFETY: a graph belongs to one session, which uses it from one thread at a time (a server's
// engine thread takes the session over from the thread that loaded it). cudarc's
// `CudaGraph::launch` makes the context current on the calling thread before it launches, and
// the driver's graph handles are not tied to the thread that made them.
unsafe impl Send for Graph {}

/// The compute capabilities kiln compiles native code for, and NVRTC's architecture of each.
pub const NATIVE_ARCHS: [((i32, i32), &str); 7] = [
    ((7, 5), "sm_75"),
    ((8, 0), "sm_80"),
    ((8, 6), "sm_86"),
    ((8, 9), "sm_89"),
    ((9, 0), "sm_90"),
    ((10, 0), "sm_100"),
    ((12, 0), "sm_120"),
];

/// The NVRTC architecture for a compute capability: native code for the GPUs kiln knows
/// ([`NATIVE_ARCHS`]), else PTX that the driver compiles for what it finds.
fn arch_for(major: i32, minor: i32) -> &'static str {
    NATIVE_ARCHS
        .iter()
        .find(|(cc, _)| *cc == (major, minor))
        .map_or("compute_75", |&(_, arch)| arch)
}

impl Gpu {
    /// Open GPU 0, build (or load from the cache) every kernel file, its parts in parallel
    /// ([`nvrtc::programs`]), and load its kernels.
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
        let programs = nvrtc::all_programs();
        let compiled = nvrtc::compile_all(&dir, &programs, arch)?;
        for ((label, src), c) in programs.iter().zip(compiled) {
            let module = match load_module(&ctx, c) {
                Ok(module) => module,
                // A cache entry the driver refuses (a damaged file): built again, stored over it.
                Err(_) => load_module(&ctx, nvrtc::rebuild(&dir, label, src, arch)?)?,
            };
            for entry in nvrtc::entries(src) {
                let f = module.load_function(&entry)?;
                funcs.insert(entry, f);
            }
        }
        Ok(Arc::new(Gpu {
            name: ctx.name()?,
            default: Stream(StreamKind::Cuda(stream), true),
            engine: Engine::Cuda {
                blas: Blas::new(&ctx)?.map(Mutex::new),
                pdl: major >= 9,
                ctx,
                funcs,
            },
            arch,
            allocations: AtomicUsize::new(0),
            allocated_bytes: AtomicUsize::new(0),
        }))
    }

    /// The software GPU: the library built from [`nvrtc::emulator_source`].
    pub fn emulated(lib: &std::path::Path) -> Result<Arc<Gpu>, CudaError> {
        let load_err = |e: libloading::Error| CudaError::Load {
            path: lib.display().to_string(),
            reason: e.to_string(),
        };
        // SAFETY: the library is kiln's emulator, whose initializers only set up its tables.
        let l = unsafe { libloading::Library::new(lib) }.map_err(load_err)?;
        // SAFETY: `kiln_emu_launch` has the type `EmuLaunch` in emulator source.
        let launch: EmuLaunch =
            *unsafe { l.get::<EmuLaunch>(b"kiln_emu_launch\0") }.map_err(load_err)?;
        Ok(Arc::new(Gpu {
            name: "software GPU (kiln's emulator)".into(),
            engine: Engine::Emulated {
                launch,
                running: Mutex::new(()),
                _lib: l,
            },
            default: Stream(StreamKind::Emulated(Mutex::new(None)), true),
            arch: "emulated",
            allocations: AtomicUsize::new(0),
            allocated_bytes: AtomicUsize::new(0),
        }))
    }

    /// The driver's context (none on the software GPU).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        match &self.engine {
            Engine::Cuda { ctx, .. } => Some(ctx),
            Engine::Emulated { .. } => None,
        }
    }

    /// Whether this is the software GPU.
    pub fn is_emulated(&self) -> bool {
        matches!(self.engine, Engine::Emulated { .. })
    }

    /// Device allocations made so far, and their bytes.
    pub fn allocations(&self) -> (usize, usize) {
        (
            self.allocations.load(Ordering::Relaxed),
            self.allocated_bytes.load(Ordering::Relaxed),
        )
    }

    /// Bytes free and total on the device.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        match &self.engine {
            Engine::Cuda { ctx, .. } => Ok(ctx.mem_get_info()?),
            Engine::Emulated { .. } => Err(CudaError::Unsupported(
                "device memory figures of the software GPU".into(),
            )),
        }
    }

    /// `y[t][r] = Σ_c w[r][c] · x[t][c]` by cuBLAS (bf16 w and x, or f32 ones with `f32`; f32
    /// y with rows `ldy` apart) on `s`, in `workspace`. `Ok(false)`: no cuBLAS here (the
    /// software GPU, or no library).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        f32: bool,
        s: &Stream,
        workspace: u64,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        n_tok: usize,
        ldy: usize,
    ) -> Result<bool, CudaError> {
        let (Engine::Cuda { blas: Some(b), .. }, StreamKind::Cuda(stream)) = (&self.engine, &s.0)
        else {
            return Ok(false);
        };
        let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
        b.gemm(f32, stream, workspace, w, x, y, rows, cols, n_tok, ldy)?;
        Ok(true)
    }

    /// Give the memory that freed allocations left in the driver's pool back to the device,
    /// so that free-memory figures count only live allocations.
    pub fn release_cached(&self) -> Result<(), CudaError> {
        let Engine::Cuda { ctx, .. } = &self.engine else {
            return Ok(());
        };
        ctx.synchronize()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: plain driver calls on this context's device; `pool` is written by the first.
        unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result()?;
            sys::cuMemPoolTrimTo(pool, 0).result()?;
        }
        Ok(())
    }

    /// A new stream.
    pub fn stream(&self) -> Result<Stream, CudaError> {
        Ok(Stream(self.new_stream_kind()?, true))
    }

    /// A new stream whose kernels start only once all work before them on it is done, event
    /// waits included (no programmatic launches): for kernels that wait on another stream's
    /// events (`step/ahead.rs`).
    pub fn stream_in_order(&self) -> Result<Stream, CudaError> {
        Ok(Stream(self.new_stream_kind()?, false))
    }

    fn new_stream_kind(&self) -> Result<StreamKind, CudaError> {
        Ok(match &self.engine {
            Engine::Cuda { ctx, .. } => StreamKind::Cuda(ctx.new_stream()?),
            Engine::Emulated { .. } => StreamKind::Emulated(Mutex::new(None)),
        })
    }

    /// The stream for work outside sessions.
    pub fn default_stream(&self) -> &Stream {
        &self.default
    }

    /// Wait until every launch on `s` so far has finished.
    pub fn synchronize(&self, s: &Stream) -> Result<(), CudaError> {
        match &s.0 {
            StreamKind::Cuda(stream) => Ok(stream.synchronize()?),
            StreamKind::Emulated(_) => Ok(()),
        }
    }

    /// Start recording the launches on `s` into a graph instead of running them.
    pub fn begin_capture(&self, s: &Stream) -> Result<(), CudaError> {
        match &s.0 {
            StreamKind::Cuda(stream) => {
                let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
                Ok(stream.begin_capture(mode)?)
            }
            StreamKind::Emulated(rec) => {
                *rec.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
                Ok(())
            }
        }
    }

    /// Stop recording on `s`; the graph of what was recorded.
    pub fn end_capture(&self, s: &Stream) -> Result<Graph, CudaError> {
        match &s.0 {
            StreamKind::Cuda(stream) => {
                match stream.end_capture(sys::CUgraphInstantiate_flags(0))? {
                    Some(g) => Ok(Graph::Cuda(g)),
                    None => Err(CudaError::Driver("graph capture recorded nothing".into())),
                }
            }
            StreamKind::Emulated(rec) => {
                let r = rec.lock().unwrap_or_else(|e| e.into_inner()).take();
                Ok(Graph::Emulated(r.unwrap_or_default()))
            }
        }
    }

    /// Run a recorded graph (on the stream it was recorded on).
    pub fn replay(&self, g: &Graph) -> Result<(), CudaError> {
        match g {
            Graph::Cuda(g) => Ok(g.launch()?),
            Graph::Emulated(launches) => {
                for l in launches {
                    self.emulate(l)?;
                }
                Ok(())
            }
        }
    }

    fn count(&self, bytes: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.allocated_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Launch kernel `name` on `s` over `grid` blocks of `block` threads (a programmatic
    /// launch where the GPU has them and the stream allows them: [`Gpu::stream_in_order`]).
    pub fn launch(
        &self,
        s: &Stream,
        name: &str,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let grid = grid.max(1);
        if trace_launches() {
            eprintln!("launch {name} grid {grid} block {block}");
        }
        match (&self.engine, &s.0) {
            (Engine::Cuda { funcs, pdl, .. }, StreamKind::Cuda(stream)) => {
                let f = funcs
                    .get(name)
                    .ok_or_else(|| CudaError::Driver(format!("no kernel named {name}")))?;
                if *pdl && s.1 {
                    return launch_programmatic(stream, f, grid, block, args);
                }
                let mut b = stream.launch_builder(f);
                for a in args {
                    match a {
                        Arg::P(v) => b.arg(v),
                        Arg::I(v) => b.arg(v),
                        Arg::L(v) => b.arg(v),
                        Arg::F(v) => b.arg(v),
                    };
                }
                let cfg = LaunchConfig {
                    grid_dim: (grid, 1, 1),
                    block_dim: (block, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the launches in `step` pass each kernel the arguments its definition
                // in kernels/*.cu declares, in order and width, with pointers into live buffers
                // of the sizes the kernel indexes (checked on the software GPU by the tests).
                unsafe { b.launch(cfg) }?;
                Ok(())
            }
            (Engine::Emulated { .. }, StreamKind::Emulated(rec)) => {
                let l = Launch {
                    name: CString::new(name)
                        .map_err(|_| CudaError::Driver(format!("bad kernel name {name:?}")))?,
                    grid,
                    block,
                    args: args.to_vec(),
                };
                let mut rec = rec.lock().unwrap_or_else(|e| e.into_inner());
                match rec.as_mut() {
                    Some(r) => {
                        r.push(l);
                        Ok(())
                    }
                    None => {
                        drop(rec);
                        self.emulate(&l)
                    }
                }
            }
            _ => Err(CudaError::Driver("a stream of another GPU".into())),
        }
    }

    /// Run one launch on the software GPU.
    fn emulate(&self, l: &Launch) -> Result<(), CudaError> {
        let Engine::Emulated {
            launch, running, ..
        } = &self.engine
        else {
            return Err(CudaError::Driver("not the software GPU".into()));
        };
        // One launch at a time: the emulator's fibers are global.
        let _one = running.lock().unwrap_or_else(|e| e.into_inner());
        let mut vals = l.args.clone();
        let mut params: Vec<*mut c_void> = vals.iter_mut().map(Arg::as_param).collect();
        // SAFETY: `params` holds one pointer per kernel parameter, to values of the parameter's
        // width that live across the call, as cuLaunchKernel's kernelParams; the pointers among
        // them address live host allocations of the software GPU's arenas.
        let rc = unsafe { launch(l.name.as_ptr(), l.grid, l.block, params.as_mut_ptr()) };
        match rc {
            0 => Ok(()),
            1 => Err(CudaError::Driver(format!("no kernel named {:?}", l.name))),
            _ => Err(CudaError::Driver(format!(
                "bad launch of {:?}: {} blocks of {}",
                l.name, l.grid, l.block
            ))),
        }
    }
}

/// Load a compiled program: its device code as it is, or its PTX (which the driver compiles)
/// where the driver refuses that (said under `KILN_CUDA_TRACE`).
fn load_module(
    ctx: &Arc<CudaContext>,
    c: nvrtc::Compiled,
) -> Result<Arc<cudarc::driver::CudaModule>, CudaError> {
    if let Some(cubin) = c.cubin {
        match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)) {
            Ok(module) => return Ok(module),
            Err(e) if trace_launches() => eprintln!("device code refused ({e}): loading PTX"),
            Err(_) => {}
        }
    }
    Ok(ctx.load_module(cudarc::nvrtc::Ptx::from_src(c.ptx))?)
}

/// Whether `KILN_CUDA_TRACE` asks for every launch on stderr (a graph's when it is recorded):
/// what a step launches, for comparing commits on the software GPU.
fn trace_launches() -> bool {
    crate::tuning::get().cuda_trace
}

/// Launch `f` on `stream` with programmatic stream serialization: the driver may start its
/// blocks before the kernel ahead of it has finished; the kernel's `pdl_begin` waits for that
/// one's writes on the device. (cudarc's launch builder sets no launch attributes.)
fn launch_programmatic(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: u32,
    block: u32,
    args: &[Arg],
) -> Result<(), CudaError> {
    stream.context().bind_to_thread()?;
    // On the stack: graphs are recorded once, but the output head launches every token.
    const MAX_ARGS: usize = 32;
    if args.len() > MAX_ARGS {
        return Err(CudaError::Driver(format!(
            "{} kernel arguments",
            args.len()
        )));
    }
    let mut vals = [Arg::I(0); MAX_ARGS];
    vals[..args.len()].copy_from_slice(args);
    let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
    for (p, v) in params.iter_mut().zip(&mut vals[..args.len()]) {
        *p = v.as_param();
    }
    // SAFETY: a zeroed attribute (plain integers and a union of plain data) with its id and
    // value then set, as the driver API documents for this attribute.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `params` holds one pointer per kernel parameter, to values of the parameter's
    // width that live across the call (as for `Gpu::launch`'s other path, the arguments are
    // those the kernel's definition declares, pointing into live buffers); `cfg` and `attr`
    // live across the call; the context is current on this thread.
    unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()?;
    }
    Ok(())
}

impl Arg {
    /// A pointer to this argument's value, as a kernel parameter.
    fn as_param(&mut self) -> *mut c_void {
        match self {
            Arg::P(v) => v as *mut u64 as *mut c_void,
            Arg::I(v) => v as *mut i32 as *mut c_void,
            Arg::L(v) => v as *mut i64 as *mut c_void,
            Arg::F(v) => v as *mut f32 as *mut c_void,
        }
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
    mem: Memory,
    base: u64,
    bytes: usize,
}

enum Memory {
    /// `cuMemAlloc` memory (not the stream-ordered pool: its reservations grow in large steps
    /// and outlive frees, so the driver's free memory would not follow the plan), with the
    /// context it belongs to.
    Cuda(u64, Arc<CudaContext>),
    /// The software GPU's memory: host memory, reached only through raw pointers (the kernels
    /// write it through the addresses they are given).
    Host(*mut u8, std::alloc::Layout),
}

// SAFETY: the host memory of the software GPU is owned by the arena alone and reached through
// its methods or by the kernels, which the GPU runs one at a time.
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only reads it (`read`), and `write` needs `&mut`.
unsafe impl Sync for Arena {}

impl Arena {
    /// `bytes` zeroed bytes of device memory (at least one, so it has an address).
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Arena, CudaError> {
        let n = bytes.max(1);
        gpu.count(n);
        let mem = match &gpu.default.0 {
            StreamKind::Cuda(stream) => {
                let ctx = stream.context().clone();
                ctx.bind_to_thread()?;
                // SAFETY: a plain allocation of `n > 0` bytes in the bound context, zeroed
                // before anything else can use it; freed once, in `drop`.
                let p = unsafe {
                    let p = cudarc::driver::result::malloc_sync(n)?;
                    cudarc::driver::result::memset_d8_sync(p, 0, n)?;
                    p
                };
                Memory::Cuda(p, ctx)
            }
            StreamKind::Emulated(_) => {
                let layout = std::alloc::Layout::from_size_align(n, ALIGN)
                    .map_err(|e| CudaError::Driver(e.to_string()))?;
                // SAFETY: the layout has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                if p.is_null() {
                    return Err(CudaError::Driver(format!("out of host memory ({n} bytes)")));
                }
                Memory::Host(p, layout)
            }
        };
        let base = match &mem {
            Memory::Cuda(p, _) => *p,
            Memory::Host(p, _) => *p as u64,
        };
        Ok(Arena {
            mem,
            base,
            bytes: n,
        })
    }

    /// Bytes of the allocation.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device address of offset `off`.
    pub fn ptr(&self, off: usize) -> u64 {
        self.base + off as u64
    }

    /// Copy `data` to offset `off`, in order with the other work on `s`.
    pub fn write(&mut self, s: &Stream, off: usize, data: &[u8]) -> Result<(), CudaError> {
        self.check(off, data.len())?;
        match (&mut self.mem, &s.0) {
            (Memory::Cuda(p, _), StreamKind::Cuda(stream)) => {
                // SAFETY: `off + len` is inside the allocation (checked); the copy from
                // pageable memory has read `data` when the call returns.
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(
                        *p + off as u64,
                        data,
                        stream.cu_stream(),
                    )?
                };
                Ok(())
            }
            (Memory::Host(p, _), _) => {
                // SAFETY: `off + len` is inside the allocation (checked), which no kernel is
                // using now (the software GPU runs launches to completion).
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(off), data.len()) };
                Ok(())
            }
            _ => Err(CudaError::Driver("arena of another GPU".into())),
        }
    }

    /// Copy `out.len()` bytes from offset `off` after the work on `s`, and wait for them.
    pub fn read(&self, s: &Stream, off: usize, out: &mut [u8]) -> Result<(), CudaError> {
        self.check(off, out.len())?;
        match (&self.mem, &s.0) {
            (Memory::Cuda(p, _), StreamKind::Cuda(stream)) => {
                // SAFETY: `off + len` is inside the allocation (checked); `out` outlives the
                // copy, which the synchronize below waits for.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        out,
                        *p + off as u64,
                        stream.cu_stream(),
                    )?
                };
                Ok(stream.synchronize()?)
            }
            (Memory::Host(p, _), _) => {
                // SAFETY: as in `write`.
                unsafe { std::ptr::copy_nonoverlapping(p.add(off), out.as_mut_ptr(), out.len()) };
                Ok(())
            }
            _ => Err(CudaError::Driver("arena of another GPU".into())),
        }
    }

    fn check(&self, off: usize, len: usize) -> Result<(), CudaError> {
        match off.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(CudaError::Driver(format!(
                "{len} bytes at {off} past an allocation of {}",
                self.bytes
            ))),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        match &self.mem {
            Memory::Host(p, layout) => {
                // SAFETY: allocated in `new` with this layout, freed once.
                unsafe { std::alloc::dealloc(*p, *layout) };
            }
            Memory::Cuda(p, ctx) => {
                // Work on the memory must end first; errors cannot be reported from here.
                let _ = ctx.bind_to_thread().and_then(|()| ctx.synchronize());
                // SAFETY: allocated in `new`, freed once; no work uses it any more.
                let _ = unsafe { cudarc::driver::result::free_sync(*p) };
            }
        }
    }
}

/// Blocks for a grid-stride loop over `n` elements with 256 threads.
pub fn blocks_for(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 65_535) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_every_buffer_and_its_end() {
        let mut l = Layout::default();
        assert_eq!(l.take(10), 0);
        assert_eq!(l.take(256), 256);
        assert_eq!(l.take(0), 512);
        assert_eq!(l.take(1), 512);
        assert_eq!(l.bytes, 768);
        // The total is the sum of the rounded sizes, whatever their order.
        let sizes = [3usize, 700, 256, 1, 4096];
        let total = |order: &[usize]| {
            let mut l = Layout::default();
            order.iter().for_each(|&n| {
                l.take(n);
            });
            l.bytes
        };
        let mut rev = sizes;
        rev.reverse();
        assert_eq!(total(&sizes), total(&rev));
        assert_eq!(
            total(&sizes),
            sizes
                .iter()
                .map(|n| n.next_multiple_of(ALIGN))
                .sum::<usize>()
        );
    }

    #[test]
    fn blocks_cover_the_elements_within_the_grid_limit() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(256), 1);
        assert_eq!(blocks_for(257), 2);
        assert_eq!(blocks_for(usize::MAX / 2), 65_535);
    }
}
