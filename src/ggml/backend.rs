//! Backends (compute devices), their buffers, and the graph allocator.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use super::context::{Context, Tensor};
use super::error::GgmlError;
use super::graph::{sealed_ptr, ComputeGraph};
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

pub(super) fn device_info(dev: sys::ggml_backend_dev_t) -> DeviceInfo {
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

pub(super) fn devices() -> Vec<sys::ggml_backend_dev_t> {
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
        let raw = init_device(dev).ok_or(GgmlError::DeviceInit(info.name.clone()))?;
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

    pub(super) fn raw(&self) -> *mut sys::ggml_backend {
        self.raw.as_ptr()
    }

    /// Allocates backend memory for every tensor of `ctx` that has none yet. Only
    /// [`super::Arena`] calls this: it keeps the buffer with the context, so the tensors
    /// never outlive their memory.
    pub(super) fn alloc_context(&self, ctx: &Context, what: &str) -> Result<Buffer, GgmlError> {
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

    /// Runs a graph. Every node and every tensor it reads must have memory that is still
    /// bound (see [`Tensor::check_bound`]); otherwise this returns an error naming the tensor
    /// instead of letting the kernels read freed or missing memory.
    pub fn compute<G: ComputeGraph>(&self, graph: &G) -> Result<(), GgmlError> {
        // Nothing to run (every output already existed); some backends (RPC) assert on it.
        if graph_nodes(graph).next().is_none() {
            return Ok(());
        }
        // Leaves in the node list (a sub-graph's sizing pads) are not computed by ggml.
        for node in graph_nodes(graph).filter(|n| !n.is_leaf()) {
            node.check_bound()?;
            for src in node.srcs() {
                src.check_bound()?;
            }
        }
        self.check_supported(graph)?;
        // SAFETY: live backend and graph; every tensor it touches was checked to be bound.
        let status = unsafe { sys::ggml_backend_graph_compute(self.raw(), sealed_ptr(graph)) };
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

    /// Whether this device has a kernel for the op that made `t` (the CPU runs every op we
    /// build), so graph builders can pick another formulation before committing to it.
    pub fn supports(&self, t: Tensor<'_>) -> bool {
        // SAFETY: registry device and a live tensor.
        self.is_cpu() || unsafe { sys::ggml_backend_dev_supports_op(self.dev, t.raw()) }
    }

    /// A device that lacks a kernel for some op would abort or compute garbage inside ggml:
    /// refuse the graph up front, naming the op. The CPU runs every op we build.
    fn check_supported<G: ComputeGraph>(&self, graph: &G) -> Result<(), GgmlError> {
        if self.is_cpu() {
            return Ok(());
        }
        for node in graph_nodes(graph).filter(|n| !n.is_leaf()) {
            if !self.supports(node) {
                let types = node
                    .srcs()
                    .iter()
                    .map(|s| {
                        let [a, b, c, d] = s.ne();
                        format!("{} {a}×{b}×{c}×{d}", s.ty())
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(GgmlError::UnsupportedOp {
                    device: self.info.name.clone(),
                    op: node.op_name(),
                    tensor: node.name(),
                    types: format!("[{types}] -> {}", node.ty()),
                });
            }
        }
        Ok(())
    }

    /// Whether the device copies asynchronously (host→device transfers can overlap compute).
    pub fn supports_async(&self) -> bool {
        if self.is_cpu() {
            return false;
        }
        // SAFETY: zeroed props are a valid out-parameter; `dev` is a registry device.
        let mut props: sys::ggml_backend_dev_props = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { sys::ggml_backend_dev_get_props(self.dev, &mut props) };
        props.caps.async_
    }

    /// Waits for all queued work (computes, async copies) of this backend instance.
    pub fn synchronize(&self) {
        // SAFETY: live backend.
        unsafe { sys::ggml_backend_synchronize(self.raw()) }
    }

    /// Another instance on the same device (its own queue/stream), for async copies.
    pub fn new_stream(&self) -> Result<Backend, GgmlError> {
        let raw = init_device(self.dev).ok_or(GgmlError::DeviceInit(self.info.name.clone()))?;
        Ok(Self {
            raw,
            dev: self.dev,
            info: self.info.clone(),
        })
    }

    fn buffer_type(&self) -> sys::ggml_backend_buffer_type_t {
        // SAFETY: live backend.
        unsafe { sys::ggml_backend_get_default_buffer_type(self.raw()) }
    }

    /// The device's pinned host buffer type, when it offers one.
    fn pinned_host_buffer_type(&self) -> Option<sys::ggml_backend_buffer_type_t> {
        // SAFETY: registry device; returns null when the device has no host buffer type.
        let buft = unsafe { sys::ggml_backend_dev_host_buffer_type(self.dev) };
        (!buft.is_null()).then_some(buft)
    }

    /// The name of the device's pinned host memory (`Vulkan_Host`, `CUDA_Host`, ...), `None`
    /// when the device has none and offloaded weights live in plain RAM.
    pub fn pinned_host_memory(&self) -> Option<String> {
        self.pinned_host_buffer_type().map(buft_name)
    }

    /// Allocates host memory for every tensor of `ctx` that has none yet: the device's
    /// pinned host buffer type when it has one (fast, async-capable uploads), else plain RAM.
    pub(super) fn alloc_context_host(
        &self,
        ctx: &Context,
        what: &str,
    ) -> Result<Buffer, GgmlError> {
        let bytes: usize = ctx.tensors().iter().map(|t| t.n_bytes()).sum();
        let buft = self.pinned_host_buffer_type().unwrap_or_else(|| {
            // SAFETY: the CPU buffer type is static.
            unsafe { sys::ggml_backend_cpu_buffer_type() }
        });
        // SAFETY: live context and buffer type; returns null on failure.
        let raw = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.raw(), buft) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Buffer { raw }),
            None if bytes == 0 => Ok(Buffer::empty(self)?),
            None => Err(GgmlError::OutOfMemory {
                device: "host".to_string(),
                what: what.to_string(),
                bytes,
            }),
        }
    }

    /// Bytes one device buffer holding `tensors` takes (alignment and padding included).
    pub fn bytes_for(&self, tensors: &[Tensor<'_>]) -> usize {
        let buft = self.buffer_type();
        // SAFETY: live buffer type.
        let align = unsafe { sys::ggml_backend_buft_get_alignment(buft) }.max(1);
        tensors
            .iter()
            // SAFETY: live buffer type and tensors.
            .map(|t| unsafe { sys::ggml_backend_buft_get_alloc_size(buft, t.raw()) })
            .map(|n| n.div_ceil(align) * align)
            .sum()
    }

    /// One device buffer for `tensors` (none may have memory yet, none may be a view), each
    /// bound into it. The tensors lose their memory again when the returned buffer is dropped,
    /// which the lifetime keeps from happening after their context is gone.
    pub fn alloc_tensors<'t>(
        &self,
        tensors: &[Tensor<'t>],
        what: &str,
    ) -> Result<BoundBuffer<'t>, GgmlError> {
        for t in tensors {
            if t.has_data() || t.view_base().is_some() || t.is_allocated() {
                return Err(GgmlError::Binding(format!(
                    "{what}: tensor '{}' already has memory",
                    t.name()
                )));
            }
        }
        let (buffer, offsets) = self.alloc_for(tensors, what)?;
        let mut bound = BoundBuffer {
            buffer,
            tensors: Vec::with_capacity(tensors.len()),
        };
        for (t, off) in tensors.iter().zip(offsets) {
            bound.buffer.bind(*t, off)?;
            bound.tensors.push(*t);
        }
        Ok(bound)
    }

    /// A device buffer sized for `tensors` and each one's offset in it.
    pub(super) fn alloc_for(
        &self,
        tensors: &[Tensor<'_>],
        what: &str,
    ) -> Result<(Buffer, Vec<usize>), GgmlError> {
        let buft = self.buffer_type();
        // SAFETY: live buffer type.
        let align = unsafe { sys::ggml_backend_buft_get_alignment(buft) }.max(1);
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut total = 0usize;
        for t in tensors {
            offsets.push(total);
            // SAFETY: live buffer type and tensor.
            let n = unsafe { sys::ggml_backend_buft_get_alloc_size(buft, t.raw()) };
            total += n.div_ceil(align) * align;
        }
        // SAFETY: live buffer type; returns null on failure.
        let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(buft, total.max(align)) };
        let raw = NonNull::new(raw).ok_or_else(|| GgmlError::OutOfMemory {
            device: self.info.name.clone(),
            what: what.to_string(),
            bytes: total,
        })?;
        Ok((Buffer { raw }, offsets))
    }

    /// Opens a device by registry name, returning a clear error when it is unknown.
    pub fn by_name(name: &str, threads: usize) -> Result<Self, GgmlError> {
        let _ = CString::new(name).map_err(|_| GgmlError::UnknownDevice(name.to_string()))?;
        Self::new(&BackendChoice::Named(name.to_string()), threads)
    }
}

/// Serialises backend creation and teardown: ggml's Vulkan backend sets its device up lazily
/// on the first init and races when two threads do that at once (the loader then aborts).
static DEVICE_SETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn init_device(dev: sys::ggml_backend_dev_t) -> Option<NonNull<sys::ggml_backend>> {
    let _guard = DEVICE_SETUP.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: `dev` is a registry device; null params select defaults.
    NonNull::new(unsafe { sys::ggml_backend_dev_init(dev, std::ptr::null()) })
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _guard = DEVICE_SETUP.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: we own the backend and free it exactly once.
        unsafe { sys::ggml_backend_free(self.raw.as_ptr()) }
    }
}

/// A backend memory buffer. Owned by whatever owns the tensors bound into it ([`super::Arena`],
/// [`BoundBuffer`]), never handed out alone.
pub(super) struct Buffer {
    raw: NonNull<sys::ggml_backend_buffer>,
}

impl Buffer {
    pub(super) fn empty(backend: &Backend) -> Result<Self, GgmlError> {
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

    /// Binds `t` (no memory yet) at byte `offset` of this buffer.
    pub(super) fn bind(&self, t: Tensor<'_>, offset: usize) -> Result<(), GgmlError> {
        // SAFETY: live buffer; `offset` was sized for `t` by `Backend::alloc_for`, and `t`
        // has no memory yet (ggml asserts it).
        let status = unsafe {
            let base = sys::ggml_backend_buffer_get_base(self.raw.as_ptr()).cast::<u8>();
            sys::ggml_backend_tensor_alloc(self.raw.as_ptr(), t.raw(), base.add(offset).cast())
        };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(GgmlError::Binding(format!(
                "could not bind '{}' into a buffer",
                t.name()
            )))
        }
    }

    pub fn size(&self) -> usize {
        // SAFETY: live buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.raw.as_ptr()) }
    }

    /// The name of the buffer's memory type (`CPU`, `Vulkan0`, `Vulkan_Host`, `RPC0[...]`).
    pub fn type_name(&self) -> String {
        // SAFETY: live buffer; its type is static for the backend's lifetime.
        buft_name(unsafe { sys::ggml_backend_buffer_get_type(self.raw.as_ptr()) })
    }

    /// Whether the CPU can address the buffer's memory directly.
    pub fn is_host(&self) -> bool {
        // SAFETY: live buffer.
        unsafe { sys::ggml_backend_buffer_is_host(self.raw.as_ptr()) }
    }
}

fn buft_name(buft: sys::ggml_backend_buffer_type_t) -> String {
    // SAFETY: a live buffer type's name is a NUL-terminated static string.
    unsafe { std::ffi::CStr::from_ptr(sys::ggml_backend_buft_name(buft)) }
        .to_string_lossy()
        .into_owned()
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: we own the buffer and free it exactly once.
        unsafe { sys::ggml_backend_buffer_free(self.raw.as_ptr()) }
    }
}

/// Memory for some tensors of a graph context (graph-cut hand-over tensors): the tensors are
/// bound to it while it lives and unbound when it is dropped, so no handle can reach the freed
/// memory (a read then fails with an error; a graph that uses them refuses to run).
pub struct BoundBuffer<'t> {
    buffer: Buffer,
    tensors: Vec<Tensor<'t>>,
}

impl BoundBuffer<'_> {
    pub fn size(&self) -> usize {
        self.buffer.size()
    }
}

impl Drop for BoundBuffer<'_> {
    fn drop(&mut self) {
        for t in &self.tensors {
            t.unbind();
        }
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

    /// Bytes the compute buffer needs for `graph` (reserves it).
    pub fn reserve<G: ComputeGraph>(&mut self, graph: &G) -> Result<usize, GgmlError> {
        // SAFETY: live allocator and graph.
        let ok = unsafe { sys::ggml_gallocr_reserve(self.raw.as_ptr(), sealed_ptr(graph)) };
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

    /// Allocates every tensor of `graph` that has no memory yet in this allocator's buffer.
    /// The returned guard keeps the allocator borrowed (no other graph can take the buffer
    /// meanwhile) and unbinds those tensors when dropped, so none of them can reach the
    /// buffer after it was reused or freed.
    pub fn alloc<'a, G: ComputeGraph>(
        &'a mut self,
        graph: &'a G,
    ) -> Result<Allocation<'a>, GgmlError> {
        // Tensors without a buffer now are the ones this allocation binds; of those, the
        // ones whose storage also had none live in this allocator's buffer.
        let mut unbound = std::collections::HashSet::new();
        let mut touched = Vec::new();
        for node in graph_nodes(graph) {
            for t in std::iter::once(node).chain(node.srcs()) {
                for u in std::iter::once(t).chain(t.view_base()) {
                    if !u.is_allocated() && unbound.insert(u.id()) {
                        touched.push(u);
                    }
                }
            }
        }
        // SAFETY: live allocator and graph.
        let ok = unsafe { sys::ggml_gallocr_alloc_graph(self.raw.as_ptr(), sealed_ptr(graph)) };
        let tensors: Vec<NonNull<sys::ggml_tensor>> = touched
            .into_iter()
            .filter(|t| unbound.contains(&t.storage().id()))
            .filter_map(|t| NonNull::new(t.raw()))
            .collect();
        let guard = Allocation {
            _galloc: self,
            tensors,
            _graph: std::marker::PhantomData,
        };
        if ok {
            Ok(guard)
        } else {
            Err(GgmlError::OutOfMemory {
                device: guard._galloc.device.clone(),
                what: "compute buffer".into(),
                bytes: guard._galloc.buffer_size(),
            })
        }
    }

    /// Bytes the compute buffer would need for `graph`, without allocating it. Tensors that
    /// already have memory are not counted. The allocator is left marked as reserved for
    /// `graph` without memory (its own buffer is dropped when it would have to grow): measure
    /// with a throwaway allocator or one kept for measuring, never one that allocates.
    pub fn measure<G: ComputeGraph>(&mut self, graph: &G) -> usize {
        let mut size = 0usize;
        // SAFETY: live allocator and graph; one buffer, so `size` has room for all sizes.
        unsafe {
            sys::ggml_gallocr_reserve_n_size(
                self.raw.as_ptr(),
                sealed_ptr(graph),
                std::ptr::null(),
                std::ptr::null(),
                &mut size,
            )
        };
        size
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

/// A graph's tensors bound into a [`Gallocr`]'s buffer (see [`Gallocr::alloc`]); unbound
/// again on drop.
pub struct Allocation<'a> {
    _galloc: &'a mut Gallocr,
    /// Tensors whose memory is in the allocator's buffer (the graph, borrowed for 'a, keeps
    /// them alive).
    tensors: Vec<NonNull<sys::ggml_tensor>>,
    _graph: std::marker::PhantomData<&'a ()>,
}

impl Allocation<'_> {
    /// Bytes of the allocator's buffer.
    pub fn buffer_size(&self) -> usize {
        self._galloc.buffer_size()
    }
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        for &t in &self.tensors {
            // SAFETY: the graph these tensors belong to is borrowed for the guard's lifetime.
            unsafe {
                let t = &mut *t.as_ptr();
                t.buffer = std::ptr::null_mut();
                t.data = std::ptr::null_mut();
            }
        }
    }
}

/// The nodes of a graph or sub-graph, in execution order.
fn graph_nodes<'g, G: ComputeGraph>(graph: &'g G) -> impl Iterator<Item = Tensor<'g>> + 'g {
    let raw = sealed_ptr(graph);
    // SAFETY: live graph borrowed for 'g.
    let n = unsafe { sys::ggml_graph_n_nodes(raw) };
    (0..n).filter_map(move |i| {
        // SAFETY: index within the node count of the live graph.
        NonNull::new(unsafe { sys::ggml_graph_node(raw, i) }).map(Tensor::from_raw)
    })
}
