//! Typed storage buffers: upload, zeroed allocation, read-back (tests and one-off reads),
//! and row-sharded buffers for tensors larger than one binding allows.

use bytemuck::Pod;

use super::context::GpuContext;
use crate::{Error, Result};

/// Usage of every storage buffer: bindable, and copyable both ways (uploads, read-back).
pub const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Usage of uniform parameter blocks.
pub const UNIFORM: wgpu::BufferUsages =
    wgpu::BufferUsages::UNIFORM.union(wgpu::BufferUsages::COPY_DST);

/// A GPU buffer with its logical size in bytes (the allocation is rounded up to 4).
#[derive(Clone, Debug)]
pub struct GpuBuffer {
    /// The wgpu buffer.
    pub buf: wgpu::Buffer,
    /// Bytes of meaningful data.
    pub size: u64,
}

impl GpuBuffer {
    /// A zero-filled storage buffer of `size` bytes.
    pub fn zeroed(ctx: &GpuContext, label: &str, size: u64) -> Result<GpuBuffer> {
        Self::with_usage(ctx, label, size, STORAGE)
    }

    /// A zero-filled buffer of `size` bytes with `usage`.
    pub fn with_usage(
        ctx: &GpuContext,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<GpuBuffer> {
        let buf = ctx.create_buffer(label, size, usage)?;
        Ok(GpuBuffer { buf, size })
    }

    /// A storage buffer holding `data`.
    pub fn from_slice<T: Pod>(ctx: &GpuContext, label: &str, data: &[T]) -> Result<GpuBuffer> {
        Self::from_bytes(ctx, label, bytemuck::cast_slice(data), STORAGE)
    }

    /// A buffer with `usage` (which must include COPY_DST) holding `bytes`, zero-padded to
    /// a multiple of 4 bytes.
    pub fn from_bytes(
        ctx: &GpuContext,
        label: &str,
        bytes: &[u8],
        usage: wgpu::BufferUsages,
    ) -> Result<GpuBuffer> {
        let b = Self::with_usage(ctx, label, bytes.len() as u64, usage)?;
        b.write(ctx, 0, bytes);
        Ok(b)
    }

    /// Queues a write of `bytes` at `offset` (ordered before the next submit).
    pub fn write(&self, ctx: &GpuContext, offset: u64, bytes: &[u8]) {
        if bytes.len().is_multiple_of(4) {
            ctx.queue.write_buffer(&self.buf, offset, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4), 0);
            ctx.queue.write_buffer(&self.buf, offset, &padded);
        }
    }

    /// Reads the whole buffer back as `T`s (for tests and one-off reads).
    pub async fn read_async<T: Pod>(&self, ctx: &GpuContext) -> Result<Vec<T>> {
        let bytes = ctx.read_bytes_async(&self.buf, 0, self.size).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Blocking [`GpuBuffer::read_async`] (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read<T: Pod>(&self, ctx: &GpuContext) -> Result<Vec<T>> {
        pollster::block_on(self.read_async(ctx))
    }

    /// The whole buffer as a binding.
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        self.buf.as_entire_buffer_binding()
    }
}

/// A row-major matrix stored as consecutive shards of whole rows, each shard small enough
/// to bind (the 657 MB F16 LM head against lavapipe's 128 MiB binding limit). Kernels over
/// it take one shard per dispatch.
#[derive(Clone, Debug)]
pub struct Sharded {
    /// The shards; shard `i` holds rows `i·rows_per_shard ..`.
    pub shards: Vec<GpuBuffer>,
    /// Rows in every shard but possibly the last.
    pub rows_per_shard: usize,
    /// Total rows.
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
}

impl Sharded {
    /// Uploads `data` (`rows × row_bytes`) in shards of at most `max_shard_bytes` (default:
    /// the device's binding and buffer limits). `row_bytes` must be a multiple of 4.
    pub fn from_rows(
        ctx: &GpuContext,
        label: &str,
        data: &[u8],
        row_bytes: usize,
        max_shard_bytes: Option<u64>,
    ) -> Result<Sharded> {
        if !row_bytes.is_multiple_of(4) {
            return Err(Error::KernelArgs(format!(
                "{label}: rows of {row_bytes} bytes are not a multiple of 4"
            )));
        }
        Self::from_rows_unaligned(ctx, label, data, row_bytes, max_shard_bytes)
    }

    /// [`Sharded::from_rows`] for rows of any byte length (block-quantized rows such as
    /// Q6_K's 210 bytes per 256 values): each shard is zero-padded to whole words, and
    /// kernels address its rows by byte offset.
    pub fn from_rows_unaligned(
        ctx: &GpuContext,
        label: &str,
        data: &[u8],
        row_bytes: usize,
        max_shard_bytes: Option<u64>,
    ) -> Result<Sharded> {
        if row_bytes == 0 || !data.len().is_multiple_of(row_bytes) {
            return Err(Error::KernelArgs(format!(
                "{label}: {} bytes are not whole rows of {row_bytes} bytes",
                data.len()
            )));
        }
        let s = Self::zeroed(
            ctx,
            label,
            data.len() / row_bytes,
            row_bytes,
            max_shard_bytes,
        )?;
        s.write_rows(ctx, data)?;
        Ok(s)
    }

    /// Zeroed shards for `rows × row_bytes`, filled later with [`Sharded::write_rows`];
    /// each shard is padded to whole words.
    pub fn zeroed(
        ctx: &GpuContext,
        label: &str,
        rows: usize,
        row_bytes: usize,
        max_shard_bytes: Option<u64>,
    ) -> Result<Sharded> {
        if row_bytes == 0 {
            return Err(Error::KernelArgs(format!("{label}: rows of 0 bytes")));
        }
        let caps = ctx.caps();
        let (limit, max) = [
            ("max_storage_buffer_binding_size", caps.max_binding),
            ("max_buffer_size", caps.max_buffer),
            (
                "the shard size asked for",
                max_shard_bytes.unwrap_or(u64::MAX),
            ),
        ]
        .into_iter()
        .min_by_key(|l| l.1)
        .expect("three limits");
        let rows_per_shard = (max / row_bytes as u64) as usize;
        if rows_per_shard == 0 {
            return Err(Error::ExceedsLimit {
                what: format!("{label} (one row)"),
                bytes: row_bytes as u64,
                limit,
                max,
                adapter: caps.name.clone(),
                hint: "",
            });
        }
        let shards = (0..rows.div_ceil(rows_per_shard))
            .map(|i| {
                let n = rows_per_shard.min(rows - i * rows_per_shard);
                GpuBuffer::zeroed(ctx, &format!("{label}[{i}]"), (n * row_bytes) as u64)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sharded {
            shards,
            rows_per_shard,
            rows,
            row_bytes,
        })
    }

    /// Queues the upload of every row (`data` = `rows × row_bytes` bytes).
    pub fn write_rows(&self, ctx: &GpuContext, data: &[u8]) -> Result<()> {
        if data.len() != self.rows * self.row_bytes {
            return Err(Error::KernelArgs(format!(
                "sharded upload: {} bytes for {} rows of {} bytes",
                data.len(),
                self.rows,
                self.row_bytes
            )));
        }
        for (shard, chunk) in self
            .shards
            .iter()
            .zip(data.chunks(self.rows_per_shard * self.row_bytes))
        {
            shard.write(ctx, 0, chunk);
        }
        Ok(())
    }

    /// First row and row count of shard `i`.
    pub fn shard_rows(&self, i: usize) -> (usize, usize) {
        let r0 = i * self.rows_per_shard;
        (r0, self.rows_per_shard.min(self.rows - r0))
    }
}
