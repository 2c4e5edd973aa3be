//! The JavaScript side of the traits: byte sources over `fetch` range requests, `Blob`
//! slices and a caller's reader object (Node.js files), and a host whose pause yields to
//! the event loop.

use std::cell::Cell;
use std::ops::Range;

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Blob, Request, RequestInit, Response};

use crate::engine::Host;
use crate::loader::ByteSource;
use ternion::{Error, Result};

/// A JavaScript exception or rejection as a typed error.
pub fn js_err(what: &str, e: JsValue) -> Error {
    let msg = e
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"));
    Error::Request(format!("{what}: {msg}"))
}

/// The global object's function `name` (`fetch`, `setTimeout`), on a page or in a worker.
fn global_fn(name: &str) -> Result<Function> {
    Reflect::get(&js_sys::global(), &name.into())
        .ok()
        .and_then(|f| f.dyn_into::<Function>().ok())
        .ok_or_else(|| Error::Request(format!("this JavaScript context has no {name}()")))
}

async fn fetch(req: &Request) -> Result<Response> {
    let p = global_fn("fetch")?
        .call1(&JsValue::NULL, req)
        .map_err(|e| js_err("fetch", e))?;
    JsFuture::from(Promise::from(p))
        .await
        .map_err(|e| js_err(&format!("fetch {}", req.url()), e))?
        .dyn_into::<Response>()
        .map_err(|e| js_err("fetch", e))
}

async fn body(resp: &Response) -> Result<Vec<u8>> {
    let buf = resp
        .array_buffer()
        .map_err(|e| js_err("reading a body", e))?;
    let buf = JsFuture::from(buf)
        .await
        .map_err(|e| js_err("reading a body", e))?;
    Ok(Uint8Array::new(&buf).to_vec())
}

fn range_request(url: &str, method: &str, range: Option<Range<u64>>) -> Result<Request> {
    let init = RequestInit::new();
    init.set_method(method);
    let req = Request::new_with_str_and_init(url, &init).map_err(|e| js_err(url, e))?;
    if let Some(r) = range {
        req.headers()
            .set("Range", &format!("bytes={}-{}", r.start, r.end - 1))
            .map_err(|e| js_err(url, e))?;
    }
    Ok(req)
}

/// A file on an HTTP server that answers range requests.
pub struct UrlSource {
    url: String,
    len: u64,
}

impl UrlSource {
    /// Finds the file's length (from a one-byte range request's `Content-Range`, else a
    /// HEAD request's `Content-Length`); errors when the server ignores ranges.
    pub async fn open(url: &str) -> Result<UrlSource> {
        UrlSource::probe(url)
            .await?
            .ok_or_else(|| Error::Request(format!("{url}: HTTP status 404 (not found)")))
    }

    /// [`UrlSource::open`], but `Ok(None)` when the server answers 404 (no such file).
    pub async fn probe(url: &str) -> Result<Option<UrlSource>> {
        let resp = fetch(&range_request(url, "GET", Some(0..1))?).await?;
        let status = resp.status();
        if status == 404 {
            return Ok(None);
        }
        if status == 200 {
            return Err(Error::Request(format!(
                "{url}: the server ignores range requests (status 200 for a range); \
                 serve the file from one that supports them, or load it as a local file"
            )));
        }
        if status != 206 {
            return Err(Error::Request(format!("{url}: HTTP status {status}")));
        }
        let header = |r: &Response, h: &str| r.headers().get(h).ok().flatten();
        let total = header(&resp, "Content-Range")
            .and_then(|v| v.rsplit('/').next().and_then(|t| t.trim().parse().ok()));
        let len = match total {
            Some(n) => n,
            None => {
                let head = fetch(&range_request(url, "HEAD", None)?).await?;
                header(&head, "Content-Length")
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| {
                        Error::Request(format!("{url}: the server gives no file length"))
                    })?
            }
        };
        Ok(Some(UrlSource {
            url: url.to_owned(),
            len,
        }))
    }
}

impl ByteSource for UrlSource {
    fn name(&self) -> &str {
        &self.url
    }

    fn len(&self) -> u64 {
        self.len
    }

    async fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let resp = fetch(&range_request(&self.url, "GET", Some(range.clone()))?).await?;
        let whole = range.start == 0 && range.end == self.len;
        match resp.status() {
            206 => body(&resp).await,
            200 if whole => body(&resp).await,
            s => Err(Error::Request(format!(
                "{}: HTTP status {s} for bytes {}..{}",
                self.url, range.start, range.end
            ))),
        }
    }
}

/// A browser `File` or `Blob` (a local file, or one cached in OPFS), read by slices.
pub struct BlobSource {
    blob: Blob,
    name: String,
}

impl BlobSource {
    /// Wraps `blob`; `name` is used in messages.
    pub fn new(blob: Blob, name: String) -> BlobSource {
        BlobSource { blob, name }
    }
}

impl ByteSource for BlobSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.blob.size() as u64
    }

    async fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let part = self
            .blob
            .slice_with_f64_and_f64(range.start as f64, range.end as f64)
            .map_err(|e| js_err(&self.name, e))?;
        let buf = JsFuture::from(part.array_buffer())
            .await
            .map_err(|e| js_err(&self.name, e))?;
        Ok(Uint8Array::new(&buf).to_vec())
    }
}

/// A reader object from the caller: `{ name, size, read(start, end) }`, where `read`
/// returns (a promise of) a `Uint8Array` of bytes `start..end` (the Node.js entry point
/// wraps a file handle in one).
pub struct ReaderSource {
    reader: JsValue,
    read: Function,
    name: String,
    len: u64,
}

impl ReaderSource {
    /// Checks that `reader` has a `read` function and a whole, non-negative `size`.
    pub fn new(reader: JsValue) -> Result<ReaderSource> {
        let field = |key: &str| Reflect::get(&reader, &key.into()).unwrap_or(JsValue::UNDEFINED);
        let name = field("name").as_string().unwrap_or_else(|| "reader".into());
        let read = field("read").dyn_into::<Function>().map_err(|_| {
            Error::Request(format!(
                "{name}: the reader has no read(start, end) function"
            ))
        })?;
        let size = field("size");
        let len = size
            .as_f64()
            .filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x <= (1u64 << 53) as f64)
            .ok_or_else(|| {
                let got = size
                    .as_f64()
                    .map_or_else(|| "no number".into(), |x| x.to_string());
                Error::Request(format!(
                    "{name}: the reader's size must be a whole number of bytes, got {got}"
                ))
            })? as u64;
        Ok(ReaderSource {
            reader,
            read,
            name,
            len,
        })
    }
}

impl ByteSource for ReaderSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    async fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let what = || format!("{}: read({}, {})", self.name, range.start, range.end);
        let r = self
            .read
            .call2(
                &self.reader,
                &(range.start as f64).into(),
                &(range.end as f64).into(),
            )
            .map_err(|e| js_err(&what(), e))?;
        let bytes = JsFuture::from(Promise::resolve(&r))
            .await
            .map_err(|e| js_err(&what(), e))?;
        bytes
            .dyn_into::<Uint8Array>()
            .map(|b| b.to_vec())
            .map_err(|_| Error::Request(format!("{} returned no Uint8Array", what())))
    }
}

/// The page's clock and event loop.
#[derive(Default)]
pub struct Browser {
    last_pause: Cell<f64>,
}

/// Longest stretch of work between two returns to the event loop.
const SLICE_MS: f64 = 50.0;

impl Host for Browser {
    fn now_ms(&self) -> f64 {
        // performance.now(): sub-millisecond, on a page, in a worker and in Node.js.
        match Reflect::get(&js_sys::global(), &"performance".into()) {
            Ok(p) if p.is_object() => p.unchecked_into::<web_sys::Performance>().now(),
            _ => js_sys::Date::now(),
        }
    }

    async fn pause(&self) {
        let now = self.now_ms();
        if now - self.last_pause.get() < SLICE_MS {
            return;
        }
        self.last_pause.set(now);
        if let Ok(set_timeout) = global_fn("setTimeout") {
            let p = Promise::new(&mut |resolve, _| {
                let _ = set_timeout.call2(&JsValue::NULL, &resolve, &JsValue::from(0));
            });
            let _ = JsFuture::from(p).await;
        }
    }
}
