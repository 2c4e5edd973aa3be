//! MLC `q4f16_1` directories (WebLLM's Phi-3 shards) over byte sources: the small files
//! are read whole, the layout and GGUF header are built by the core's [`Layout`] (the same
//! conversion as the native loader), then each GGUF tensor's MLC records are read from
//! their shards by range, repacked ([`Recipe::convert`]) and handed to the GPU upload, so
//! memory holds one tensor's records at a time, never a shard or the model.
//!
//! The type of each weight (Q4_0, or Q8_0 for a code 15) must be fixed before any weight
//! is read, so this loader declares Q4_0 throughout; MLC's quantizer never writes code 15,
//! and a directory that holds one fails with a message naming the tensor.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ternion::backend::gpu::{GpuContext, GpuModel, GpuModelOptions, GpuUpload};
use ternion::gguf::GgufFile;
use ternion::mlc::cache::{Index, INDEX_FILES, MAX_INDEX_BYTES};
use ternion::mlc::config::{Phi3Config, CONFIG_FILE};
use ternion::mlc::error::MlcError;
use ternion::mlc::tokenizer::{TokenizerFiles, HF_CONFIG_FILE, HF_FILE, SPM_FILE};
use ternion::mlc::{Layout, Recipe};
use ternion::{Error, FormatError, Result};

use crate::loader::{read_exact, ByteSource, ModelSource, Progress, CPU_MAX_BYTES};

/// The files of one MLC directory, opened by name.
pub trait Files {
    /// An opened file.
    type File: ByteSource;
    /// The directory's name or base URL (ends with `/`), for messages.
    fn base(&self) -> &str;
    /// Opens the file `name` of the directory; `Ok(None)` when there is no such file.
    fn open(&self, name: &str) -> impl Future<Output = Result<Option<Self::File>>>;
}

/// An MLC directory ready to stream: its layout and opened shards.
pub struct MlcSource<S> {
    base: String,
    layout: Layout,
    shards: Vec<S>,
}

/// The whole of a small file (at most [`MAX_INDEX_BYTES`]).
async fn whole<S: ByteSource>(f: &S) -> Result<Vec<u8>> {
    if f.len() > MAX_INDEX_BYTES {
        return Err(FormatError::from(MlcError::FileTooLarge {
            file: f.name().to_string(),
            bytes: f.len(),
            max: MAX_INDEX_BYTES,
        })
        .into());
    }
    read_exact(f, 0..f.len()).await
}

async fn required<F: Files>(files: &F, name: &str, why: &'static str) -> Result<F::File> {
    files.open(name).await?.ok_or_else(|| {
        FormatError::from(MlcError::MissingFile {
            file: format!("{}{name}", files.base()),
            why,
        })
        .into()
    })
}

async fn optional<F: Files>(files: &F, name: &str) -> Result<Option<Vec<u8>>> {
    match files.open(name).await? {
        Some(f) => Ok(Some(whole(&f).await?)),
        None => Ok(None),
    }
}

impl<S: ByteSource> MlcSource<S> {
    /// Reads `mlc-chat-config.json`, the index (`tensor-cache.json`, else
    /// `ndarray-cache.json`) and the tokenizer files, builds the layout and opens every
    /// shard, checking its length against the index.
    pub async fn open<F: Files<File = S>>(files: &F) -> Result<MlcSource<S>> {
        let base = files.base().to_owned();
        let cfg_file = required(files, CONFIG_FILE, "the model's hyper-parameters").await?;
        let cfg = Phi3Config::parse(&whole(&cfg_file).await?, cfg_file.name())?;
        let mut index = None;
        for name in INDEX_FILES {
            if let Some(f) = files.open(name).await? {
                index = Some(Index::parse(&whole(&f).await?, f.name())?);
                break;
            }
        }
        let index = index.ok_or_else(|| {
            FormatError::from(MlcError::NoIndex {
                dir: base.to_string(),
            })
        })?;
        let spm = required(files, SPM_FILE, "the SentencePiece piece scores").await?;
        let tokenizer = TokenizerFiles {
            spm: whole(&spm).await?,
            hf_config: optional(files, HF_CONFIG_FILE).await?,
            hf: optional(files, HF_FILE).await?,
        };
        let name = base.trim_end_matches('/');
        let layout = Layout::new(name, &cfg, index, &tokenizer, |_| Ok(false))?;
        let mut shards = Vec::with_capacity(layout.index.shards().len());
        for info in layout.index.shards() {
            let f = required(files, &info.path, "a shard the index names").await?;
            if f.len() != info.nbytes {
                return Err(FormatError::from(MlcError::ShardLength {
                    file: f.name().to_string(),
                    len: f.len(),
                    expected: info.nbytes,
                })
                .into());
            }
            shards.push(f);
        }
        Ok(MlcSource {
            base,
            layout,
            shards,
        })
    }

    /// The GGUF bytes of one tensor: its records read from their shards and repacked.
    async fn tensor(&self, recipe: &Recipe) -> Result<Vec<u8>> {
        let mut parts = Vec::with_capacity(recipe.inputs.len());
        for name in &recipe.inputs {
            let r = self.layout.index.record(name)?;
            let range: Range<u64> = r.range.clone();
            parts.push(read_exact(&self.shards[r.shard], range).await?);
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        Ok(recipe.convert(&refs)?)
    }
}

impl<S: ByteSource> ModelSource for MlcSource<S> {
    async fn header(&self) -> Result<GgufFile> {
        Ok(self.layout.writer.header_file(Path::new(&self.base))?)
    }

    async fn upload(
        &self,
        ctx: Arc<GpuContext>,
        header: &GgufFile,
        opts: GpuModelOptions,
        mut progress: impl FnMut(Progress),
    ) -> Result<GpuModel> {
        let recipes: HashMap<&str, &Recipe> = self
            .layout
            .recipes
            .iter()
            .map(|r| (r.name.as_str(), r))
            .collect();
        let mut up = GpuUpload::new(ctx, header, opts)?;
        let total = up.total_bytes();
        let mut done = 0;
        while let Some(t) = up.next_tensor().cloned() {
            let recipe = recipes.get(t.name.as_str()).ok_or_else(|| {
                FormatError::from(MlcError::NoRecipe {
                    dir: self.base.clone(),
                    tensor: t.name.clone(),
                })
            })?;
            up.put(&self.tensor(recipe).await?)?;
            done += t.range.end - t.range.start;
            progress(Progress { done, total });
        }
        up.finish()
    }

    async fn read_all(&self) -> Result<GgufFile> {
        let header = self.header().await?;
        if header.file_len() > CPU_MAX_BYTES {
            return Err(Error::Request(format!(
                "{}: {} bytes converted is too large for the CPU backend in wasm (at most \
                 {CPU_MAX_BYTES}); use WebGPU",
                self.base,
                header.file_len()
            )));
        }
        let mut data = Vec::with_capacity(self.layout.recipes.len());
        for r in &self.layout.recipes {
            data.push(self.tensor(r).await?);
        }
        let name = Path::new(&self.base);
        let bytes = self
            .layout
            .writer
            .to_bytes(name, |i, _| Ok(std::mem::take(&mut data[i])))?;
        Ok(GgufFile::from_bytes(name, bytes)?)
    }
}
