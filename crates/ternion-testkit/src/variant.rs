//! Copies of a GGUF file with metadata keys and F32 tensors added: the variants of a
//! synthetic model that tests load (`attention.causal = false`, extra norms, ...).

use std::path::Path;

use crate::gguf::{GgufFile, GgufWriter, Value};
use crate::quant::GgmlType;
use crate::Result;

/// Writes to `out` the file at `src` with the metadata `keys` added after its own (a key
/// the file has already is written twice; the reader keeps the last) and the F32 vectors
/// `extra` appended as tensors of their names.
pub fn copy_with(
    src: &Path,
    out: &Path,
    keys: &[(&str, Value)],
    extra: &[(String, Vec<f32>)],
) -> Result<()> {
    let file = GgufFile::open(src)?;
    let mut w = GgufWriter::new();
    for (k, v) in file
        .metadata
        .iter()
        .cloned()
        .chain(keys.iter().map(|(k, v)| (k.to_string(), v.clone())))
    {
        w.add(&k, v);
    }
    for t in &file.tensors {
        w.declare(&t.name, t.ty, &t.shape)?;
    }
    for (name, v) in extra {
        w.declare(name, GgmlType::F32, &[v.len() as u64])?;
    }
    let n = file.tensors.len();
    w.write(out, |i, _| {
        Ok(match i.checked_sub(n) {
            None => file.tensor_data(&file.tensors[i]).to_vec(),
            Some(j) => extra[j].1.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
    })
}
