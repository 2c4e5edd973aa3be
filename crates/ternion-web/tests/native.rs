//! The browser's loader and generation loop, run natively: header from growing prefixes,
//! tensors streamed by range into the GPU plan (lavapipe in CI), and greedy ids equal to
//! the CPU reference session's. Without an adapter the GPU test fails unless
//! `TERNION_SKIP_GPU_TESTS=1`.
#![cfg(not(target_arch = "wasm32"))]

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ternion::backend::gpu::{GpuContext, GpuModel, GpuModelOptions, GpuOptions};
use ternion::gguf::GgufFile;
use ternion::model::{LoadOptions, Model};
use ternion::quant::GgmlType;
use ternion::sample::argmax;
use ternion::sample::{Sampler, SamplerConfig};
use ternion::session::{GenerateOptions, Session};
use ternion::tokenizer::{Tokenizer, TokenizerOptions};
use ternion::Result;
use ternion_testkit::mlc_synth::{write_phi3, Phi3Spec};
use ternion_testkit::synth::{self, Shape, Spec, Vocab};
use ternion_web::bench::bench_prompt;
use ternion_web::engine::{Backend, CpuSeq, Engine, Finish, Generated, Host};
use ternion_web::loader::{self, ByteSource, ModelSource, Progress};
use ternion_web::mlc::{Files, MlcSource};

use ternion_testkit::shared::shared_path;

/// A file in memory that records every read.
struct Mem {
    name: String,
    bytes: Vec<u8>,
    reads: RefCell<Vec<Range<u64>>>,
}

impl ByteSource for Mem {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    async fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        self.reads.borrow_mut().push(range.clone());
        Ok(self.bytes[range.start as usize..range.end as usize].to_vec())
    }
}

/// A host that counts its pauses.
struct Native(Instant, Cell<usize>);

impl Native {
    fn new() -> Native {
        Native(Instant::now(), Cell::new(0))
    }
}

impl Host for Native {
    fn now_ms(&self) -> f64 {
        self.0.elapsed().as_secs_f64() * 1e3
    }

    async fn pause(&self) {
        self.1.set(self.1.get() + 1);
    }
}

/// The micro synthetic model's bytes (written to a file of its own per call: the tests
/// run in parallel).
fn micro_model() -> Vec<u8> {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("ternion-web-micro-{}-{n}.gguf", std::process::id()));
    let spec = Spec {
        arch: "bitnet-b1.58",
        shape: Shape::named("micro").unwrap(),
        weight_type: GgmlType::I2_S,
        vocab: Vocab::Bytes { n_vocab: 259 },
        seed: 7,
    };
    synth::write(&spec, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

fn mem(bytes: &[u8]) -> Mem {
    Mem {
        name: "micro.gguf".into(),
        bytes: bytes.to_vec(),
        reads: RefCell::new(Vec::new()),
    }
}

#[test]
fn header_grows_from_a_small_prefix() {
    let bytes = micro_model();
    let src = mem(&bytes);
    let h = pollster::block_on(loader::read_header(&src, 64)).unwrap();
    let whole = GgufFile::from_bytes("micro.gguf", bytes.clone()).unwrap();
    assert_eq!(h.tensors.len(), whole.tensors.len());
    assert_eq!(h.data_offset, whole.data_offset);
    assert!(!h.has_tensor_data());
    let reads = src.reads.borrow();
    assert!(
        reads.len() > 1,
        "a 64-byte prefix cannot hold the header: {reads:?}"
    );
    for w in reads.windows(2) {
        assert_eq!(w[1].end, (w[0].end * 4).min(bytes.len() as u64));
    }
    assert!(reads.last().unwrap().end < bytes.len() as u64, "{reads:?}");
    // A file that is not GGUF is an error, not a loop.
    let junk = mem(&[7u8; 5000]);
    assert!(pollster::block_on(loader::read_header(&junk, 64)).is_err());
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig::greedy()).unwrap()
}

/// The GPU (lavapipe in CI); `None` only when `TERNION_SKIP_GPU_TESTS=1` says to skip.
fn gpu_context() -> Option<Arc<GpuContext>> {
    match GpuContext::new(&GpuOptions::default()) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping (TERNION_SKIP_GPU_TESTS=1): {e}");
            None
        }
        Err(e) => panic!("no GPU adapter ({e}); install mesa-vulkan-drivers"),
    }
}

#[test]
fn streamed_gpu_upload_generates_the_cpu_ids() {
    let Some(ctx) = gpu_context() else { return };
    let bytes = micro_model();
    let src = mem(&bytes);
    let header = pollster::block_on(loader::read_header(&src, loader::FIRST_PREFIX)).unwrap();
    src.reads.borrow_mut().clear();
    let mut seen: Vec<Progress> = Vec::new();
    let opts = GpuModelOptions {
        n_ctx: 64,
        ..GpuModelOptions::default()
    };
    let gpu =
        pollster::block_on(loader::upload(ctx, &src, &header, opts, |p| seen.push(p))).unwrap();
    let last = *seen.last().unwrap();
    assert_eq!(last.done, last.total);
    assert!(seen.windows(2).all(|w| w[0].done < w[1].done));
    // The micro file fits one read-ahead window: one read after the header.
    assert_eq!(src.reads.borrow().len(), 1, "{:?}", src.reads.borrow());

    let tok = Tokenizer::from_gguf(&header, &TokenizerOptions::default()).unwrap();
    let file = Arc::new(GgufFile::from_bytes("micro.gguf", bytes).unwrap());
    let model = Model::from_file(file, &LoadOptions::default()).unwrap();
    let prompt = tok
        .encode("Ternary weights on the web", true, true)
        .unwrap();

    // The reference: the native CPU session, as `ternion run` drives it.
    let want = {
        let mut session = Session::new(&model, 64);
        let gen = GenerateOptions {
            max_tokens: 16,
            ignore_eos: true,
        };
        session
            .generate(&prompt, &tok, &mut greedy(), &gen, |_| true)
            .unwrap()
            .generated
    };

    let host = Native::new();
    let tok2 = Tokenizer::from_gguf(&header, &TokenizerOptions::default()).unwrap();
    let mut web = Engine::new(tok2, Backend::Gpu(Box::new(gpu)));
    let mut text = String::new();
    let g = pollster::block_on(
        web.generate(&host, &prompt, &mut greedy(), 16, true, |_, t| {
            text.push_str(t);
            true
        }),
    )
    .unwrap();
    assert_eq!(g.tokens, want, "GPU engine vs CPU session");
    assert_eq!(g.text, text);
    assert_eq!(g.finish, Finish::Length);

    // Stop after 3 tokens, then continue: the same ids as one uninterrupted run.
    web.reset();
    let mut n = 0;
    let first =
        pollster::block_on(
            web.generate(&host, &prompt, &mut greedy(), 16, true, |_, _| {
                n += 1;
                n < 3
            }),
        )
        .unwrap();
    assert_eq!(first.finish, Finish::Cancelled);
    assert_eq!(first.tokens, want[..3]);
    let rest =
        pollster::block_on(web.generate(&host, &[], &mut greedy(), 13, true, |_, _| true)).unwrap();
    assert_eq!(rest.tokens, want[3..]);

    // The CPU backend of the same engine agrees too.
    let state = model.cpu_state(64);
    let mut cpu = Engine::new(
        tok,
        Backend::Cpu(Box::new(CpuSeq {
            model,
            state,
            n_ctx: 64,
        })),
    );
    let c = pollster::block_on(cpu.generate(&host, &prompt, &mut greedy(), 16, true, |_, _| true))
        .unwrap();
    assert_eq!(c.tokens, want, "CPU engine vs CPU session");
}

#[test]
fn bench_decodes_the_cli_prompt_greedily_and_leaves_the_sequence_empty() {
    let Some(ctx) = gpu_context() else { return };
    let bytes = micro_model();
    let src = mem(&bytes);
    let header = pollster::block_on(loader::read_header(&src, loader::FIRST_PREFIX)).unwrap();
    let opts = GpuModelOptions {
        n_ctx: 40,
        max_batch: 8,
        ..GpuModelOptions::default()
    };
    let gpu = pollster::block_on(loader::upload(ctx, &src, &header, opts, |_| {})).unwrap();
    let file = Arc::new(GgufFile::from_bytes("micro.gguf", bytes).unwrap());
    let model = Model::from_file(file, &LoadOptions::default()).unwrap();
    let tok = || Tokenizer::from_gguf(&header, &TokenizerOptions::default()).unwrap();
    let (n_prompt, n_gen) = (20, 12);

    // The reference: `ternion bench`'s CPU timing loop on the same prompt.
    let prompt = bench_prompt(model.config().n_vocab, n_prompt);
    assert!(prompt
        .iter()
        .all(|&id| (id as usize) < model.config().n_vocab));
    assert_eq!(prompt[..10], bench_prompt(model.config().n_vocab, 10));
    let want: Vec<u32> = {
        let mut s = Session::new(&model, 40);
        let mut next = argmax(s.prefill(&prompt).unwrap());
        let mut ids = vec![next];
        for _ in 0..n_gen {
            next = argmax(s.decode(next).unwrap());
            ids.push(next);
        }
        ids
    };

    let host = Native::new();
    let mut web = Engine::new(tok(), Backend::Gpu(Box::new(gpu)));
    // A sequence in progress is forgotten first.
    pollster::block_on(web.generate(&host, &[1, 2, 3], &mut greedy(), 2, true, |_, _| true))
        .unwrap();
    // 20 prompt tokens in steps of at most 8 (max_batch), and 10 ms of warm-up rounds.
    let b = pollster::block_on(web.bench(&host, n_prompt, n_gen, 10.0)).unwrap();
    assert_eq!(b.ids, want, "GPU bench vs the CPU session");
    assert_eq!((b.n_prompt, b.n_gen), (n_prompt, n_gen));
    assert!(b.warmup_rounds >= 1 && b.warmup_ms >= 10.0, "{b:?}");
    assert!(b.prefill_ms > 0.0 && b.decode_ms > 0.0, "{b:?}");
    assert!(b.prefill_tok_s() > 0.0 && b.decode_tok_s() > 0.0);
    assert!(web.fed().is_empty());

    // Too long for the context, no prompt, or a warm-up that is not a time: clear errors.
    let err = |r: Result<_>| r.unwrap_err().to_string();
    let e = err(pollster::block_on(web.bench(&host, 30, 10, 0.0)));
    assert!(e.contains("context of 40") && e.contains("nCtx"), "{e}");
    let e = err(pollster::block_on(web.bench(&host, 0, 4, 0.0)));
    assert!(e.contains("at least 1"), "{e}");
    let e = err(pollster::block_on(web.bench(&host, 4, 4, f64::NAN)));
    assert!(e.contains("warm-up"), "{e}");

    // The CPU backend runs the same prompt to the same ids.
    let state = model.cpu_state(40);
    let mut cpu = Engine::new(
        tok(),
        Backend::Cpu(Box::new(CpuSeq {
            model,
            state,
            n_ctx: 40,
        })),
    );
    let c = pollster::block_on(cpu.bench(&host, n_prompt, n_gen, 0.0)).unwrap();
    assert_eq!(c.ids, want, "CPU bench vs the CPU session");
    assert!(cpu.fed().is_empty());
}

/// What one generation of a [`Pair`] did: the result, every `on_token` call in order,
/// the cache length after it and the host's pauses during it.
struct Run {
    gen: Generated,
    calls: Vec<(Option<u32>, String)>,
    cached: usize,
    pauses: usize,
}

/// The same micro model twice on the GPU: decode steps chained (the default) and one step
/// per token read back.
struct Pair {
    chained: Engine,
    plain: Engine,
    host: Native,
}

impl Pair {
    fn new(ctx: Arc<GpuContext>, bytes: &[u8]) -> Pair {
        let src = mem(bytes);
        let header = pollster::block_on(loader::read_header(&src, loader::FIRST_PREFIX)).unwrap();
        let opts = GpuModelOptions {
            n_ctx: 96,
            ..GpuModelOptions::default()
        };
        let engine = || {
            let gpu = pollster::block_on(loader::upload(ctx.clone(), &src, &header, opts, |_| {}))
                .unwrap();
            let tok = Tokenizer::from_gguf(&header, &TokenizerOptions::default()).unwrap();
            Engine::new(tok, Backend::Gpu(Box::new(gpu)))
        };
        let (chained, mut plain) = (engine(), engine());
        plain.set_chained(false);
        Pair {
            chained,
            plain,
            host: Native::new(),
        }
    }

    /// The same generation on both engines: `prompt` (text), greedy unless `sampled`,
    /// `on_token` stopping after `cancel_after` tokens when given. Checks that both give
    /// the same ids, `on_token` calls, text, finish and cache length; returns the chained
    /// engine's run and the other one's pauses.
    fn run(
        &mut self,
        prompt: &str,
        sampled: bool,
        max: usize,
        cancel_after: Option<usize>,
    ) -> (Run, usize) {
        let host = &self.host;
        let [a, b] = [&mut self.chained, &mut self.plain].map(|e| {
            let ids = e.encode(prompt).unwrap();
            let mut sampler = if sampled {
                Sampler::new(SamplerConfig {
                    seed: 11,
                    ..SamplerConfig::default()
                })
                .unwrap()
            } else {
                greedy()
            };
            let mut calls = Vec::new();
            let before = host.1.get();
            let gen =
                pollster::block_on(e.generate(host, &ids, &mut sampler, max, true, |id, t| {
                    calls.push((id, t.to_string()));
                    cancel_after.is_none_or(|n| calls.len() < n)
                }))
                .unwrap();
            let Backend::Gpu(g) = e.backend() else {
                unreachable!("a GPU engine")
            };
            assert_eq!(g.pos(), e.fed().len(), "cache vs the tokens fed");
            Run {
                gen,
                calls,
                cached: g.pos(),
                pauses: host.1.get() - before,
            }
        });
        assert_eq!(a.gen.tokens, b.gen.tokens, "ids: chained vs token by token");
        assert_eq!(a.calls, b.calls, "on_token calls");
        assert_eq!(a.gen.text, b.gen.text);
        assert_eq!(a.gen.finish, b.gen.finish);
        assert_eq!(a.gen.prompt_tokens, b.gen.prompt_tokens);
        assert_eq!(a.cached, b.cached, "cache length after generate");
        (a, b.pauses)
    }

    fn reset(&mut self) {
        self.chained.reset();
        self.plain.reset();
    }

    fn set_stops(&mut self, stops: &[String]) {
        self.chained.set_stops(stops.to_vec());
        self.plain.set_stops(stops.to_vec());
    }
}

/// `generate` on the GPU chains greedy steps (ids back 8 at a time, steps past the end
/// discarded) and reads back only the top-k of sampled steps; one step per token, each
/// read back, gives the same ids, text, finish and cache length: for a token budget that
/// is not a multiple of the batch and a following generate going on from it, a stop
/// string and a cancellation inside a batch, and a sampled generation.
#[test]
fn chained_generate_equals_one_step_per_token() {
    let Some(ctx) = gpu_context() else { return };
    let mut p = Pair::new(ctx, &micro_model());
    let prompt = "Ternary weights on the web";

    // The reference: 40 tokens in one go.
    let (whole, plain_pauses) = p.run(prompt, false, 40, None);
    assert_eq!(whole.gen.tokens.len(), 40);
    assert_eq!(whole.gen.finish, Finish::Length);
    assert!(
        whole.pauses * 4 < plain_pauses,
        "chained: {} pauses, token by token: {plain_pauses}",
        whole.pauses
    );

    // 13 tokens (the first from the prompt, then 8 + 4 chained), then 11 more from the
    // token left pending: the ids of the uninterrupted run.
    p.reset();
    let (a, _) = p.run(prompt, false, 13, None);
    assert_eq!(a.gen.finish, Finish::Length);
    let (b, _) = p.run("", false, 11, None);
    assert_eq!(b.gen.prompt_tokens.len(), 1, "the pending token");
    let joined: Vec<u32> = a.gen.tokens.iter().chain(&b.gen.tokens).copied().collect();
    assert_eq!(joined, whole.gen.tokens[..24]);

    // Cancelled after the 11th token (inside the second batch), then going on.
    p.reset();
    let (a, _) = p.run(prompt, false, 40, Some(11));
    assert_eq!(a.gen.finish, Finish::Cancelled);
    assert_eq!(a.gen.tokens, whole.gen.tokens[..11]);
    let (b, _) = p.run("", false, 5, None);
    assert_eq!(b.gen.tokens, whole.gen.tokens[11..16]);

    // A stop string: the text of the first 11 tokens, so the generation ends inside the
    // second batch of chained steps; the next generate goes on from there.
    let upto: String = whole.calls[..11].iter().map(|c| c.1.as_str()).collect();
    assert!(
        !upto.is_empty(),
        "the micro model's first tokens give no text"
    );
    p.reset();
    p.set_stops(std::slice::from_ref(&upto));
    let (a, _) = p.run(prompt, false, 40, None);
    assert_eq!(a.gen.finish, Finish::Stop);
    let n = a.gen.tokens.len();
    assert!(n > 8 && n <= 11, "stopped after {n} tokens");
    assert_eq!(a.gen.tokens, whole.gen.tokens[..n]);
    p.set_stops(&[]);
    let (b, _) = p.run(" and on", false, 6, None);
    assert_eq!(b.gen.tokens.len(), 6);

    // Up to the end of the context (96 positions).
    p.reset();
    let (c, _) = p.run(prompt, false, 200, None);
    assert_eq!(c.gen.finish, Finish::Context);
    assert_eq!(c.cached, 95);

    // Sampled (temperature 0.8, top-k 40): the GPU top-k against whole rows.
    p.reset();
    let (s, _) = p.run(prompt, true, 20, None);
    assert_eq!(s.gen.tokens.len(), 20);
}

/// An MLC directory on disk, each file read into memory when opened.
struct Dir(std::path::PathBuf, String);

impl Files for Dir {
    type File = Mem;

    fn base(&self) -> &str {
        &self.1
    }

    async fn open(&self, name: &str) -> Result<Option<Mem>> {
        let path = self.0.join(name);
        Ok(path.is_file().then(|| Mem {
            name: path.display().to_string(),
            bytes: std::fs::read(&path).unwrap(),
            reads: RefCell::new(Vec::new()),
        }))
    }
}

/// A random MLC Phi-3 directory from the native test writer (`code_15`: one weight holds
/// a code 15).
fn mlc_dir(tag: &str, code_15: bool) -> Dir {
    let root = ternion_testkit::scratch::dir("ternion-web-mlc").join(tag);
    std::fs::remove_dir_all(&root).ok();
    let dir = root.join("mlc");
    let spec = Phi3Spec {
        shape: Shape::named("micro").unwrap(),
        vocab: &shared_path("vocab/ggml-vocab-phi-3.gguf"),
        seed: 5,
        code_15,
        shard_bytes: 256 << 10,
    };
    write_phi3(&spec, &dir, &root.join("ref.gguf")).unwrap();
    let base = format!("{}/", dir.display());
    Dir(dir, base)
}

#[test]
fn mlc_streaming_loader_equals_the_native_loader() {
    let dir = mlc_dir("same", false);
    let native = ternion::mlc::load_dir(&dir.0).unwrap();
    let src = pollster::block_on(MlcSource::open(&dir)).unwrap();
    let web = pollster::block_on(src.read_all()).unwrap();
    assert_eq!(web.metadata, native.metadata);
    assert_eq!(web.tensors.len(), native.tensors.len());
    for (a, b) in web.tensors.iter().zip(&native.tensors) {
        assert_eq!((&a.name, a.ty, &a.shape), (&b.name, b.ty, &b.shape));
        assert!(web.tensor_data(a) == native.tensor_data(b), "{}", a.name);
    }
    let header = pollster::block_on(src.header()).unwrap();
    assert!(!header.has_tensor_data());
    assert_eq!(header.file_len(), native.file_len());

    let Some(ctx) = gpu_context() else { return };
    let opts = GpuModelOptions {
        n_ctx: 64,
        ..GpuModelOptions::default()
    };
    let mut seen: Vec<Progress> = Vec::new();
    let gpu = pollster::block_on(src.upload(ctx.clone(), &header, opts, |p| seen.push(p))).unwrap();
    let last = *seen.last().unwrap();
    assert_eq!(last.done, last.total);
    // The native MLC path on the same GPU (the same kernels) gives the same ids.
    let model = Model::from_file(Arc::new(native), &LoadOptions::default()).unwrap();
    let reference = GpuModel::from_model(ctx, &model, opts).unwrap();
    let host = Native::new();
    let tok = || Tokenizer::from_gguf(&header, &TokenizerOptions::default()).unwrap();
    let prompt = tok()
        .encode("Ternary weights on the web", true, true)
        .unwrap();
    let run = |backend| {
        let mut e = Engine::new(tok(), backend);
        pollster::block_on(e.generate(&host, &prompt, &mut greedy(), 16, true, |_, _| true))
            .unwrap()
            .tokens
    };
    let want = run(Backend::Gpu(Box::new(reference)));
    let got = run(Backend::Gpu(Box::new(gpu)));
    assert_eq!(
        got, want,
        "streamed MLC upload vs the native MLC path, both on the GPU"
    );
}

#[test]
fn mlc_streaming_loader_names_what_is_wrong() {
    // A code 15 (never written by MLC) is refused by name; the native loader takes it.
    let dir = mlc_dir("code15", true);
    assert!(ternion::mlc::load_dir(&dir.0).is_ok());
    let src = pollster::block_on(MlcSource::open(&dir)).unwrap();
    let e = pollster::block_on(src.read_all())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("code 15") && e.contains("q_weight"), "{e}");

    // A missing shard and a shard of the wrong length are named.
    let shard = dir.0.join("params_shard_0.bin");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[1..]).unwrap();
    let e = pollster::block_on(MlcSource::open(&dir))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("params_shard_0.bin") && e.contains("the index says"),
        "{e}"
    );
    std::fs::remove_file(&shard).unwrap();
    let e = pollster::block_on(MlcSource::open(&dir))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("params_shard_0.bin: not found"), "{e}");

    // No index, no configuration.
    std::fs::remove_file(dir.0.join("ndarray-cache.json")).unwrap();
    let e = pollster::block_on(MlcSource::open(&dir))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no ndarray-cache.json or tensor-cache.json"),
        "{e}"
    );
    std::fs::remove_file(dir.0.join("mlc-chat-config.json")).unwrap();
    let e = pollster::block_on(MlcSource::open(&dir))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("mlc-chat-config.json: not found"), "{e}");
}
