//! Page-locked host memory, the strided copies between it and a device arena, and the events
//! that order two streams: what a KV cache offloaded to host memory streams through
//! (`step/offload.rs`).
//!
//! Page-locked (pinned) memory is what the GPU's copy engines read and write directly, so a
//! copy on a stream runs beside the kernels of another. On the software GPU, host memory is
//! device memory: a copy is a `memcpy` when it is issued, and events order nothing (its
//! launches run to completion when they are issued).

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaEvent};

use super::gpu::{Arena, Gpu, Stream, ALIGN};
use super::CudaError;

/// One allocation of page-locked host memory.
pub struct HostArena {
    mem: HostMem,
    bytes: usize,
}

enum HostMem {
    /// `cuMemHostAlloc` memory, with the context it belongs to.
    Cuda(*mut u8, Arc<CudaContext>),
    /// The software GPU's: plain host memory.
    Host(*mut u8, std::alloc::Layout),
}

// SAFETY: the memory is owned by the arena alone and reached through its methods: copies the
// GPU runs in stream order, on the streams of the one session that owns the arena.
unsafe impl Send for HostArena {}

/// A strided copy between a device arena and a host arena: `height` runs of `width` bytes,
/// `pitch` bytes apart on both sides (the same layout at both ends), from the offsets given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub dev_off: usize,
    pub host_off: usize,
    pub width: usize,
    pub height: usize,
    pub pitch: usize,
}

impl Strided {
    /// The byte past the last one touched, from offset `off`.
    fn end(&self, off: usize) -> Option<usize> {
        let last = self.height.checked_sub(1)?.checked_mul(self.pitch)?;
        off.checked_add(last)?.checked_add(self.width)
    }
}

impl HostArena {
    /// `bytes` zeroed bytes of page-locked host memory (at least one).
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<HostArena, CudaError> {
        let n = bytes.max(1);
        let mem = match gpu.context() {
            Some(ctx) => {
                ctx.bind_to_thread()?;
                // SAFETY: a plain allocation of `n > 0` bytes in the bound context, zeroed
                // before anything else can use it; freed once, in `drop`.
                let p = unsafe {
                    let p = cudarc::driver::result::malloc_host(n, 0).map_err(|e| {
                        CudaError::Driver(format!("{n} bytes of page-locked host memory: {e}"))
                    })? as *mut u8;
                    std::ptr::write_bytes(p, 0, n);
                    p
                };
                HostMem::Cuda(p, ctx.clone())
            }
            None => {
                let layout = std::alloc::Layout::from_size_align(n, ALIGN)
                    .map_err(|e| CudaError::Driver(e.to_string()))?;
                // SAFETY: the layout has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                if p.is_null() {
                    return Err(CudaError::Driver(format!("out of host memory ({n} bytes)")));
                }
                HostMem::Host(p, layout)
            }
        };
        Ok(HostArena { mem, bytes: n })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn base(&self) -> *mut u8 {
        match self.mem {
            HostMem::Cuda(p, _) | HostMem::Host(p, _) => p,
        }
    }

    fn check(&self, dev: &Arena, c: &Strided) -> Result<(), CudaError> {
        let fits = |end: Option<usize>, len: usize| end.is_some_and(|e| e <= len);
        if c.width > c.pitch && c.height > 1
            || !fits(c.end(c.host_off), self.bytes)
            || !fits(c.end(c.dev_off), dev.bytes())
        {
            return Err(CudaError::Driver(format!(
                "strided copy {c:?} past a host allocation of {} or a device one of {}",
                self.bytes,
                dev.bytes()
            )));
        }
        Ok(())
    }

    /// Copy `c` from this host memory into `dev`, in order with the other work on `s`.
    pub fn to_device(&self, s: &Stream, dev: &Arena, c: Strided) -> Result<(), CudaError> {
        self.copy(s, dev, c, true)
    }

    /// Copy `c` from `dev` into this host memory, in order with the other work on `s`.
    pub fn from_device(&mut self, s: &Stream, dev: &Arena, c: Strided) -> Result<(), CudaError> {
        self.copy(s, dev, c, false)
    }

    fn copy(&self, s: &Stream, dev: &Arena, c: Strided, up: bool) -> Result<(), CudaError> {
        self.check(dev, &c)?;
        if c.width == 0 || c.height == 0 {
            return Ok(());
        }
        let host = self.base().wrapping_add(c.host_off);
        let device = dev.ptr(c.dev_off);
        match (&self.mem, s.cuda()) {
            (HostMem::Cuda(..), Some(stream)) => {
                use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
                // Every field written out: the memory-type enums have no zero value, so an
                // all-zero struct is not a valid value (Rust refuses `mem::zeroed` on it).
                let (src_type, dst_type) = if up {
                    (CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE)
                } else {
                    (CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST)
                };
                let p = sys::CUDA_MEMCPY2D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: src_type,
                    srcHost: if up {
                        host as *const _
                    } else {
                        std::ptr::null()
                    },
                    srcDevice: if up { 0 } else { device },
                    srcArray: std::ptr::null_mut(),
                    srcPitch: c.pitch,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: dst_type,
                    dstHost: if up {
                        std::ptr::null_mut()
                    } else {
                        host as *mut _
                    },
                    dstDevice: if up { device } else { 0 },
                    dstArray: std::ptr::null_mut(),
                    dstPitch: c.pitch,
                    WidthInBytes: c.width,
                    Height: c.height,
                };
                // SAFETY: both ranges lie inside their allocations (checked above), which
                // outlive the copy: the session that owns them waits for its streams before
                // it frees them (`Drop` of `Arena` synchronizes the context).
                unsafe { sys::cuMemcpy2DAsync_v2(&p, stream.cu_stream()).result()? };
                Ok(())
            }
            (HostMem::Host(..), None) => {
                let device = device as *mut u8;
                for r in 0..c.height {
                    let (h, d) = (
                        host.wrapping_add(r * c.pitch),
                        device.wrapping_add(r * c.pitch),
                    );
                    let (src, dst) = if up { (h, d) } else { (d, h) };
                    // SAFETY: both runs lie inside their allocations (checked above), which
                    // are distinct (host memory of two arenas); the software GPU runs no
                    // kernel while this copies.
                    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, c.width) };
                }
                Ok(())
            }
            _ => Err(CudaError::Driver("host memory of another GPU".into())),
        }
    }
}

impl Drop for HostArena {
    fn drop(&mut self) {
        match &self.mem {
            HostMem::Host(p, layout) => {
                // SAFETY: allocated in `new` with this layout, freed once.
                unsafe { std::alloc::dealloc(*p, *layout) };
            }
            HostMem::Cuda(p, ctx) => {
                // Copies into or out of it must end first; errors cannot be reported here.
                let _ = ctx.bind_to_thread().and_then(|()| ctx.synchronize());
                // SAFETY: allocated in `new`, freed once; no copy uses it any more.
                let _ = unsafe { cudarc::driver::result::free_host(*p as *mut _) };
            }
        }
    }
}

/// A point in a stream's work that another stream can wait for.
pub struct Event(Option<CudaEvent>);

impl Event {
    /// A new event (recording it is `record`).
    pub fn new(gpu: &Gpu) -> Result<Event, CudaError> {
        Ok(Event(match gpu.context() {
            Some(ctx) => Some(ctx.new_event(None)?),
            None => None,
        }))
    }

    /// Mark the work issued on `s` so far.
    pub fn record(&self, s: &Stream) -> Result<(), CudaError> {
        match (&self.0, s.cuda()) {
            (Some(e), Some(stream)) => Ok(e.record(stream)?),
            _ => Ok(()),
        }
    }

    /// Make the work issued on `s` from now on wait for the work this event last marked (at
    /// once if it never marked any).
    pub fn wait_on(&self, s: &Stream) -> Result<(), CudaError> {
        match (&self.0, s.cuda()) {
            (Some(e), Some(stream)) => Ok(stream.wait(e)?),
            _ => Ok(()),
        }
    }
}
