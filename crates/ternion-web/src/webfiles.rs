//! The files of an MLC directory under a base URL, for `Ternion.loadMlc`: WebLLM's Cache
//! API entries first, then the caller's `open(url)` (the page's OPFS cache), then HTTP.
//!
//! WebLLM keeps a model's files in the Cache API, keyed by their full URL
//! (`new URL(file, model_url).href`): the shards, the index and the tokenizer files in
//! the cache `webllm/model`, `mlc-chat-config.json` in `webllm/config` (mlc-ai/web-llm
//! `src/cache_util.ts`; TVM's `ArtifactCache` in apache/tvm `web/src/artifact_cache.ts`
//! opens `caches.open(scope)` and matches `new Request(url)`). A page on the same origin
//! as a WebLLM session therefore finds them without downloading again.

use std::ops::Range;

use js_sys::{Function, Promise, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Blob, Cache, CacheStorage, Response};

use crate::browser::{js_err, BlobSource, UrlSource};
use crate::loader::ByteSource;
use crate::mlc::Files;
use ternion::{Error, Result};

/// The Cache API caches WebLLM writes model files into (mlc-ai/web-llm
/// `src/cache_util.ts`).
pub const WEBLLM_CACHES: [&str; 2] = ["webllm/model", "webllm/config"];

/// One file: a `Blob` (a Cache API entry, or the caller's) or a URL read by ranges.
pub enum WebFile {
    /// Read by slices.
    Blob(BlobSource),
    /// Read by HTTP range requests.
    Url(UrlSource),
}

impl ByteSource for WebFile {
    fn name(&self) -> &str {
        match self {
            WebFile::Blob(b) => b.name(),
            WebFile::Url(u) => u.name(),
        }
    }

    fn len(&self) -> u64 {
        match self {
            WebFile::Blob(b) => b.len(),
            WebFile::Url(u) => u.len(),
        }
    }

    async fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        match self {
            WebFile::Blob(b) => b.read(range).await,
            WebFile::Url(u) => u.read(range).await,
        }
    }
}

/// The files under one base URL (see the module docs for where each comes from).
pub struct WebFiles {
    base: String,
    open: Option<Function>,
}

impl WebFiles {
    /// The directory at `base` (a `/` is added when missing); `open(url)` is the caller's
    /// optional source of files.
    pub fn new(base: &str, open: Option<Function>) -> WebFiles {
        let mut base = base.to_owned();
        if !base.ends_with('/') {
            base.push('/');
        }
        WebFiles { base, open }
    }
}

async fn resolve(v: JsValue, what: &str) -> Result<JsValue> {
    JsFuture::from(Promise::resolve(&v))
        .await
        .map_err(|e| js_err(what, e))
}

/// The Cache API entry for `url` in one of WebLLM's caches, as a `Blob`.
async fn webllm_entry(url: &str) -> Result<Option<Blob>> {
    let Some(caches) = Reflect::get(&js_sys::global(), &"caches".into())
        .ok()
        .and_then(|c| c.dyn_into::<CacheStorage>().ok())
    else {
        return Ok(None);
    };
    let what = "reading WebLLM's Cache API entries";
    for scope in WEBLLM_CACHES {
        // `has` first: `open` would create an empty cache under WebLLM's name.
        if resolve(caches.has(scope).into(), what).await?.as_bool() != Some(true) {
            continue;
        }
        let cache: Cache = resolve(caches.open(scope).into(), what)
            .await?
            .dyn_into()
            .map_err(|e| js_err(what, e))?;
        let hit = resolve(cache.match_with_str(url).into(), what).await?;
        if let Ok(resp) = hit.dyn_into::<Response>() {
            let blob = resp.blob().map_err(|e| js_err(url, e))?;
            let blob = resolve(blob.into(), url).await?;
            return blob
                .dyn_into::<Blob>()
                .map(Some)
                .map_err(|e| js_err(url, e));
        }
    }
    Ok(None)
}

impl Files for WebFiles {
    type File = WebFile;

    fn base(&self) -> &str {
        &self.base
    }

    async fn open(&self, name: &str) -> Result<Option<WebFile>> {
        let url = format!("{}{name}", self.base);
        if let Some(blob) = webllm_entry(&url).await? {
            return Ok(Some(WebFile::Blob(BlobSource::new(blob, url))));
        }
        let Some(open) = &self.open else {
            return Ok(UrlSource::probe(&url).await?.map(WebFile::Url));
        };
        let what = format!("options.open({url})");
        let got = open
            .call1(&JsValue::NULL, &url.as_str().into())
            .map_err(|e| js_err(&what, e))?;
        let got = resolve(got, &what).await?;
        if got.is_null() || got.is_undefined() {
            return Ok(None);
        }
        let blob = got
            .dyn_into::<Blob>()
            .map_err(|_| Error::Request(format!("{what} gave neither a Blob nor null")))?;
        Ok(Some(WebFile::Blob(BlobSource::new(blob, url))))
    }
}
