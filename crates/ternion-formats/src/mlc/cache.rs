//! `ndarray-cache.json` (or `tensor-cache.json`): the tensor index of an MLC directory, and
//! its shard files, memory-mapped and checked record by record before any tensor is read.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::{Error, Result};

/// Index file names, newest first (TVM renamed `ndarray-cache.json` to `tensor-cache.json`).
pub const INDEX_FILES: [&str; 2] = ["tensor-cache.json", "ndarray-cache.json"];

/// Largest index file read (a real 3.8 B-parameter model's index is about 100 KB).
const MAX_INDEX_BYTES: u64 = 64 << 20;

#[derive(Deserialize)]
struct IndexJson {
    records: Vec<ShardJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShardJson {
    data_path: String,
    format: String,
    nbytes: u64,
    records: Vec<RecordJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RecordJson {
    name: String,
    shape: Vec<u64>,
    dtype: String,
    format: String,
    nbytes: u64,
    byte_offset: u64,
}

/// How a record's elements are stored in its shard (little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// `uint32` (packed quantized codes).
    U32,
    /// `float16`.
    F16,
    /// `bfloat16`, or `float32` written with the `f32-to-bf16` encoding.
    Bf16,
    /// `float32`.
    F32,
}

impl Stored {
    /// Bytes per stored element.
    pub fn elem_bytes(self) -> u64 {
        match self {
            Stored::U32 | Stored::F32 => 4,
            Stored::F16 | Stored::Bf16 => 2,
        }
    }

    /// The storage of a record. The format is the whole dump's, so `f32-to-bf16` appears on
    /// every record of an MLC directory and changes only float32 ones (as TVM's
    /// `load_tensor_cache` reads it).
    pub(crate) fn parse(dtype: &str, format: &str) -> Option<Stored> {
        let f32_as_bf16 = match format {
            "raw" => false,
            "f32-to-bf16" => true,
            _ => return None,
        };
        Some(match dtype {
            "uint32" => Stored::U32,
            "float16" => Stored::F16,
            "bfloat16" => Stored::Bf16,
            "float32" if f32_as_bf16 => Stored::Bf16,
            "float32" => Stored::F32,
            _ => return None,
        })
    }
}

/// One tensor of the cache: its shape (outermost first, as MLC writes it), storage and bytes.
pub struct Tensor<'a> {
    /// Record name (`transformer.h.0.ln.weight`).
    pub name: &'a str,
    /// Shape, outermost dimension first.
    pub shape: &'a [u64],
    /// Element storage.
    pub stored: Stored,
    /// The record's bytes in its shard.
    pub bytes: &'a [u8],
}

struct Record {
    shard: usize,
    shape: Vec<u64>,
    stored: Stored,
    start: usize,
    len: usize,
}

/// A shard's bytes: mapped where the platform maps files, read otherwise.
#[cfg(not(target_arch = "wasm32"))]
type ShardBytes = memmap2::Mmap;
#[cfg(target_arch = "wasm32")]
type ShardBytes = Vec<u8>;

/// A shard file's bytes (`None` for an empty shard, which cannot be mapped).
struct Shard(Option<ShardBytes>);

impl Shard {
    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

/// The validated index and mapped shards of one MLC directory.
pub struct Cache {
    shards: Vec<Shard>,
    records: HashMap<String, Record>,
}

/// The index file of `dir`, if it has one.
pub fn index_path(dir: &Path) -> Option<PathBuf> {
    INDEX_FILES
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
}

/// Reads a small JSON file of `dir` into `T`, naming the file in every error.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if len > MAX_INDEX_BYTES {
        return Err(Error::Mlc(format!(
            "{}: {len} bytes is more than the {MAX_INDEX_BYTES} a JSON file may have",
            path.display()
        )));
    }
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&text)
        .map_err(|e| Error::Mlc(format!("{}: invalid JSON: {e}", path.display())))
}

impl Cache {
    /// Reads `dir`'s index, maps every shard and checks each record: a known dtype and
    /// format, `nbytes` equal to the shape's size, the range inside its shard, each shard
    /// file exactly `nbytes` long, names unique, shard paths inside `dir`.
    pub fn open(dir: &Path) -> Result<Cache> {
        let index = index_path(dir).ok_or_else(|| {
            Error::Mlc(format!(
                "{}: no {} or {}",
                dir.display(),
                INDEX_FILES[1],
                INDEX_FILES[0]
            ))
        })?;
        let json: IndexJson = read_json(&index)?;
        let bad = |msg: String| Error::Mlc(format!("{}: {msg}", index.display()));
        let mut shards = Vec::with_capacity(json.records.len());
        let mut records = HashMap::new();
        for (si, shard) in json.records.into_iter().enumerate() {
            if shard.format != "raw-shard" {
                return Err(bad(format!(
                    "shard '{}' has format '{}' (only 'raw-shard' is known)",
                    shard.data_path, shard.format
                )));
            }
            let path = shard_path(dir, &shard.data_path).ok_or_else(|| {
                bad(format!(
                    "shard path '{}' is not a file name inside the directory",
                    shard.data_path
                ))
            })?;
            let mapped = map_shard(&path, shard.nbytes)?;
            for r in shard.records {
                let stored = Stored::parse(&r.dtype, &r.format).ok_or_else(|| {
                    bad(format!(
                        "tensor '{}': unsupported dtype '{}' with format '{}'",
                        r.name, r.dtype, r.format
                    ))
                })?;
                let want = r
                    .shape
                    .iter()
                    .try_fold(stored.elem_bytes(), |acc, &d| acc.checked_mul(d));
                if want != Some(r.nbytes) {
                    return Err(bad(format!(
                        "tensor '{}': nbytes {} does not match shape {:?} of {}",
                        r.name, r.nbytes, r.shape, r.dtype
                    )));
                }
                let end = r.byte_offset.checked_add(r.nbytes);
                if end.is_none_or(|e| e > shard.nbytes) {
                    return Err(bad(format!(
                        "tensor '{}': bytes {}..+{} run past shard '{}' ({} bytes)",
                        r.name, r.byte_offset, r.nbytes, shard.data_path, shard.nbytes
                    )));
                }
                let rec = Record {
                    shard: si,
                    shape: r.shape,
                    stored,
                    // Both fit: they lie inside a mapped file.
                    start: r.byte_offset as usize,
                    len: r.nbytes as usize,
                };
                if records.insert(r.name.clone(), rec).is_some() {
                    return Err(bad(format!("tensor '{}' appears twice", r.name)));
                }
            }
            shards.push(mapped);
        }
        Ok(Cache { shards, records })
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Result<Tensor<'_>> {
        let (name, r) = self
            .records
            .get_key_value(name)
            .ok_or_else(|| Error::Mlc(format!("tensor '{name}' is missing from the index")))?;
        Ok(Tensor {
            name,
            shape: &r.shape,
            stored: r.stored,
            bytes: &self.shards[r.shard].bytes()[r.start..r.start + r.len],
        })
    }

    /// Whether the index has a tensor named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.records.contains_key(name)
    }
}

/// `dir/name` when `name` is a plain relative path that stays inside `dir`.
fn shard_path(dir: &Path, name: &str) -> Option<PathBuf> {
    let rel = Path::new(name);
    let plain = !name.is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then(|| dir.join(rel))
}

/// Maps a shard after checking that its length is the `nbytes` the index gives.
fn map_shard(path: &Path, nbytes: u64) -> Result<Shard> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len != nbytes {
        return Err(Error::Mlc(format!(
            "{}: shard is {len} bytes, the index says {nbytes}",
            path.display()
        )));
    }
    if len == 0 {
        return Ok(Shard(None));
    }
    #[cfg(not(target_arch = "wasm32"))]
    // SAFETY: the map is read-only; as with GGUF files, the shard must not be modified
    // while the directory is being converted.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    #[cfg(target_arch = "wasm32")]
    let bytes = {
        use std::io::Read;
        let mut v = Vec::with_capacity(len as usize);
        (&file)
            .read_to_end(&mut v)
            .map_err(|e| Error::io(path, e))?;
        v
    };
    Ok(Shard(Some(bytes)))
}
