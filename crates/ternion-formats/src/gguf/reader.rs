//! GGUF reader: parses the header, metadata and tensor table of a memory-mapped file and
//! checks every count, length, offset and size against the file before using it.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::cursor::Cursor;
use super::error::{GgufPlace, GgufProblem};
use super::value::Value;
use super::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Where a tensor lives in the file and what it holds.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `shape[0]` is the contiguous (input) dimension.
    pub shape: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// True size in bytes (I2_S included).
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Number of rows (product of every dimension after the first).
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }
}

enum Bytes {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An opened GGUF file: metadata and tensor table parsed, tensor data left in place.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    /// Length of the whole file (more than `bytes` holds for [`GgufFile::parse_header`]).
    file_len: u64,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// Data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-maps and parses a file (reads it whole on wasm32, which has no mmap).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        #[cfg(not(target_arch = "wasm32"))]
        let bytes = {
            let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
            // SAFETY: the map is read-only; the file is not expected to change while in use,
            // as with every mmap-based model loader.
            Bytes::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?)
        };
        #[cfg(target_arch = "wasm32")]
        let bytes = Bytes::Owned(std::fs::read(path).map_err(|e| Error::io(path, e))?);
        let len = raw(&bytes).len() as u64;
        Self::parse(path.to_path_buf(), bytes, len, &Cell::new(false))
    }

    /// Parses a file already in memory (tests, and callers that stream files).
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        let len = bytes.len() as u64;
        Self::parse(name.into(), Bytes::Owned(bytes), len, &Cell::new(false))
    }

    /// Parses the header (metadata and tensor table) from `prefix`, the first bytes of a
    /// file of `file_len` bytes, for loaders that fetch tensor data by range (HTTP range
    /// requests, browser `File` slices). Counts and tensor ranges are checked against
    /// `file_len`. `Ok(None)`: the header runs past the prefix; fetch a longer one.
    /// The result holds no tensor data ([`GgufFile::has_tensor_data`] is false unless the
    /// prefix is the whole file): read each tensor's `offset..offset + size` yourself.
    pub fn parse_header(
        name: impl Into<PathBuf>,
        prefix: Vec<u8>,
        file_len: u64,
    ) -> Result<Option<Self>> {
        let name = name.into();
        if prefix.len() as u64 > file_len {
            return Err(Error::Gguf {
                file: name,
                at: Box::new(GgufPlace::Header),
                problem: GgufProblem::PrefixTooLong {
                    prefix: prefix.len() as u64,
                    file_len,
                },
            });
        }
        let short = Cell::new(false);
        match Self::parse(name, Bytes::Owned(prefix), file_len, &short) {
            Err(_) if short.get() => Ok(None),
            r => r.map(Some),
        }
    }

    fn parse(path: PathBuf, bytes: Bytes, file_len: u64, short: &Cell<bool>) -> Result<Self> {
        let buf = raw(&bytes);
        // The place is built only when there is an error to report.
        let fail = |at: GgufPlace, problem: GgufProblem| Error::Gguf {
            file: path.clone(),
            at: Box::new(at),
            problem,
        };
        let ctx = |problem| fail(GgufPlace::Header, problem);
        let mut r = Cursor::new(buf, file_len, short);
        let magic: [u8; 4] = r.array().map_err(ctx)?;
        if magic != MAGIC {
            return Err(ctx(GgufProblem::BadMagic { magic }));
        }
        let version = r.u32().map_err(ctx)?;
        if version != 2 && version != 3 {
            return Err(ctx(GgufProblem::UnsupportedVersion { version }));
        }
        let n_tensors = r.u64().map_err(ctx)?;
        let n_kv = r.u64().map_err(ctx)?;
        // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor
        // info at least 8 + 4 + 8 + 4 + 8: bound the counts by the bytes left.
        r.check_count(n_kv, 13, "metadata entries").map_err(ctx)?;
        r.check_count(n_tensors, 32, "tensor infos").map_err(ctx)?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = r
                .string()
                .map_err(|p| fail(GgufPlace::MetadataKey { index: i }, p))?;
            let kctx = |p| fail(GgufPlace::Metadata { key: key.clone() }, p);
            let ty = r.u32().map_err(kctx)?;
            let value = r.value(ty, 0).map_err(kctx)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(ctx(GgufProblem::DuplicateKey { key }));
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_int() {
                Some(a) if a > 0 && a <= 1 << 30 && (a & (a - 1)) == 0 => a as u64,
                _ => {
                    return Err(ctx(GgufProblem::BadAlignment {
                        found: metadata[i].1.summary(),
                    }))
                }
            },
        };

        let mut infos = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r
                .string()
                .map_err(|p| fail(GgufPlace::TensorName { index: i }, p))?;
            let tctx = |p| {
                let tensor = name.clone();
                fail(GgufPlace::TensorInfo { tensor }, p)
            };
            let n_dims = r.u32().map_err(tctx)?;
            if n_dims == 0 || n_dims as usize > MAX_DIMS {
                return Err(tctx(GgufProblem::BadDimCount {
                    n_dims,
                    max: MAX_DIMS,
                }));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64().map_err(tctx)?;
                if d == 0 || d > i64::MAX as u64 {
                    return Err(tctx(GgufProblem::DimensionOutOfRange { dim: d }));
                }
                shape.push(d);
            }
            let type_id = r.u32().map_err(tctx)?;
            let offset = r.u64().map_err(tctx)?;
            infos.push((name, shape, type_id, offset));
        }

        let data_offset =
            align_up(r.pos(), alignment).ok_or_else(|| ctx(GgufProblem::DataOffsetOverflow))?;
        if data_offset > file_len && !infos.is_empty() {
            return Err(ctx(GgufProblem::DataSectionPastEnd {
                data_offset,
                file_len,
            }));
        }

        let mut tensors = Vec::with_capacity(infos.len());
        let mut tensor_index = HashMap::with_capacity(infos.len());
        for (name, shape, type_id, rel) in infos {
            let ty = GgmlType::from_id(type_id).ok_or_else(|| Error::UnsupportedType {
                tensor: name.clone(),
                type_id,
                type_name: "unknown".into(),
            })?;
            let tctx = |p| {
                let (tensor, shape) = (name.clone(), shape.clone());
                fail(GgufPlace::Tensor { tensor, ty, shape }, p)
            };
            if shape[0] % ty.block_elems() as u64 != 0 {
                return Err(tctx(GgufProblem::RowNotWholeBlocks {
                    row: shape[0],
                    block: ty.block_elems(),
                }));
            }
            let size = ty
                .tensor_bytes(&shape)
                .ok_or_else(|| tctx(GgufProblem::SizeOverflow))?;
            if rel % alignment != 0 {
                return Err(tctx(GgufProblem::MisalignedOffset {
                    offset: rel,
                    alignment,
                }));
            }
            let offset = data_offset
                .checked_add(rel)
                .ok_or_else(|| tctx(GgufProblem::OffsetOverflow))?;
            let end = offset
                .checked_add(size)
                .ok_or_else(|| tctx(GgufProblem::EndOverflow))?;
            if end > file_len {
                return Err(tctx(GgufProblem::TruncatedTensorData {
                    start: offset,
                    end,
                    file_len,
                }));
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(ctx(GgufProblem::DuplicateTensor { tensor: name }));
            }
            tensors.push(TensorInfo {
                name,
                shape,
                ty,
                offset,
                size,
            });
        }
        if let Some((tensor, other)) = find_overlap(&tensors) {
            return Err(fail(
                GgufPlace::TensorInfo { tensor },
                GgufProblem::Overlap { other },
            ));
        }

        Ok(GgufFile {
            path,
            bytes,
            file_len,
            version,
            metadata,
            tensors,
            data_offset,
            alignment,
            meta_index,
            tensor_index,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// False for a header parsed from a prefix ([`GgufFile::parse_header`]): tensor data
    /// must then be fetched by range, and [`GgufFile::tensor_data`] returns nothing.
    pub fn has_tensor_data(&self) -> bool {
        self.raw().len() as u64 == self.file_len
    }

    fn raw(&self) -> &[u8] {
        raw(&self.bytes)
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A tensor's info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's bytes (bounds were checked when the file was opened); empty when the file
    /// holds only its header ([`GgufFile::has_tensor_data`]).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        self.raw()
            .get(info.offset as usize..(info.offset + info.size) as usize)
            .unwrap_or_default()
    }

    /// Advises the kernel that tensor data will be read soon and randomly (mapped files only).
    pub fn advise_will_need(&self) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let Bytes::Mapped(m) = &self.bytes {
            // Advice only: failure changes nothing but speed.
            let _ = m.advise(memmap2::Advice::WillNeed);
        }
    }

    /// Tells the kernel that this process no longer reads a tensor's pages (mapped files
    /// only), e.g. once it has been repacked into memory: they leave the resident set and
    /// are read back from the file if touched again.
    pub fn release(&self, info: &TensorInfo) {
        self.release_part(info, 0..info.size as usize);
    }

    /// [`GgufFile::release`] for the bytes `part` of a tensor's data (clamped to it), e.g.
    /// each part of a tensor as soon as it has been copied.
    #[cfg_attr(not(all(unix, not(target_arch = "wasm32"))), allow(unused_variables))]
    pub fn release_part(&self, info: &TensorInfo, part: std::ops::Range<usize>) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let Bytes::Mapped(m) = &self.bytes {
            let size = info.size as usize;
            let (lo, hi) = (part.start.min(size), part.end.min(size));
            if hi <= lo {
                return;
            }
            let (start, end) = (info.offset as usize + lo, info.offset as usize + hi);
            // SAFETY: the mapping is read-only and file-backed, so dropping its pages loses
            // nothing: a later read faults the same bytes back in from the file. The range
            // lies inside the map (checked when the file was opened).
            // Advice only: failure changes nothing but memory use.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    fn meta_err(&self, key: &str, what: &'static str) -> Error {
        let found = match self.get(key) {
            None => "nothing".to_string(),
            Some(v) => v.summary(),
        };
        Error::Metadata {
            file: self.path.clone(),
            key: key.to_string(),
            expected: what,
            found,
        }
    }

    /// A non-negative integer that fits u32, or `None` when the key is absent.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int() {
                Some(i) if (0..=u32::MAX as i128).contains(&i) => Ok(Some(i as u32)),
                _ => Err(self.meta_err(key, "an unsigned 32-bit integer")),
            },
        }
    }

    /// A number as f32, or `None` when the key is absent.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.meta_err(key, "a number")),
        }
    }

    /// A boolean (or integer 0/1), or `None` when the key is absent.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int() {
                Some(0) => Ok(Some(false)),
                Some(1) => Ok(Some(true)),
                _ => Err(self.meta_err(key, "a boolean")),
            },
        }
    }

    /// A string, or `None` when the key is absent.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.meta_err(key, "a string")),
        }
    }

    /// A required non-negative integer.
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.get_u32(key)?
            .ok_or_else(|| self.meta_err(key, "an unsigned 32-bit integer"))
    }

    /// An array of strings, or `None` when the key is absent.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
                .map(Some)
                .ok_or_else(|| self.meta_err(key, "an array of strings")),
        }
    }

    /// A required array of strings.
    pub fn require_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_str_array(key)?
            .ok_or_else(|| self.meta_err(key, "an array of strings"))
    }

    /// An array of numbers as f32, or `None` when the key is absent.
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_f64().map(|f| f as f32))
                        .collect::<Option<Vec<_>>>()
                })
                .map(Some)
                .ok_or_else(|| self.meta_err(key, "an array of numbers")),
        }
    }

    /// An array of integers as i32, or `None` when the key is absent.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_int().and_then(|i| i32::try_from(i).ok()))
                        .collect::<Option<Vec<_>>>()
                })
                .map(Some)
                .ok_or_else(|| self.meta_err(key, "an array of 32-bit integers")),
        }
    }
}

fn raw(bytes: &Bytes) -> &[u8] {
    match bytes {
        #[cfg(not(target_arch = "wasm32"))]
        Bytes::Mapped(m) => m,
        Bytes::Owned(v) => v,
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? / a * a)
}

/// The first pair of tensors whose data overlap (the one that starts first, then the
/// other), if any.
fn find_overlap(tensors: &[TensorInfo]) -> Option<(String, String)> {
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .map(|t| (t.offset, t.offset + t.size, t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Some((w[0].2.to_string(), w[1].2.to_string()));
        }
    }
    None
}
