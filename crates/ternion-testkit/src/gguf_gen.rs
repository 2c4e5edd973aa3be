//! A raw GGUF builder for hostile-file tests: every field is written as given, so counts,
//! lengths, type ids, offsets and alignment can lie. Used by `ternion/tests/hostile.rs`
//! and `ternion-cli/tests/hostile_cli.rs`.

use crate::quant::GgmlType;

/// GGUF metadata value type ids.
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STR: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata entry: key, value type id and the encoded value bytes.
#[derive(Clone, Debug)]
pub struct Kv {
    pub key: String,
    pub ty: u32,
    pub payload: Vec<u8>,
}

/// One tensor-table entry.
#[derive(Clone, Debug)]
pub struct Ti {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub offset: u64,
}

/// A whole file, written field by field.
#[derive(Clone, Debug)]
pub struct Raw {
    pub magic: [u8; 4],
    pub version: u32,
    /// Overrides of the tensor / metadata counts (otherwise the real counts).
    pub n_tensors: Option<u64>,
    pub n_kv: Option<u64>,
    pub kvs: Vec<Kv>,
    pub tis: Vec<Ti>,
    pub alignment: u64,
    pub data: Vec<u8>,
}

pub fn enc_str(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

pub fn u32v(v: u32) -> (u32, Vec<u8>) {
    (ty::U32, v.to_le_bytes().to_vec())
}

pub fn i32v(v: i32) -> (u32, Vec<u8>) {
    (ty::I32, v.to_le_bytes().to_vec())
}

pub fn u64v(v: u64) -> (u32, Vec<u8>) {
    (ty::U64, v.to_le_bytes().to_vec())
}

pub fn f32v(v: f32) -> (u32, Vec<u8>) {
    (ty::F32, v.to_le_bytes().to_vec())
}

pub fn strv(s: &str) -> (u32, Vec<u8>) {
    (ty::STR, enc_str(s))
}

/// An array value: element type, then each element's encoded bytes.
pub fn arrv(elem: u32, items: &[Vec<u8>]) -> (u32, Vec<u8>) {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for it in items {
        b.extend_from_slice(it);
    }
    (ty::ARRAY, b)
}

pub fn str_arr(items: &[&str]) -> (u32, Vec<u8>) {
    arrv(
        ty::STR,
        &items.iter().map(|s| enc_str(s)).collect::<Vec<_>>(),
    )
}

pub fn f32_arr(items: &[f32]) -> (u32, Vec<u8>) {
    arrv(
        ty::F32,
        &items
            .iter()
            .map(|v| v.to_le_bytes().to_vec())
            .collect::<Vec<_>>(),
    )
}

pub fn i32_arr(items: &[i32]) -> (u32, Vec<u8>) {
    arrv(
        ty::I32,
        &items
            .iter()
            .map(|v| v.to_le_bytes().to_vec())
            .collect::<Vec<_>>(),
    )
}

/// Model width, FFN width and vocabulary size of [`micro_model`].
pub const D: u64 = 128;
pub const FF: u64 = 128;
pub const NV: u64 = 4;

impl Raw {
    /// An empty version-3 file.
    pub fn new() -> Raw {
        Raw {
            magic: *b"GGUF",
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: Vec::new(),
            tis: Vec::new(),
            alignment: 32,
            data: Vec::new(),
        }
    }

    /// Sets (or replaces) a metadata entry.
    pub fn set(&mut self, key: &str, (ty, payload): (u32, Vec<u8>)) -> &mut Raw {
        match self.kvs.iter_mut().find(|k| k.key == key) {
            Some(k) => {
                k.ty = ty;
                k.payload = payload;
            }
            None => self.kvs.push(Kv {
                key: key.into(),
                ty,
                payload,
            }),
        }
        self
    }

    /// Removes a metadata entry.
    pub fn unset(&mut self, key: &str) -> &mut Raw {
        self.kvs.retain(|k| k.key != key);
        self
    }

    /// Adds a tensor (offsets and data are assigned by [`Raw::layout`]).
    pub fn tensor(&mut self, name: &str, t: GgmlType, dims: &[u64]) -> &mut Raw {
        self.tis.push(Ti {
            name: name.into(),
            dims: dims.to_vec(),
            ty: t.id(),
            offset: 0,
        });
        self
    }

    pub fn ti(&mut self, name: &str) -> &mut Ti {
        self.tis
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    pub fn remove_tensor(&mut self, name: &str) -> &mut Raw {
        self.tis.retain(|t| t.name != name);
        self
    }

    /// Assigns aligned offsets in table order and fills the data section: F32 tensors with
    /// 1.0, I2_S tensors with ternary codes and a scale of 1.0, everything else with zeros.
    pub fn layout(&mut self) -> &mut Raw {
        let mut data: Vec<u8> = Vec::new();
        for t in &mut self.tis {
            let gt = GgmlType::from_id(t.ty);
            let size = gt.and_then(|g| g.tensor_bytes(&t.dims)).unwrap_or(32) as usize;
            let off = data.len().div_ceil(self.alignment as usize) * self.alignment as usize;
            data.resize(off, 0);
            t.offset = off as u64;
            let mut bytes = vec![0u8; size];
            match gt {
                Some(GgmlType::F32) => {
                    for c in bytes.chunks_exact_mut(4) {
                        c.copy_from_slice(&1.0f32.to_le_bytes());
                    }
                }
                Some(GgmlType::I2_S) if size >= 32 => {
                    let packed = size - 32;
                    bytes[..packed].fill(0b1001_0110);
                    bytes[packed..packed + 4].copy_from_slice(&1.0f32.to_le_bytes());
                }
                _ => {}
            }
            data.extend_from_slice(&bytes);
        }
        self.data = data;
        self
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.magic);
        b.extend_from_slice(&self.version.to_le_bytes());
        let nt = self.n_tensors.unwrap_or(self.tis.len() as u64);
        let nk = self.n_kv.unwrap_or(self.kvs.len() as u64);
        b.extend_from_slice(&nt.to_le_bytes());
        b.extend_from_slice(&nk.to_le_bytes());
        for kv in &self.kvs {
            b.extend_from_slice(&enc_str(&kv.key));
            b.extend_from_slice(&kv.ty.to_le_bytes());
            b.extend_from_slice(&kv.payload);
        }
        for t in &self.tis {
            b.extend_from_slice(&enc_str(&t.name));
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.ty.to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        let a = self.alignment.max(1) as usize;
        b.resize(b.len().div_ceil(a) * a, 0);
        b.extend_from_slice(&self.data);
        b
    }
}

impl Default for Raw {
    fn default() -> Self {
        Raw::new()
    }
}

/// Names of the tensors of block 0, with their type and shape in [`micro_model`].
pub fn block_tensors() -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    vec![
        ("attn_norm", GgmlType::F32, vec![D]),
        ("attn_q", GgmlType::I2_S, vec![D, D]),
        ("attn_k", GgmlType::I2_S, vec![D, D]),
        ("attn_v", GgmlType::I2_S, vec![D, D]),
        ("attn_sub_norm", GgmlType::F32, vec![D]),
        ("attn_output", GgmlType::I2_S, vec![D, D]),
        ("ffn_norm", GgmlType::F32, vec![D]),
        ("ffn_gate", GgmlType::I2_S, vec![D, FF]),
        ("ffn_up", GgmlType::I2_S, vec![D, FF]),
        ("ffn_sub_norm", GgmlType::F32, vec![FF]),
        ("ffn_down", GgmlType::I2_S, vec![FF, D]),
    ]
}

/// A valid one-block BitNet b1.58 model of width 128 with a 4-token SPM vocabulary
/// (about 30 KB): every hostile case is a small edit of it.
pub fn micro_model() -> Raw {
    let a = "bitnet-b1.58";
    let mut r = Raw::new();
    r.set("general.architecture", strv(a))
        .set(&format!("{a}.context_length"), u32v(64))
        .set(&format!("{a}.embedding_length"), u32v(D as u32))
        .set(&format!("{a}.block_count"), u32v(1))
        .set(&format!("{a}.feed_forward_length"), u32v(FF as u32))
        .set(&format!("{a}.attention.head_count"), u32v(1))
        .set(&format!("{a}.attention.head_count_kv"), u32v(1))
        .set(&format!("{a}.rope.freq_base"), f32v(10000.0))
        .set(&format!("{a}.attention.layer_norm_rms_epsilon"), f32v(1e-5))
        .set("tokenizer.ggml.model", strv("llama"))
        .set(
            "tokenizer.ggml.tokens",
            str_arr(&["<unk>", "<s>", "</s>", "\u{2581}a"]),
        )
        .set("tokenizer.ggml.scores", f32_arr(&[0.0; 4]))
        .set("tokenizer.ggml.token_type", i32_arr(&[2, 3, 3, 1]))
        .set("tokenizer.ggml.bos_token_id", u32v(1))
        .set("tokenizer.ggml.eos_token_id", u32v(2));
    r.tensor("token_embd.weight", GgmlType::F32, &[D, NV]);
    for (name, t, dims) in block_tensors() {
        r.tensor(&format!("blk.0.{name}.weight"), t, &dims);
    }
    r.tensor("output_norm.weight", GgmlType::F32, &[D]);
    r.layout();
    r
}
