//! GGUF writer (version 3): used by tests and by `ternion synth`.
//!
//! Tensor data is streamed: declare every tensor, then hand over each tensor's bytes in
//! declaration order, so a 1 GB model never has to sit in memory whole.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::value::{Value, ValueType};
use super::{GgufFile, GgufPlace, GgufProblem, DEFAULT_ALIGNMENT, MAGIC};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// A tensor declared in the writer's table.
struct Declared {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    size: u64,
    offset: u64,
}

/// Builds a GGUF file: metadata and tensor declarations first, then data.
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<Declared>,
    alignment: u64,
    data_len: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty writer with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            metadata: Vec::new(),
            tensors: Vec::new(),
            alignment: DEFAULT_ALIGNMENT,
            data_len: 0,
        }
    }

    /// Adds a metadata entry. `general.alignment` also sets the data alignment.
    pub fn add(&mut self, key: &str, value: Value) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_int().filter(|a| *a > 0 && (a & (a - 1)) == 0) {
                self.alignment = a as u64;
            }
        }
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds an array of strings.
    pub fn add_strings<S: AsRef<str>>(&mut self, key: &str, items: &[S]) -> &mut Self {
        let v = items
            .iter()
            .map(|s| Value::Str(s.as_ref().to_string()))
            .collect();
        self.add(key, Value::Array(ValueType::Str, v))
    }

    /// Declares a tensor; its data must later be written in declaration order.
    pub fn declare(&mut self, name: &str, ty: GgmlType, shape: &[u64]) -> Result<&mut Self> {
        let size = ty
            .tensor_bytes(shape)
            .ok_or_else(|| Error::ShapeDoesNotFit {
                tensor: name.to_string(),
                ty,
                shape: shape.to_vec(),
            })?;
        let offset = self.data_len;
        self.data_len = (offset + size).div_ceil(self.alignment) * self.alignment;
        self.tensors.push(Declared {
            name: name.to_string(),
            ty,
            shape: shape.to_vec(),
            size,
            offset,
        });
        Ok(self)
    }

    /// Writes header, metadata and tensor table to `path`, then asks `fill` for each tensor's
    /// bytes in declaration order (index, name); each answer must have the declared size.
    pub fn write(
        &self,
        path: &Path,
        fill: impl FnMut(usize, &str) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let mut w = Out {
            w: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            path: path.to_path_buf(),
        };
        self.header(&mut w)?;
        self.data(&mut w, fill)?;
        w.w.flush().map_err(|e| Error::io(path, e))
    }

    /// [`GgufWriter::write`] into memory: the whole file as bytes (`name` labels errors).
    pub fn to_bytes(
        &self,
        name: &Path,
        fill: impl FnMut(usize, &str) -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let mut w = Out {
            w: Vec::new(),
            pos: 0,
            path: name.to_path_buf(),
        };
        self.header(&mut w)?;
        w.w.reserve_exact(self.data_len as usize);
        self.data(&mut w, fill)?;
        Ok(w.w)
    }

    /// The header alone (metadata and tensor table), parsed as a [`GgufFile`] that holds no
    /// tensor data: for loaders that make each tensor's bytes themselves and stream them.
    pub fn header_file(&self, name: &Path) -> Result<GgufFile> {
        let mut w = Out {
            w: Vec::new(),
            pos: 0,
            path: name.to_path_buf(),
        };
        self.header(&mut w)?;
        let len = w.pos + self.data_len;
        GgufFile::parse_header(name, w.w, len)?.ok_or_else(|| Error::Gguf {
            file: name.to_path_buf(),
            at: Box::new(GgufPlace::Header),
            problem: GgufProblem::HeaderIncomplete,
        })
    }

    /// Magic, counts, metadata, tensor table and the padding up to the data.
    fn header<W: Write>(&self, w: &mut Out<W>) -> Result<()> {
        w.put(&MAGIC)?;
        w.put(&3u32.to_le_bytes())?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())?;
        w.put(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            w.string(k)?;
            w.put(&(v.value_type() as u32).to_le_bytes())?;
            w.value(v)?;
        }
        for t in &self.tensors {
            w.string(&t.name)?;
            w.put(&(t.shape.len() as u32).to_le_bytes())?;
            for d in &t.shape {
                w.put(&d.to_le_bytes())?;
            }
            w.put(&t.ty.id().to_le_bytes())?;
            w.put(&t.offset.to_le_bytes())?;
        }
        w.pad(self.alignment)
    }

    /// Each tensor's bytes from `fill`, checked against its declared size, then padded.
    fn data<W: Write>(
        &self,
        w: &mut Out<W>,
        mut fill: impl FnMut(usize, &str) -> Result<Vec<u8>>,
    ) -> Result<()> {
        for (i, t) in self.tensors.iter().enumerate() {
            let data = fill(i, &t.name)?;
            if data.len() as u64 != t.size {
                return Err(Error::TensorDataSize {
                    tensor: t.name.clone(),
                    ty: t.ty,
                    shape: t.shape.clone(),
                    given: data.len() as u64,
                    expected: t.size,
                });
            }
            w.put(&data)?;
            w.pad(self.alignment)?;
        }
        Ok(())
    }

    /// Writes a file whose tensors are all given up front (small test models).
    pub fn write_with(&self, path: &Path, mut data: Vec<Vec<u8>>) -> Result<()> {
        self.write(path, |i, _| Ok(std::mem::take(&mut data[i])))
    }
}

struct Out<W> {
    w: W,
    pos: u64,
    path: PathBuf,
}

impl<W: Write> Out<W> {
    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.pos += b.len() as u64;
        self.w.write_all(b).map_err(|e| Error::io(&self.path, e))
    }

    fn pad(&mut self, align: u64) -> Result<()> {
        let n = self.pos.div_ceil(align) * align - self.pos;
        self.put(&vec![0u8; n as usize])
    }

    fn string(&mut self, s: &str) -> Result<()> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::U8(x) => self.put(&[*x]),
            Value::I8(x) => self.put(&x.to_le_bytes()),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::Bool(x) => self.put(&[*x as u8]),
            Value::Str(s) => self.string(s),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
            Value::Array(t, items) => {
                self.put(&(*t as u32).to_le_bytes())?;
                self.put(&(items.len() as u64).to_le_bytes())?;
                for it in items {
                    self.value(it)?;
                }
                Ok(())
            }
        }
    }
}
