//! `ndarray-cache.json` (or `tensor-cache.json`): the tensor index of an MLC directory, and
//! its shard files, memory-mapped and checked record by record before any tensor is read.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::error::MlcError;
use crate::{Error, Result};

/// Index file names, newest first (TVM renamed `ndarray-cache.json` to `tensor-cache.json`).
pub const INDEX_FILES: [&str; 2] = ["tensor-cache.json", "ndarray-cache.json"];

/// Largest JSON file read (a real 3.8 B-parameter model's index is about 100 KB).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

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

/// Where one record's bytes lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Index of its shard in [`Index::shards`].
    pub shard: usize,
    /// Shape, outermost dimension first.
    pub shape: Vec<u64>,
    /// Element storage.
    pub stored: Stored,
    /// Byte range in the shard.
    pub range: std::ops::Range<u64>,
}

/// One shard file the index names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardInfo {
    /// File name relative to the directory (checked to stay inside it).
    pub path: String,
    /// Its length in bytes.
    pub nbytes: u64,
}

/// A parsed and checked tensor index (no shard read yet): shards and records.
#[derive(Clone, Debug)]
pub struct Index {
    shards: Vec<ShardInfo>,
    records: HashMap<String, Record>,
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
    index: Index,
    shards: Vec<Shard>,
}

/// The index file of `dir`, if it has one.
pub fn index_path(dir: &Path) -> Option<PathBuf> {
    INDEX_FILES
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
}

/// Parses a small JSON file's bytes into `T`; `label` names the file in every error.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], label: &str) -> Result<T> {
    if bytes.len() as u64 > MAX_INDEX_BYTES {
        return Err(MlcError::FileTooLarge {
            file: label.to_string(),
            bytes: bytes.len() as u64,
            max: MAX_INDEX_BYTES,
        }
        .into());
    }
    serde_json::from_slice(bytes).map_err(|error| {
        MlcError::InvalidJson {
            file: label.to_string(),
            error,
        }
        .into()
    })
}

/// Reads a file of at most `max` bytes, naming it in every error.
pub(crate) fn read_small(path: &Path, max: u64) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if len > max {
        return Err(MlcError::FileTooLarge {
            file: path.display().to_string(),
            bytes: len,
            max,
        }
        .into());
    }
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

impl Index {
    /// Parses an index file's bytes and checks each record: a known dtype and format,
    /// `nbytes` equal to the shape's size, the range inside its shard, names unique, shard
    /// paths plain relative names. `label` names the file in errors.
    pub fn parse(bytes: &[u8], label: &str) -> Result<Index> {
        let json: IndexJson = parse_json(bytes, label)?;
        let file = || label.to_string();
        let mut shards = Vec::with_capacity(json.records.len());
        let mut records = HashMap::new();
        for (si, shard) in json.records.into_iter().enumerate() {
            if shard.format != "raw-shard" {
                return Err(MlcError::ShardFormat {
                    file: file(),
                    shard: shard.data_path,
                    format: shard.format,
                }
                .into());
            }
            if !is_plain(&shard.data_path) {
                return Err(MlcError::ShardPath {
                    file: file(),
                    shard: shard.data_path,
                }
                .into());
            }
            for r in shard.records {
                let Some(stored) = Stored::parse(&r.dtype, &r.format) else {
                    return Err(MlcError::UnsupportedDtype {
                        file: file(),
                        tensor: r.name,
                        dtype: r.dtype,
                        format: r.format,
                    }
                    .into());
                };
                let want = r
                    .shape
                    .iter()
                    .try_fold(stored.elem_bytes(), |acc, &d| acc.checked_mul(d));
                if want != Some(r.nbytes) {
                    return Err(MlcError::NbytesMismatch {
                        file: file(),
                        tensor: r.name,
                        nbytes: r.nbytes,
                        shape: r.shape,
                        dtype: r.dtype,
                    }
                    .into());
                }
                let end = r.byte_offset.checked_add(r.nbytes);
                let Some(end) = end.filter(|&e| e <= shard.nbytes) else {
                    return Err(MlcError::RecordPastShard {
                        file: file(),
                        tensor: r.name,
                        offset: r.byte_offset,
                        nbytes: r.nbytes,
                        shard: shard.data_path,
                        shard_bytes: shard.nbytes,
                    }
                    .into());
                };
                let rec = Record {
                    shard: si,
                    shape: r.shape,
                    stored,
                    range: r.byte_offset..end,
                };
                if records.insert(r.name.clone(), rec).is_some() {
                    return Err(MlcError::DuplicateTensor {
                        file: file(),
                        tensor: r.name,
                    }
                    .into());
                }
            }
            shards.push(ShardInfo {
                path: shard.data_path,
                nbytes: shard.nbytes,
            });
        }
        Ok(Index { shards, records })
    }

    /// The shard files, in index order.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    /// The record named `name`.
    pub fn record(&self, name: &str) -> Result<&Record> {
        self.records.get(name).ok_or_else(|| missing(name))
    }
}

impl Cache {
    /// Reads and checks `dir`'s index ([`Index::parse`]), then maps every shard, each
    /// exactly as long as the index says.
    pub fn open(dir: &Path) -> Result<Cache> {
        let path = index_path(dir).ok_or_else(|| MlcError::NoIndex {
            dir: dir.display().to_string(),
        })?;
        let bytes = read_small(&path, MAX_INDEX_BYTES)?;
        let index = Index::parse(&bytes, &path.display().to_string())?;
        let shards = index
            .shards
            .iter()
            .map(|s| map_shard(&dir.join(&s.path), s.nbytes))
            .collect::<Result<_>>()?;
        Ok(Cache { index, shards })
    }

    /// The parsed index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Result<Tensor<'_>> {
        let (name, r) = self
            .index
            .records
            .get_key_value(name)
            .ok_or_else(|| missing(name))?;
        // Both ends fit: they lie inside a mapped file.
        let range = r.range.start as usize..r.range.end as usize;
        Ok(Tensor {
            name,
            shape: &r.shape,
            stored: r.stored,
            bytes: &self.shards[r.shard].bytes()[range],
        })
    }
}

/// The error for a tensor the index does not have.
fn missing(name: &str) -> Error {
    MlcError::MissingTensor {
        tensor: name.to_string(),
    }
    .into()
}

/// Whether `name` is a plain relative path (no root, `.` or `..`).
fn is_plain(name: &str) -> bool {
    !name.is_empty()
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Maps a shard after checking that its length is the `nbytes` the index gives.
fn map_shard(path: &Path, nbytes: u64) -> Result<Shard> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len != nbytes {
        return Err(MlcError::ShardLength {
            file: path.display().to_string(),
            len,
            expected: nbytes,
        }
        .into());
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
