//! The wgpu device: adapter choice, limits and optional features, error capture, counters
//! of created objects, submission and read-back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::pipelines::PipelineCache;
use crate::{Error, Result};

/// How to open a GPU.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Index into [`list_adapters`] (the CLI's `--device N`); `None` picks the best
    /// adapter (discrete, then integrated, then virtual, then CPU such as lavapipe).
    pub device_index: Option<usize>,
    /// Backends to enumerate (Vulkan, Metal, DX12, GL...).
    pub backends: wgpu::Backends,
    /// Do not enable SHADER_F16 even when the adapter has it (tests the f32-only kernels).
    pub disable_f16: bool,
    /// Do not enable SUBGROUP even when the adapter has it.
    pub disable_subgroups: bool,
    /// The kernel for the ternary linears of prompt batches; `None` picks the best the
    /// adapter runs ([`PrefillKernel::Coop`], in a browser [`PrefillKernel::SubgroupMatrix`],
    /// else [`PrefillKernel::Tiled`]); a kernel the device cannot run is an error.
    pub prefill: Option<PrefillKernel>,
}

/// The kernel that runs the I2_S linears of a prompt batch (more than one token).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrefillKernel {
    /// `ternary.wgsl` `matmul4`: 4 tokens per workgroup, the weights read per 4 tokens.
    Batch4,
    /// `ternary_mm.wgsl`: 64 rows × 64 tokens per workgroup, `dot4I8Packed` (any adapter).
    Tiled,
    /// `ternary_coop.wgsl`: 128 rows × 64 tokens per workgroup (× 128 tokens for steps of
    /// more than 64) on 16×16×16 f16 cooperative matrices (tensor cores).
    Coop,
    /// `ternary_sgmat.wgsl`: 128 rows × 128 tokens per workgroup on a browser's 16×16×32
    /// int8 subgroup matrices (WebGPU `chromium-experimental-subgroup-matrix`; browser
    /// builds only, see `web.rs`), for steps of more than 64 tokens (the portable tiles
    /// below).
    SubgroupMatrix,
}

/// Workgroup memory `ternary_sgmat.wgsl` declares, in bytes.
pub(crate) const SGMAT_WORKGROUP_BYTES: u32 = (5120 + 5120) * 4;

/// Workgroup memory `ternary_coop.wgsl` declares, in bytes.
pub(crate) const COOP_WORKGROUP_BYTES: u32 = (2560 + 2560) * 8 + 2048 * 4;

/// Threads of `ternary_coop.wgsl`'s largest workgroups (`matmul_split`, `matmul_wide3`).
pub(crate) const COOP_MAX_THREADS: u32 = 512;

/// The adapter's streaming multiprocessors, where Vulkan reports them
/// (VK_NV_shader_sm_builtins); None for other adapters and backends.
#[cfg(all(not(target_arch = "wasm32"), not(target_vendor = "apple")))]
fn sm_count(adapter: &wgpu::Adapter) -> Option<u32> {
    use ash::vk;
    // SAFETY: the adapter's raw Vulkan handles are only read (two queries), while `adapter`
    // and so its instance live.
    unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance().raw_instance();
        let physical = hal.raw_physical_device();
        let listed = instance
            .enumerate_device_extension_properties(physical)
            .ok()?
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(vk::NV_SHADER_SM_BUILTINS_NAME));
        if !listed {
            return None;
        }
        let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut sm);
        instance.get_physical_device_properties2(physical, &mut props);
        (sm.shader_sm_count > 0).then_some(sm.shader_sm_count)
    }
}

#[cfg(any(target_arch = "wasm32", target_vendor = "apple"))]
fn sm_count(_adapter: &wgpu::Adapter) -> Option<u32> {
    None
}

/// True when the adapter runs `ternary_coop.wgsl`: 16×16×16 f16·f16 + f32 subgroup
/// matrices, f16, subgroups of exactly 32 lanes, 512-thread workgroups and enough
/// workgroup memory.
fn coop_usable(adapter: &wgpu::Adapter, features: wgpu::Features) -> bool {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let need = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    features.contains(need)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && limits.max_compute_workgroup_storage_size >= COOP_WORKGROUP_BYTES
        && limits.max_compute_invocations_per_workgroup >= COOP_MAX_THREADS
        && limits.max_compute_workgroup_size_x >= COOP_MAX_THREADS
        && adapter.cooperative_matrix_properties().iter().any(|c| {
            use wgpu::CooperativeScalarType as S;
            (c.m_size, c.n_size, c.k_size, c.ab_type, c.cr_type) == (16, 16, 16, S::F16, S::F32)
        })
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            device_index: None,
            backends: wgpu::Backends::PRIMARY,
            disable_f16: false,
            disable_subgroups: false,
            prefill: None,
        }
    }
}

/// What the opened device can do.
#[derive(Clone, Debug)]
pub struct Caps {
    /// SHADER_F16 is enabled: kernels may use `enable f16;`.
    pub f16: bool,
    /// SUBGROUP is enabled: kernels may use subgroup operations.
    pub subgroups: bool,
    /// Smallest subgroup size the adapter may use (lavapipe: 8, NVIDIA: 32).
    pub subgroup_min_size: u32,
    /// The kernel for the ternary linears of prompt batches.
    pub prefill: PrefillKernel,
    /// TIMESTAMP_QUERY is enabled.
    pub timestamps: bool,
    /// Largest storage-buffer binding in bytes (lavapipe: 128 MiB).
    pub max_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Adapter name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)".
    pub name: String,
    /// Backend name, e.g. "vulkan".
    pub backend: String,
    /// The driver keeps every buffer access inside its binding (Vulkan: robustBufferAccess,
    /// a feature every Vulkan device has and wgpu enables), so shader modules are created
    /// without naga's own bounds checks (pipelines.rs).
    pub robust_buffers: bool,
    /// Streaming multiprocessors, where the driver reports them (NVIDIA under Vulkan:
    /// VK_NV_shader_sm_builtins): the prompt tiles plan their last wave with it
    /// (`ternary_coop.wgsl` `tail_plan`). None elsewhere.
    pub sms: Option<u32>,
}

/// One adapter as listed for `--device N`.
#[derive(Clone, Debug)]
pub struct AdapterListing {
    /// Position in the list (the value of `--device`).
    pub index: usize,
    /// Adapter name.
    pub name: String,
    /// Backend name.
    pub backend: String,
    /// Device type (discrete, integrated, cpu...).
    pub device_type: String,
}

/// Counts of GPU objects created through a [`GpuContext`]; recording dispatches must not
/// change them (docs/ARCHITECTURE.md#gpu-principles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Compute pipelines compiled.
    pub pipelines: u64,
    /// Bind groups created.
    pub bind_groups: u64,
    /// Buffers created.
    pub buffers: u64,
}

#[derive(Default)]
struct AtomicCounters {
    pipelines: AtomicU64,
    bind_groups: AtomicU64,
    buffers: AtomicU64,
}

/// An opened GPU: device, queue, capabilities and the pipeline cache.
pub struct GpuContext {
    /// The wgpu device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    caps: Caps,
    pub(crate) pipelines: PipelineCache,
    counters: AtomicCounters,
    /// First uncaptured error or device loss, reported by [`GpuContext::check`].
    fault: Arc<Mutex<Option<Fault>>>,
}

/// A failure the device reported on its own (not in an error scope): kept until
/// [`GpuContext::check`] turns it into an [`Error`].
#[derive(Clone, Debug)]
enum Fault {
    Lost { reason: String, message: String },
    OutOfMemory(String),
    Other { what: &'static str, message: String },
}

impl Fault {
    fn of(e: &wgpu::Error) -> Fault {
        match e {
            wgpu::Error::OutOfMemory { .. } => Fault::OutOfMemory(e.to_string()),
            wgpu::Error::Validation { .. } => Fault::Other {
                what: "(validation, uncaptured)",
                message: e.to_string(),
            },
            wgpu::Error::Internal { .. } => Fault::Other {
                what: "(internal, uncaptured)",
                message: e.to_string(),
            },
        }
    }

    fn error(&self) -> Error {
        match self.clone() {
            Fault::Lost { reason, message } => Error::DeviceLost { reason, message },
            Fault::OutOfMemory(message) => Error::OutOfMemory {
                what: "(uncaptured)".into(),
                bytes: None,
                message,
            },
            Fault::Other { what, message } => Error::DeviceFault {
                what: what.into(),
                message,
            },
        }
    }
}

/// The adapters of `backends`; in a browser, with `subgroups`, adapters that offer the
/// `subgroups` feature ask for it when opening their device, and for the subgroup matrices
/// of the prompt tiles where `prefill` allows them and the adapter fits (`web.rs`).
async fn enumerate(
    backends: wgpu::Backends,
    #[cfg_attr(not(target_arch = "wasm32"), allow(unused_variables))] subgroups: bool,
    #[cfg_attr(not(target_arch = "wasm32"), allow(unused_variables))] prefill: Option<
        PrefillKernel,
    >,
) -> Vec<wgpu::Adapter> {
    let desc = wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    };
    #[cfg(target_arch = "wasm32")]
    let instance = {
        let sgmat = matches!(prefill, None | Some(PrefillKernel::SubgroupMatrix));
        super::web::instance(desc, subgroups, sgmat)
    };
    #[cfg(not(target_arch = "wasm32"))]
    let instance = wgpu::Instance::new(desc);
    instance.enumerate_adapters(backends).await
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// The adapters of `backends`, in the order `--device N` indexes them (blocks: native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters(backends: wgpu::Backends) -> Vec<AdapterListing> {
    pollster::block_on(enumerate(backends, false, None))
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let info = a.get_info();
            AdapterListing {
                index,
                name: info.name,
                backend: info.backend.to_string(),
                device_type: format!("{:?}", info.device_type),
            }
        })
        .collect()
}

impl GpuContext {
    /// Blocking [`GpuContext::new_async`] (native only: a browser cannot block).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(opts: &GpuOptions) -> Result<GpuContext> {
        pollster::block_on(Self::new_async(opts))
    }

    /// Opens the adapter chosen by `opts`, with the adapter's own limits and the optional
    /// features the kernels can use (SHADER_F16, SUBGROUP, TIMESTAMP_QUERY). In a browser
    /// the one adapter is the page's WebGPU (`navigator.gpu`), and `subgroups` is asked for
    /// past wgpu when offered (`web.rs`).
    pub async fn new_async(opts: &GpuOptions) -> Result<GpuContext> {
        let mut adapters = enumerate(opts.backends, !opts.disable_subgroups, opts.prefill).await;
        if adapters.is_empty() {
            let hint = if cfg!(target_arch = "wasm32") {
                "navigator.gpu gave no WebGPU adapter (a browser without WebGPU, or a Node.js gpu object without one)"
            } else {
                "on Linux without a GPU, install Mesa's lavapipe: mesa-vulkan-drivers"
            };
            return Err(Error::NoAdapter {
                backends: format!("{:?}", opts.backends),
                hint,
            });
        }
        let adapter = match opts.device_index {
            Some(i) if i < adapters.len() => adapters.swap_remove(i),
            Some(index) => {
                return Err(Error::NoSuchAdapter {
                    index,
                    found: adapters.len(),
                })
            }
            None => {
                let best = (0..adapters.len())
                    .min_by_key(|&i| type_rank(adapters[i].get_info().device_type))
                    .expect("non-empty");
                adapters.swap_remove(best)
            }
        };
        let info = adapter.get_info();
        let have = adapter.features();
        let mut want = wgpu::Features::empty();
        if !opts.disable_f16 {
            want |= wgpu::Features::SHADER_F16;
        }
        if !opts.disable_subgroups {
            want |= wgpu::Features::SUBGROUP;
        }
        want |= wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let mut features = have & want;
        let coop = matches!(opts.prefill, None | Some(PrefillKernel::Coop))
            && coop_usable(
                &adapter,
                features | (have & wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            );
        let prefill = match opts.prefill {
            Some(PrefillKernel::Coop) if !coop => {
                return Err(Error::UnsupportedFeature {
                    what: format!("the coop prefill kernel on {}", info.name),
                    needs: "16×16×16 f16 cooperative matrices with 32-lane subgroups".into(),
                })
            }
            // Decided once the browser's device exists (below).
            Some(PrefillKernel::SubgroupMatrix) => PrefillKernel::Tiled,
            Some(k) => k,
            None if coop => PrefillKernel::Coop,
            None => PrefillKernel::Tiled,
        };
        if prefill == PrefillKernel::Coop {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("ternion"),
                required_features: features,
                required_limits: limits.clone(),
                // SAFETY: the one experimental feature requested is cooperative matrices,
                // used only by `ternary_coop.wgsl` on adapters that list its configuration.
                experimental_features: if prefill == PrefillKernel::Coop {
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                ..Default::default()
            })
            .await
            .map_err(|e| Error::DeviceRequest {
                adapter: info.name.clone(),
                message: e.to_string(),
            })?;

        let fault = Arc::new(Mutex::new(None::<Fault>));
        let f = fault.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            f.lock().expect("fault lock").get_or_insert(Fault::of(&e));
        }));
        let f = fault.clone();
        device.set_device_lost_callback(move |reason, message| {
            // A loss replaces an earlier fault: it is what the caller must act on.
            *f.lock().expect("fault lock") = Some(Fault::Lost {
                reason: format!("{reason:?}"),
                message,
            });
        });

        // A browser's device may have `subgroups` without wgpu knowing (`web.rs`).
        #[cfg(target_arch = "wasm32")]
        let web_subgroups = !opts.disable_subgroups && super::web::device_has_subgroups(&device);
        #[cfg(not(target_arch = "wasm32"))]
        let web_subgroups = false;
        let subgroups = features.contains(wgpu::Features::SUBGROUP) || web_subgroups;
        // A browser's device has subgroup matrices only where the view asked for them.
        #[cfg(target_arch = "wasm32")]
        let has_sgmat = super::web::device_has_subgroup_matrix(&device);
        #[cfg(not(target_arch = "wasm32"))]
        let has_sgmat = false;
        let wg_bytes = limits.max_compute_workgroup_storage_size;
        let sgmat = has_sgmat && subgroups && wg_bytes >= SGMAT_WORKGROUP_BYTES;
        let prefill = match opts.prefill {
            None | Some(PrefillKernel::SubgroupMatrix) if sgmat => PrefillKernel::SubgroupMatrix,
            Some(PrefillKernel::SubgroupMatrix) => {
                return Err(Error::UnsupportedFeature {
                    what: format!("the subgroup-matrix prefill kernel on {}", info.name),
                    needs: format!(
                        "a browser WebGPU device with chromium-experimental-subgroup-matrix \
                         for 16×16×32 i8 on 32-lane subgroups (this one: {has_sgmat}), \
                         subgroups ({subgroups}) and {SGMAT_WORKGROUP_BYTES} bytes of \
                         workgroup memory ({wg_bytes})"
                    ),
                })
            }
            _ => prefill,
        };
        let caps = Caps {
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups,
            subgroup_min_size: info.subgroup_min_size,
            prefill,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            name: info.name.clone(),
            backend: info.backend.to_string(),
            robust_buffers: info.backend == wgpu::Backend::Vulkan,
            sms: sm_count(&adapter),
        };
        Ok(GpuContext {
            device,
            queue,
            caps,
            pipelines: PipelineCache::default(),
            counters: AtomicCounters::default(),
            fault,
        })
    }

    /// What the device can do.
    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// Objects created so far.
    pub fn counters(&self) -> Counters {
        Counters {
            pipelines: self.counters.pipelines.load(Ordering::Relaxed),
            bind_groups: self.counters.bind_groups.load(Ordering::Relaxed),
            buffers: self.counters.buffers.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count_pipeline(&self) {
        self.counters.pipelines.fetch_add(1, Ordering::Relaxed);
    }

    /// Errors if the device reported an uncaptured error or was lost.
    pub fn check(&self) -> Result<()> {
        match self.fault.lock().expect("fault lock").as_ref() {
            Some(fault) => Err(fault.error()),
            None => Ok(()),
        }
    }

    /// The device's own fault (a lost device explains a failed wait or map best), else a
    /// [`Error::DeviceFault`] for `what` with `message`.
    fn fault_or(&self, what: &str, message: impl std::fmt::Display) -> Error {
        match self.check() {
            Err(e) => e,
            Ok(()) => Error::DeviceFault {
                what: what.into(),
                message: message.to_string(),
            },
        }
    }

    /// Creates a buffer, turning out-of-memory and validation failures into errors (in a
    /// browser, where error scopes resolve only asynchronously, they reach
    /// [`GpuContext::check`] instead).
    pub fn create_buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let padded = size.max(4).next_multiple_of(4);
        if padded > self.caps.max_buffer {
            return Err(Error::ExceedsLimit {
                what: format!("buffer '{label}'"),
                bytes: padded,
                limit: "max_buffer_size",
                max: self.caps.max_buffer,
                adapter: self.caps.name.clone(),
                hint: "",
            });
        }
        let desc = wgpu::BufferDescriptor {
            label: Some(label),
            size: padded,
            usage,
            mapped_at_creation: false,
        };
        #[cfg(target_arch = "wasm32")]
        let buf = self.device.create_buffer(&desc);
        #[cfg(not(target_arch = "wasm32"))]
        let buf = self.create_buffer_checked(label, size, &desc)?;
        self.counters.buffers.fetch_add(1, Ordering::Relaxed);
        Ok(buf)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn create_buffer_checked(
        &self,
        label: &str,
        size: u64,
        desc: &wgpu::BufferDescriptor<'_>,
    ) -> Result<wgpu::Buffer> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buf = self.device.create_buffer(desc);
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(Error::OutOfMemory {
                what: format!("creating buffer '{label}'"),
                bytes: Some(size),
                message: e.to_string(),
            });
        }
        if let Some(e) = v {
            return Err(Error::DeviceFault {
                what: format!("creating buffer '{label}' of {size} bytes"),
                message: e.to_string(),
            });
        }
        Ok(buf)
    }

    /// Creates a bind group of whole-buffer `(binding, buffer)` entries for `layout`.
    pub fn create_bind_group(
        &self,
        label: &str,
        layout: &wgpu::BindGroupLayout,
        buffers: &[(u32, wgpu::BufferBinding<'_>)],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .map(|(binding, b)| wgpu::BindGroupEntry {
                binding: *binding,
                resource: wgpu::BindingResource::Buffer(b.clone()),
            })
            .collect();
        self.counters.bind_groups.fetch_add(1, Ordering::Relaxed);
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout,
            entries: &entries,
        })
    }

    /// A new command encoder.
    pub fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// Submits one encoder's commands.
    pub fn submit(&self, encoder: wgpu::CommandEncoder) -> wgpu::SubmissionIndex {
        self.queue.submit([encoder.finish()])
    }

    /// Blocks until all submitted work is done; errors on device loss or an earlier fault.
    pub fn wait(&self) -> Result<()> {
        self.wait_for(None)
    }

    /// Blocks until submission `index` is done (None: all submitted work), as
    /// [`GpuContext::wait`].
    pub fn wait_for(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        let wait = wgpu::PollType::Wait {
            submission_index: index,
            timeout: None,
        };
        self.device
            .poll(wait)
            .map_err(|e| self.fault_or("waiting for the GPU", e))?;
        self.check()
    }

    /// Maps the first `size` bytes of `buf` (MAP_READ, after the submit that filled it),
    /// hands them to `read` and unmaps. Natively the device is polled until the map
    /// completes; in a browser the future resolves when the page's event loop delivers the
    /// callback.
    pub async fn map_read_with<R>(
        &self,
        buf: &wgpu::Buffer,
        size: u64,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        self.map_read_after(buf, size, None, read).await
    }

    /// [`GpuContext::map_read_with`] where `filled` is the submission that last wrote `buf`:
    /// natively only that submission is waited for, not the work queued after it (None:
    /// everything submitted).
    pub async fn map_read_after<R>(
        &self,
        buf: &wgpu::Buffer,
        size: u64,
        filled: Option<wgpu::SubmissionIndex>,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let (tx, rx) = futures_channel::oneshot::channel();
        buf.map_async(wgpu::MapMode::Read, 0..size, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        self.wait_for(filled)?;
        #[cfg(target_arch = "wasm32")]
        let _ = filled;
        rx.await
            .map_err(|_| self.fault_or("reading back", "the map callback was dropped"))?
            .map_err(|e| self.fault_or("reading back", e))?;
        let out = read(
            &buf.get_mapped_range(0..size)
                .map_err(|e| self.fault_or("reading back", e))?,
        );
        buf.unmap();
        self.check()?;
        Ok(out)
    }

    /// [`GpuContext::map_read_with`] returning a copy of the bytes.
    pub async fn map_read(&self, buf: &wgpu::Buffer, size: u64) -> Result<Vec<u8>> {
        self.map_read_with(buf, size, <[u8]>::to_vec).await
    }

    /// Copies `size` bytes at `offset` of `buf` (which needs COPY_SRC) back to the host.
    /// Creates a staging buffer per call: for tests and one-off reads, not the hot path.
    pub async fn read_bytes_async(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>> {
        let padded = size.next_multiple_of(4).max(4);
        let staging = self.create_buffer(
            "readback",
            padded,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, padded);
        self.submit(enc);
        let mut out = self.map_read(&staging, padded).await?;
        out.truncate(size as usize);
        Ok(out)
    }

    /// Blocking [`GpuContext::read_bytes_async`] (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_bytes(&self, buf: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        pollster::block_on(self.read_bytes_async(buf, offset, size))
    }
}
