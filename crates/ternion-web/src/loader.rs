//! Loading that fits a browser tab: the GGUF header from a prefix of the file, then each
//! tensor's byte range, straight into GPU buffers. Memory holds one read-ahead window
//! (or one tensor larger than it), never the whole file.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use ternion::backend::gpu::{GpuContext, GpuModel, GpuModelOptions, GpuUpload};
use ternion::gguf::{GgufFile, GgufPlace, GgufProblem};
use ternion::{Error, FormatError, Result};

/// First prefix read for the header; it grows ×4 until the header fits (the 2B-4T file's
/// vocabulary needs a few MiB).
pub const FIRST_PREFIX: u64 = 1 << 20;

/// Consecutive tensors are fetched together in reads of at least this many bytes (one
/// range request per window, not one per norm vector).
pub const READ_AHEAD: u64 = 32 << 20;

/// Most bytes the CPU backend reads into memory (it needs the whole file).
pub const CPU_MAX_BYTES: u64 = 512 << 20;

/// A file read by byte ranges: an HTTP URL (range requests), a browser `File`, memory.
pub trait ByteSource {
    /// A name for messages.
    fn name(&self) -> &str;
    /// Length of the file in bytes.
    fn len(&self) -> u64;
    /// True for an empty file.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes of `range` (within `0..len()`).
    fn read(&self, range: Range<u64>) -> impl Future<Output = Result<Vec<u8>>>;
}

/// Load progress: bytes of tensor data uploaded so far, of `total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes done.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
}

/// The bytes of `range`, checked to be exactly that many.
pub async fn read_exact<S: ByteSource>(src: &S, range: Range<u64>) -> Result<Vec<u8>> {
    let want = range.end - range.start;
    let bytes = src.read(range.clone()).await?;
    if bytes.len() as u64 != want {
        return Err(FormatError::Gguf {
            file: src.name().into(),
            at: Box::new(GgufPlace::Header),
            problem: GgufProblem::ShortRead {
                start: range.start,
                end: range.end,
                got: bytes.len() as u64,
            },
        }
        .into());
    }
    Ok(bytes)
}

/// Parses the header (metadata, tensor table) from prefixes of `src`, starting with
/// `first` bytes and growing ×4 until it fits.
pub async fn read_header<S: ByteSource>(src: &S, first: u64) -> Result<GgufFile> {
    let len = src.len();
    let mut n = first.max(1).min(len);
    loop {
        let prefix = read_exact(src, 0..n).await?;
        if let Some(h) = GgufFile::parse_header(src.name(), prefix, len)? {
            return Ok(h);
        }
        if n == len {
            // The whole file parses or fails with an error; never "short".
            return Err(FormatError::Gguf {
                file: src.name().into(),
                at: Box::new(GgufPlace::Header),
                problem: GgufProblem::HeaderIncomplete,
            }
            .into());
        }
        n = n.saturating_mul(4).min(len);
    }
}

/// Bytes of the file read ahead, served to consecutive tensor requests.
struct ReadAhead {
    start: u64,
    buf: Vec<u8>,
}

impl ReadAhead {
    async fn get<S: ByteSource>(&mut self, src: &S, r: Range<u64>) -> Result<&[u8]> {
        let have = self.start..self.start + self.buf.len() as u64;
        if r.start < have.start || r.end > have.end {
            // Free the old window before reading the next one.
            self.buf = Vec::new();
            let end = r.end.max(r.start.saturating_add(READ_AHEAD)).min(src.len());
            self.buf = read_exact(src, r.start..end.max(r.end)).await?;
            self.start = r.start;
        }
        let at = (r.start - self.start) as usize;
        Ok(&self.buf[at..at + (r.end - r.start) as usize])
    }
}

/// Uploads the model `header` describes, fetching each tensor's range of `src` in file
/// order; `progress` is called after each tensor.
pub async fn upload<S: ByteSource>(
    ctx: Arc<GpuContext>,
    src: &S,
    header: &GgufFile,
    opts: GpuModelOptions,
    mut progress: impl FnMut(Progress),
) -> Result<GpuModel> {
    let mut up = GpuUpload::new(ctx, header, opts)?;
    let total = up.total_bytes();
    let mut done = 0;
    let mut window = ReadAhead {
        start: 0,
        buf: Vec::new(),
    };
    while let Some(r) = up.next_tensor().map(|t| t.range.clone()) {
        let bytes = window.get(src, r.clone()).await?;
        up.put(bytes)?;
        done += r.end - r.start;
        progress(Progress { done, total });
    }
    up.finish()
}

/// Reads the whole of `src` (at most [`CPU_MAX_BYTES`]) for the CPU backend.
pub async fn read_all<S: ByteSource>(src: &S) -> Result<GgufFile> {
    if src.len() > CPU_MAX_BYTES {
        return Err(Error::Request(format!(
            "{}: {} bytes is too large for the CPU backend in wasm (at most {}); \
             use WebGPU",
            src.name(),
            src.len(),
            CPU_MAX_BYTES
        )));
    }
    let bytes = read_exact(src, 0..src.len()).await?;
    Ok(GgufFile::from_bytes(src.name(), bytes)?)
}

/// A model a page loads: a GGUF file ([`Gguf`]) or an MLC directory
/// ([`crate::mlc::MlcSource`]).
pub trait ModelSource {
    /// The GGUF header (metadata and tensor table; no tensor data).
    fn header(&self) -> impl Future<Output = Result<GgufFile>>;
    /// Uploads the weights `header` lists into GPU buffers, calling `progress` after each
    /// tensor.
    fn upload(
        &self,
        ctx: Arc<GpuContext>,
        header: &GgufFile,
        opts: GpuModelOptions,
        progress: impl FnMut(Progress),
    ) -> impl Future<Output = Result<GpuModel>>;
    /// The whole model in memory for the CPU backend (at most [`CPU_MAX_BYTES`]).
    fn read_all(&self) -> impl Future<Output = Result<GgufFile>>;
}

/// A GGUF file read by ranges.
pub struct Gguf<S>(pub S);

impl<S: ByteSource> ModelSource for Gguf<S> {
    async fn header(&self) -> Result<GgufFile> {
        read_header(&self.0, FIRST_PREFIX).await
    }

    async fn upload(
        &self,
        ctx: Arc<GpuContext>,
        header: &GgufFile,
        opts: GpuModelOptions,
        progress: impl FnMut(Progress),
    ) -> Result<GpuModel> {
        upload(ctx, &self.0, header, opts, progress).await
    }

    async fn read_all(&self) -> Result<GgufFile> {
        read_all(&self.0).await
    }
}
