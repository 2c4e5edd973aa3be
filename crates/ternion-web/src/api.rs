//! The JavaScript API: class `Ternion`.
//!
//! ```js
//! import init, { Ternion } from "./pkg/ternion_web.js";
//! await init();
//! if (!Ternion.hasWebGpu()) { /* report "no WebGPU" */ }
//! const t = await Ternion.loadUrl(url, { nCtx: 2048 }, (phase, done, total) => {});
//! // or an MLC q4f16_1 directory: await Ternion.loadMlc(baseUrl, { nCtx: 2048 }, onProgress)
//! const r = await t.generate("Hello", { maxTokens: 64, temperature: 0 }, (id, text) => {
//!   out.textContent += text;          // return false to stop
//! });
//! r.tokens; r.decodeTokS;              // ids, speed
//! t.stop(); t.reset();
//! ```
//! Every method that can fail rejects (or throws) a JavaScript `Error` with the core
//! crate's message; its `name` says what happened (the core's `Error::kind`:
//! `"NoAdapter"`, `"DeviceLost"`, `"OutOfMemory"`, `"ExceedsLimit"`, `"Unsupported"`,
//! `"Request"`, `"ContextFull"`, …), so a page can branch on `e.name`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Array, Function, Object, Reflect};
use wasm_bindgen::prelude::*;
use web_sys::Blob;

use crate::browser::{BlobSource, Browser, ReaderSource, UrlSource};
use crate::engine::{Backend, CpuSeq, Engine, Generated};
use crate::loader::{Gguf, ModelSource, Progress};
use crate::mlc::MlcSource;
use crate::webfiles::WebFiles;
use ternion::backend::gpu::{GpuContext, GpuModelOptions, GpuOptions, PrefillKernel};
use ternion::chat::{ChatTemplate, Conversation, TurnText};
use ternion::gguf::GgufFile;
use ternion::model::{LoadOptions, Model};
use ternion::sample::{Sampler, SamplerConfig};
use ternion::tokenizer::{PreTokenizer, Tokenizer, TokenizerOptions};
use ternion::{Error, Result};

/// Why there is no adapter when the browser has no `navigator.gpu` (the message says
/// "no WebGPU", as the page's own check does).
const NO_WEBGPU: &str = "no WebGPU: this browser does not expose navigator.gpu; use a browser \
                         with WebGPU enabled, or backend \"cpu\" for small models";

/// A JavaScript `Error` with `e`'s message, named by its kind ([`Error::kind`]).
fn to_js(e: Error) -> JsValue {
    let js = js_sys::Error::new(&e.to_string());
    js.set_name(e.kind());
    js.into()
}

fn get(obj: &JsValue, key: &str) -> Option<JsValue> {
    if !obj.is_object() {
        return None;
    }
    Reflect::get(obj, &key.into())
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

fn num(obj: &JsValue, key: &str) -> Result<Option<f64>> {
    match get(obj, key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| Error::Request(format!("option '{key}' must be a finite number"))),
    }
}

fn count(obj: &JsValue, key: &str, default: usize) -> Result<usize> {
    match num(obj, key)? {
        None => Ok(default),
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= u32::MAX as f64 => Ok(x as usize),
        Some(x) => Err(Error::Request(format!(
            "option '{key}' must be a whole number ≥ 0, got {x}"
        ))),
    }
}

fn flag(obj: &JsValue, key: &str) -> bool {
    get(obj, key).is_some_and(|v| v.is_truthy())
}

/// True when option `key` is given and false (an absent option means on).
fn off(obj: &JsValue, key: &str) -> bool {
    get(obj, key).is_some_and(|v| !v.is_truthy())
}

fn text(obj: &JsValue, key: &str) -> Option<String> {
    get(obj, key).and_then(|v| v.as_string())
}

/// The `prefill` option: the kernel of prompt batches' ternary linears. Absent or "auto":
/// the int8 subgroup-matrix tiles where the browser's adapter offers them (see
/// `ternion_gpu`'s `web.rs`), else the portable tiles; "tiled": the portable tiles;
/// "subgroup-matrix": the matrix tiles, or an error where the adapter lacks them.
fn prefill_kernel(options: &JsValue) -> Result<Option<PrefillKernel>> {
    Ok(match text(options, "prefill").as_deref() {
        None | Some("auto") => None,
        Some("tiled") => Some(PrefillKernel::Tiled),
        Some("subgroup-matrix") => Some(PrefillKernel::SubgroupMatrix),
        Some(other) => {
            return Err(Error::Request(format!(
                "option prefill: '{other}' is not one of auto, tiled, subgroup-matrix"
            )))
        }
    })
}

/// True when the page's JavaScript context exposes `navigator.gpu`.
fn webgpu_exposed() -> bool {
    let nav = Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or(JsValue::UNDEFINED);
    get(&nav, "gpu").is_some()
}

struct Inner {
    engine: RefCell<Engine>,
    chat: RefCell<Option<Conversation>>,
    template: ChatTemplate,
    stop: Cell<bool>,
    adapter: String,
}

/// A loaded model and one sequence (see the module docs for the JavaScript usage).
#[wasm_bindgen]
pub struct Ternion {
    inner: Rc<Inner>,
}

fn report(progress: &Option<Function>, phase: &str, p: Progress) {
    if let Some(f) = progress {
        let _ = f.call3(
            &JsValue::NULL,
            &phase.into(),
            &(p.done as f64).into(),
            &(p.total as f64).into(),
        );
    }
}

async fn load<M: ModelSource>(
    src: M,
    options: JsValue,
    progress: Option<Function>,
) -> Result<Ternion> {
    let backend_name = text(&options, "backend").unwrap_or_else(|| "webgpu".into());
    let tok_opts = TokenizerOptions {
        pre: None,
        // What Hugging Face uses for BitNet 2B-4T (the CLI's default too).
        pre_when_absent: PreTokenizer::Llama3,
    };
    let (header, backend, adapter): (Arc<GgufFile>, Backend, String) = match backend_name.as_str() {
        "webgpu" => {
            if !webgpu_exposed() {
                return Err(Error::NoAdapter {
                    backends: "BROWSER_WEBGPU".into(),
                    hint: NO_WEBGPU,
                });
            }
            // `f16: false` / `subgroups: false` keep those kernel variants off (to
            // measure what each costs).
            let gpu_opts = GpuOptions {
                disable_f16: off(&options, "f16"),
                disable_subgroups: off(&options, "subgroups"),
                prefill: prefill_kernel(&options)?,
                ..GpuOptions::default()
            };
            let ctx = GpuContext::new_async(&gpu_opts).await?;
            // The core's upload API takes an Arc (shared across threads natively); a page
            // has one thread.
            #[allow(clippy::arc_with_non_send_sync)]
            let ctx = Arc::new(ctx);
            let caps = ctx.caps();
            let name = if caps.name.is_empty() {
                "adapter"
            } else {
                caps.name.as_str()
            };
            let adapter = format!("{name}: f16 {}, subgroups {}", caps.f16, caps.subgroups);
            let header = src.header().await?;
            let n_ctx = count(&options, "nCtx", 2048)?.max(1);
            let opts = GpuModelOptions {
                n_ctx,
                max_batch: count(&options, "maxBatch", 64)?.max(1),
                ..GpuModelOptions::default()
            };
            let gpu = src
                .upload(ctx.clone(), &header, opts, |p| {
                    report(&progress, "weights", p)
                })
                .await?;
            ctx.check()?;
            (Arc::new(header), Backend::Gpu(Box::new(gpu)), adapter)
        }
        "cpu" => {
            let file = Arc::new(src.read_all().await?);
            let len = file.file_len();
            report(
                &progress,
                "weights",
                Progress {
                    done: len,
                    total: len,
                },
            );
            let model = Model::from_file(file.clone(), &LoadOptions::default())?;
            let n_ctx = count(&options, "nCtx", 2048)?.max(1);
            let state = model.cpu_state(n_ctx);
            let backend = Backend::Cpu(Box::new(CpuSeq {
                model,
                state,
                n_ctx,
            }));
            (file, backend, "cpu".into())
        }
        other => {
            return Err(Error::Request(format!(
                "backend '{other}' (use \"webgpu\" or \"cpu\")"
            )))
        }
    };
    finish(&header, backend, adapter, &tok_opts)
}

fn finish(
    header: &GgufFile,
    backend: Backend,
    adapter: String,
    tok_opts: &TokenizerOptions,
) -> Result<Ternion> {
    let tokenizer = Tokenizer::from_gguf(header, tok_opts)?;
    let template = ChatTemplate::from_metadata(header.get_str("tokenizer.chat_template")?);
    Ok(Ternion {
        inner: Rc::new(Inner {
            engine: RefCell::new(Engine::new(tokenizer, backend)),
            chat: RefCell::new(None),
            template,
            stop: Cell::new(false),
            adapter,
        }),
    })
}

fn sampler(options: &JsValue) -> Result<Sampler> {
    let d = SamplerConfig::default();
    let f = |key: &str, default: f32| -> Result<f32> {
        Ok(num(options, key)?.map_or(default, |x| x as f32))
    };
    Sampler::new(SamplerConfig {
        temperature: f("temperature", d.temperature)?,
        top_k: count(options, "topK", d.top_k)?,
        top_p: f("topP", d.top_p)?,
        min_p: f("minP", d.min_p)?,
        repeat_penalty: f("repeatPenalty", d.repeat_penalty)?,
        repeat_last_n: count(options, "repeatLastN", d.repeat_last_n)?,
        presence_penalty: f("presencePenalty", d.presence_penalty)?,
        frequency_penalty: f("frequencyPenalty", d.frequency_penalty)?,
        seed: count(options, "seed", 0)? as u64,
    })
}

/// What a call gets while a generation (or a benchmark) runs.
fn busy_error() -> Error {
    Error::Request("a generation is already running".into())
}

/// Sets `o[key] = v`.
fn set(o: &Object, key: &str, v: JsValue) -> Result<()> {
    Reflect::set(o, &key.into(), &v)
        .map(|_| ())
        .map_err(|_| Error::Request("building the result".into()))
}

fn result_object(g: &Generated) -> Result<JsValue> {
    let o = Object::new();
    let ids = |v: &[u32]| Array::from_iter(v.iter().map(|&i| JsValue::from(i)));
    set(&o, "promptTokens", ids(&g.prompt_tokens).into())?;
    set(&o, "tokens", ids(&g.tokens).into())?;
    set(&o, "text", g.text.as_str().into())?;
    set(&o, "finish", g.finish.as_str().into())?;
    set(&o, "promptMs", g.prompt_ms.into())?;
    set(&o, "decodeMs", g.decode_ms.into())?;
    set(&o, "promptTokS", g.prompt_tok_s().into())?;
    set(&o, "decodeTokS", g.decode_tok_s().into())?;
    Ok(o.into())
}

impl Inner {
    // As in `generate`, the borrow held across the awaits is the "busy" flag.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn bench(&self, options: JsValue) -> Result<JsValue> {
        let n_prompt = count(&options, "promptTokens", 512)?;
        let n_gen = count(&options, "genTokens", 128)?;
        let warmup_ms = num(&options, "warmupMs")?.unwrap_or(1500.0);
        let mut engine = self.engine.try_borrow_mut().map_err(|_| busy_error())?;
        let b = engine
            .bench(&Browser::default(), n_prompt, n_gen, warmup_ms)
            .await?;
        let o = Object::new();
        set(&o, "promptTokens", b.n_prompt.into())?;
        set(&o, "genTokens", b.n_gen.into())?;
        set(&o, "prefillMs", b.prefill_ms.into())?;
        set(&o, "decodeMs", b.decode_ms.into())?;
        set(&o, "prefillTokS", b.prefill_tok_s().into())?;
        set(&o, "decodeTokS", b.decode_tok_s().into())?;
        set(&o, "warmupMs", b.warmup_ms.into())?;
        set(&o, "warmupRounds", b.warmup_rounds.into())?;
        let ids = Array::from_iter(b.ids.iter().map(|&i| JsValue::from(i)));
        set(&o, "ids", ids.into())?;
        Ok(o.into())
    }

    /// The prompt's ids: given ids, a chat turn, or raw text.
    fn prompt_ids(&self, prompt: &str, options: &JsValue) -> Result<Vec<u32>> {
        if let Some(ids) = get(options, "tokens") {
            let arr: Array = ids
                .dyn_into()
                .map_err(|_| Error::Request("option 'tokens' must be an array of ids".into()))?;
            return arr
                .iter()
                .map(|v| {
                    v.as_f64()
                        .filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x <= u32::MAX as f64)
                        .map(|x| x as u32)
                        .ok_or_else(|| Error::Request("token ids must be whole numbers".into()))
                })
                .collect();
        }
        let mut engine = self.engine.borrow_mut();
        if !flag(options, "chat") {
            return engine.encode(prompt);
        }
        let mut chat = self.chat.borrow_mut();
        let conv = chat.get_or_insert_with(|| {
            let tok = engine.tokenizer();
            let piece = |id: Option<u32>| {
                id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
                    .unwrap_or_default()
            };
            Conversation::new(
                self.template.clone(),
                (piece(tok.bos_id()), piece(tok.eos_id())),
                tok.add_bos(),
                text(options, "system"),
            )
        });
        match conv.add_user(prompt)? {
            TurnText::Append(t) => engine.encode(&t),
            TurnText::Restart(t) => {
                engine.reset();
                engine.encode(&t)
            }
        }
    }

    // The engine stays borrowed for the whole generation on purpose: that borrow is the
    // "busy" flag, so a second generate or a reset meanwhile gets a clean error.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn generate(
        &self,
        prompt: String,
        options: JsValue,
        on_token: Option<Function>,
    ) -> Result<JsValue> {
        let ids = self.prompt_ids(&prompt, &options)?;
        let mut sampler = sampler(&options)?;
        let max_tokens = count(&options, "maxTokens", 256)?;
        let ignore_eos = flag(&options, "ignoreEos");
        self.stop.set(false);
        let mut engine = self.engine.try_borrow_mut().map_err(|_| busy_error())?;
        engine.set_chained(!off(&options, "chain"));
        let host = Browser::default();
        let g = engine
            .generate(
                &host,
                &ids,
                &mut sampler,
                max_tokens,
                ignore_eos,
                |id, piece| {
                    let keep = match &on_token {
                        Some(f) => {
                            let id = id.map_or(JsValue::UNDEFINED, JsValue::from);
                            f.call2(&JsValue::NULL, &id, &piece.into())
                                .is_ok_and(|r| r.as_bool() != Some(false))
                        }
                        None => true,
                    };
                    keep && !self.stop.get()
                },
            )
            .await?;
        if flag(&options, "chat") {
            if let Some(c) = self.chat.borrow_mut().as_mut() {
                c.add_assistant(&g.text);
            }
        }
        result_object(&g)
    }
}

#[wasm_bindgen]
impl Ternion {
    /// True when this browser exposes WebGPU (`navigator.gpu`).
    #[wasm_bindgen(js_name = hasWebGpu)]
    pub fn has_webgpu() -> bool {
        webgpu_exposed()
    }

    /// Loads a GGUF file from `url` by HTTP range requests (the header, then each tensor
    /// straight into GPU buffers). `options`: `{ backend: "webgpu" | "cpu", nCtx, maxBatch,
    /// f16, subgroups, prefill }` (`f16: false` / `subgroups: false` keep those kernel
    /// variants off; `prefill`: "auto", "tiled" or "subgroup-matrix", see [`prefill_kernel`]);
    /// `onProgress(phase, done, total)` is called as weights arrive.
    #[wasm_bindgen(js_name = loadUrl)]
    pub async fn load_url(
        url: String,
        options: JsValue,
        on_progress: Option<Function>,
    ) -> std::result::Result<Ternion, JsValue> {
        let src = UrlSource::open(&url).await.map_err(to_js)?;
        load(Gguf(src), options, on_progress).await.map_err(to_js)
    }

    /// Loads a GGUF `File` or `Blob` (a local file, or one cached in OPFS) by slices;
    /// options and progress as [`Ternion::load_url`].
    #[wasm_bindgen(js_name = loadFile)]
    pub async fn load_file(
        file: Blob,
        name: String,
        options: JsValue,
        on_progress: Option<Function>,
    ) -> std::result::Result<Ternion, JsValue> {
        load(Gguf(BlobSource::new(file, name)), options, on_progress)
            .await
            .map_err(to_js)
    }

    /// Loads a GGUF file through `reader`, an object `{ name, size, read(start, end) }`
    /// whose `read` returns (a promise of) a `Uint8Array` of those bytes; the Node.js
    /// entry point passes a file handle this way. Options and progress as
    /// [`Ternion::load_url`].
    #[wasm_bindgen(js_name = loadReader)]
    pub async fn load_reader(
        reader: JsValue,
        options: JsValue,
        on_progress: Option<Function>,
    ) -> std::result::Result<Ternion, JsValue> {
        let src = ReaderSource::new(reader).map_err(to_js)?;
        load(Gguf(src), options, on_progress).await.map_err(to_js)
    }

    /// Loads an MLC `q4f16_1` directory (Phi-3, as WebLLM ships it) from `baseUrl`:
    /// `mlc-chat-config.json`, `tensor-cache.json` or `ndarray-cache.json`, the tokenizer
    /// files and the shards, each tensor's records read by range and repacked into GPU
    /// buffers. Each file comes from WebLLM's Cache API entries when present (caches
    /// `webllm/model` and `webllm/config`, keyed by URL), else from `options.open(url)`
    /// when given (a promise of a `Blob`, or `null` when there is no such file: the page's
    /// OPFS cache), else by HTTP range requests. Other options and progress as
    /// [`Ternion::load_url`].
    #[wasm_bindgen(js_name = loadMlc)]
    pub async fn load_mlc(
        base_url: String,
        options: JsValue,
        on_progress: Option<Function>,
    ) -> std::result::Result<Ternion, JsValue> {
        let open = get(&options, "open")
            .map(|f| {
                f.dyn_into::<Function>().map_err(|_| {
                    Error::Request("option 'open' must be a function (url) => Blob | null".into())
                })
            })
            .transpose()
            .map_err(to_js)?;
        let files = WebFiles::new(&base_url, open);
        let src = MlcSource::open(&files).await.map_err(to_js)?;
        load(src, options, on_progress).await.map_err(to_js)
    }

    /// Generates from `prompt`, calling `onToken(id, text)` per token (`id` undefined for
    /// text completed at the end; return `false` to stop). Resolves to `{ promptTokens,
    /// tokens, text, finish, promptMs, decodeMs, promptTokS, decodeTokS }`. `options`:
    /// `maxTokens` (256), `temperature` (0.8; 0 = greedy), `topK`, `topP`, `minP`,
    /// `repeatPenalty`, `repeatLastN`, `presencePenalty`, `frequencyPenalty`, `seed`,
    /// `ignoreEos`, `chat` (render the turn with the model's chat template), `system`,
    /// `tokens` (prompt ids instead of text), `chain` (on WebGPU, greedy steps are chained
    /// on the GPU with the ids read back a few at a time, and a sampled step reads back
    /// only its top-k where that draws the same token; `chain: false` reads every step's
    /// argmax or logits row back before the next step, for comparison: the same tokens).
    pub fn generate(
        &self,
        prompt: String,
        options: JsValue,
        on_token: Option<Function>,
    ) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            inner
                .generate(prompt, options, on_token)
                .await
                .map_err(to_js)
        })
    }

    /// Asks a running generation to stop after the current token.
    pub fn stop(&self) {
        self.inner.stop.set(true);
    }

    /// Forgets the sequence (and the chat history); fails while a generation runs.
    pub fn reset(&self) -> std::result::Result<(), JsValue> {
        let mut engine = self.inner.engine.try_borrow_mut().map_err(|_| {
            to_js(Error::Request(
                "cannot reset while a generation is running".into(),
            ))
        })?;
        engine.reset();
        *self.inner.chat.borrow_mut() = None;
        Ok(())
    }

    /// "webgpu" or "cpu".
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.inner
            .engine
            .try_borrow()
            .map_or("busy", |e| e.backend().name())
            .into()
    }

    /// The adapter's name and the kernel variant features in use.
    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.inner.adapter.clone()
    }

    /// The GPU's kernel variants: `{ name, f16, subgroups, subgroupMinSize, prefill }`
    /// (`subgroups`: reductions within subgroups where a row's lanes fit the smallest
    /// subgroup, else in workgroup memory; `prefill`: the kernel of prompt batches); null
    /// on the CPU backend.
    #[wasm_bindgen(getter)]
    pub fn gpu(&self) -> std::result::Result<JsValue, JsValue> {
        let engine = self
            .inner
            .engine
            .try_borrow()
            .map_err(|_| to_js(busy_error()))?;
        let Backend::Gpu(g) = engine.backend() else {
            return Ok(JsValue::NULL);
        };
        let caps = g.context().caps();
        let o = Object::new();
        set(&o, "name", caps.name.as_str().into()).map_err(to_js)?;
        set(&o, "f16", caps.f16.into()).map_err(to_js)?;
        set(&o, "subgroups", caps.subgroups.into()).map_err(to_js)?;
        set(&o, "subgroupMinSize", caps.subgroup_min_size.into()).map_err(to_js)?;
        set(
            &o,
            "prefill",
            format!("{:?}", caps.prefill).to_lowercase().into(),
        )
        .map_err(to_js)?;
        Ok(o.into())
    }

    /// Times prefill and decode as `ternion bench` does natively (same random prompt, a
    /// warm-up first, greedy decode): `options` `{ promptTokens: 512, genTokens: 128,
    /// warmupMs: 1500 }`. Resolves to `{ promptTokens, genTokens, prefillMs, decodeMs,
    /// prefillTokS, decodeTokS, warmupMs, warmupRounds, ids }`. Forgets the sequence
    /// before and after; load with `nCtx` above prompt + generated tokens and `maxBatch`
    /// as the prefill step (`ternion bench --ubatch`, 512).
    pub fn bench(&self, options: JsValue) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(
            async move { inner.bench(options).await.map_err(to_js) },
        )
    }
}
