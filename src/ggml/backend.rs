//! Backends (compute devices), their buffers, and the graph allocator.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use super::context::Context;
use super::error::GgmlError;
use super::graph::Graph;
use super::sys;

/// What kind of device a backend runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accelerator,
}

/// One entry of ggml's device registry.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub description: String,
    pub kind: DeviceKind,
    pub memory_free: usize,
    pub memory_total: usize,
}

/// Which device to run on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The best GPU when one was compiled in and found, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A device by its registry name (see `--list-devices`), case-insensitive.
    Named(String),
}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings owned by the (static) registry.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn device_info(dev: sys::ggml_backend_dev_t) -> DeviceInfo {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: `dev` comes from the registry and stays valid for the program's lifetime.
    unsafe { sys::ggml_backend_dev_memory(dev, &mut free, &mut total) };
    // SAFETY: as above.
    let kind = match unsafe { sys::ggml_backend_dev_type(dev) } {
        sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
        sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
        sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
        _ => DeviceKind::Accelerator,
    };
    DeviceInfo {
        // SAFETY: as above.
        name: cstr(unsafe { sys::ggml_backend_dev_name(dev) }),
        // SAFETY: as above.
        description: cstr(unsafe { sys::ggml_backend_dev_description(dev) }),
        kind,
        memory_free: free,
        memory_total: total,
    }
}

fn devices() -> Vec<sys::ggml_backend_dev_t> {
    // SAFETY: registry queries; backends are linked statically and registered at start-up.
    let n = unsafe { sys::ggml_backend_dev_count() };
    // SAFETY: index < count.
    (0..n)
        .map(|i| unsafe { sys::ggml_backend_dev_get(i) })
        .collect()
}

/// All devices ggml can run on in this build.
pub fn list_devices() -> Vec<DeviceInfo> {
    devices().into_iter().map(device_info).collect()
}

/// An initialised compute backend.
pub struct Backend {
    raw: NonNull<sys::ggml_backend>,
    dev: sys::ggml_backend_dev_t,
    info: DeviceInfo,
}

impl Backend {
    /// Opens the device chosen by `choice`; `threads` applies to the CPU backend.
    pub fn new(choice: &BackendChoice, threads: usize) -> Result<Self, GgmlError> {
        let all = devices();
        let dev = match choice {
            BackendChoice::Cpu => all
                .iter()
                .copied()
                .find(|&d| device_info(d).kind == DeviceKind::Cpu),
            BackendChoice::Auto => all
                .iter()
                .copied()
                .find(|&d| device_info(d).kind == DeviceKind::Gpu)
                .or_else(|| {
                    all.iter()
                        .copied()
                        .find(|&d| device_info(d).kind == DeviceKind::IntegratedGpu)
                })
                .or_else(|| {
                    all.iter()
                        .copied()
                        .find(|&d| device_info(d).kind == DeviceKind::Cpu)
                }),
            BackendChoice::Named(name) => all
                .iter()
                .copied()
                .find(|&d| device_info(d).name.eq_ignore_ascii_case(name)),
        };
        let name = match choice {
            BackendChoice::Named(n) => n.clone(),
            _ => "cpu".to_string(),
        };
        let dev = dev.ok_or_else(|| GgmlError::UnknownDevice(name.clone()))?;
        let info = device_info(dev);
        // SAFETY: `dev` is a registry device; null params select defaults.
        let raw = unsafe { sys::ggml_backend_dev_init(dev, std::ptr::null()) };
        let raw = NonNull::new(raw).ok_or(GgmlError::DeviceInit(info.name.clone()))?;
        let backend = Self { raw, dev, info };
        backend.set_threads(threads);
        Ok(backend)
    }

    /// The CPU backend with `threads` threads.
    pub fn cpu(threads: usize) -> Result<Self, GgmlError> {
        Self::new(&BackendChoice::Cpu, threads)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn is_cpu(&self) -> bool {
        self.info.kind == DeviceKind::Cpu
    }

    /// Sets the CPU thread count (no effect on other devices).
    pub fn set_threads(&self, threads: usize) {
        if self.is_cpu() {
            // SAFETY: the backend is a live CPU backend.
            unsafe {
                sys::ggml_backend_cpu_set_n_threads(self.raw.as_ptr(), threads.max(1) as i32)
            };
        }
    }

    /// (free, total) bytes on the device right now.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: registry device of a live backend.
        unsafe { sys::ggml_backend_dev_memory(self.dev, &mut free, &mut total) };
        (free, total)
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_backend {
        self.raw.as_ptr()
    }

    /// Allocates backend memory for every tensor of `ctx` that has none yet.
    pub fn alloc_context(&self, ctx: &Context, what: &str) -> Result<Buffer, GgmlError> {
        let bytes: usize = ctx.tensors().iter().map(|t| t.n_bytes()).sum();
        // SAFETY: live context and backend; returns null on allocation failure.
        let raw = unsafe { sys::ggml_backend_alloc_ctx_tensors(ctx.raw(), self.raw()) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Buffer { raw }),
            None if bytes == 0 => Ok(Buffer::empty(self)?),
            None => Err(GgmlError::OutOfMemory {
                device: self.info.name.clone(),
                what: what.to_string(),
                bytes,
            }),
        }
    }

    /// Runs a graph whose tensors are all allocated.
    pub fn compute(&self, graph: &Graph<'_>) -> Result<(), GgmlError> {
        // SAFETY: live backend and graph; all tensors were allocated by the caller.
        let status = unsafe { sys::ggml_backend_graph_compute(self.raw(), graph.raw()) };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            // SAFETY: ggml returns a static string for any status value.
            let text = cstr(unsafe { sys::ggml_status_to_string(status) });
            Err(GgmlError::Compute {
                device: self.info.name.clone(),
                status: text,
            })
        }
    }

    /// Opens a device by registry name, returning a clear error when it is unknown.
    pub fn by_name(name: &str, threads: usize) -> Result<Self, GgmlError> {
        let _ = CString::new(name).map_err(|_| GgmlError::UnknownDevice(name.to_string()))?;
        Self::new(&BackendChoice::Named(name.to_string()), threads)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: we own the backend and free it exactly once.
        unsafe { sys::ggml_backend_free(self.raw.as_ptr()) }
    }
}

/// A backend memory buffer; tensors allocated in it stay valid while it lives.
pub struct Buffer {
    raw: NonNull<sys::ggml_backend_buffer>,
}

impl Buffer {
    fn empty(backend: &Backend) -> Result<Self, GgmlError> {
        // SAFETY: live backend; a zero-size buffer is valid in ggml.
        let raw = unsafe {
            sys::ggml_backend_buft_alloc_buffer(
                sys::ggml_backend_get_default_buffer_type(backend.raw()),
                0,
            )
        };
        NonNull::new(raw)
            .map(|raw| Self { raw })
            .ok_or(GgmlError::OutOfMemory {
                device: backend.name().to_string(),
                what: "empty buffer".into(),
                bytes: 0,
            })
    }

    pub fn size(&self) -> usize {
        // SAFETY: live buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.raw.as_ptr()) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: we own the buffer and free it exactly once.
        unsafe { sys::ggml_backend_buffer_free(self.raw.as_ptr()) }
    }
}

/// ggml's graph allocator: places a graph's intermediate tensors in one reusable buffer.
pub struct Gallocr {
    raw: NonNull<sys::ggml_gallocr>,
    device: String,
}

impl Gallocr {
    pub fn new(backend: &Backend) -> Result<Self, GgmlError> {
        // SAFETY: live backend's default buffer type.
        let raw = unsafe {
            sys::ggml_gallocr_new(sys::ggml_backend_get_default_buffer_type(backend.raw()))
        };
        NonNull::new(raw)
            .map(|raw| Self {
                raw,
                device: backend.name().to_string(),
            })
            .ok_or(GgmlError::OutOfMemory {
                device: backend.name().to_string(),
                what: "graph allocator".into(),
                bytes: 0,
            })
    }

    /// Bytes the compute buffer needs for `graph`, measured without allocating anything.
    /// The allocator is left marked as reserved for `graph` without memory: use a throwaway
    /// allocator for measuring, never one that will allocate afterwards.
    pub fn measure(&mut self, graph: &Graph<'_>) -> usize {
        let mut size = 0usize;
        // SAFETY: one buffer (id 0, null id arrays select it); `size` has room for it.
        unsafe {
            sys::ggml_gallocr_reserve_n_size(
                self.raw.as_ptr(),
                graph.raw(),
                std::ptr::null(),
                std::ptr::null(),
                &mut size,
            )
        };
        size
    }

    /// Bytes the compute buffer needs for `graph` (reserves it).
    pub fn reserve(&mut self, graph: &Graph<'_>) -> Result<usize, GgmlError> {
        // SAFETY: live allocator and graph.
        let ok = unsafe { sys::ggml_gallocr_reserve(self.raw.as_ptr(), graph.raw()) };
        let size = self.buffer_size();
        if ok {
            Ok(size)
        } else {
            Err(GgmlError::OutOfMemory {
                device: self.device.clone(),
                what: "compute buffer".into(),
                bytes: size,
            })
        }
    }

    /// Allocates every unallocated tensor of `graph`.
    pub fn alloc(&mut self, graph: &Graph<'_>) -> Result<(), GgmlError> {
        // SAFETY: live allocator and graph.
        let ok = unsafe { sys::ggml_gallocr_alloc_graph(self.raw.as_ptr(), graph.raw()) };
        if ok {
            Ok(())
        } else {
            Err(GgmlError::OutOfMemory {
                device: self.device.clone(),
                what: "compute buffer".into(),
                bytes: self.buffer_size(),
            })
        }
    }

    pub fn buffer_size(&self) -> usize {
        // SAFETY: live allocator; buffer 0 is the only one we use.
        unsafe { sys::ggml_gallocr_get_buffer_size(self.raw.as_ptr(), 0) }
    }
}

impl Drop for Gallocr {
    fn drop(&mut self) {
        // SAFETY: we own the allocator and free it exactly once.
        unsafe { sys::ggml_gallocr_free(self.raw.as_ptr()) }
    }
}
