//! The browser's loader and generation loop, run natively: header from growing prefixes,
//! tensors streamed by range into the GPU plan (lavapipe in CI), and greedy ids equal to
//! the CPU reference session's. Without an adapter the GPU test fails unless
//! `TERNION_SKIP_GPU_TESTS=1`.
#![cfg(not(target_arch = "wasm32"))]

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use ternion::backend::gpu::{GpuContext, GpuModelOptions, GpuOptions};
use ternion::gguf::GgufFile;
use ternion::model::{LoadOptions, Model};
use ternion::quant::GgmlType;
use ternion::sample::{Sampler, SamplerConfig};
use ternion::session::{GenerateOptions, Session};
use ternion::tokenizer::{Tokenizer, TokenizerOptions};
use ternion::Result;
use ternion_testkit::synth::{self, Shape, Spec, Vocab};
use ternion_web::engine::{Backend, CpuSeq, Engine, Finish, Host};
use ternion_web::loader::{self, ByteSource, Progress};

/// A file in memory that records every read.
struct Mem {
    bytes: Vec<u8>,
    reads: RefCell<Vec<Range<u64>>>,
}

impl ByteSource for Mem {
    fn name(&self) -> &str {
        "micro.gguf"
    }

    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    async fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        self.reads.borrow_mut().push(range.clone());
        Ok(self.bytes[range.start as usize..range.end as usize].to_vec())
    }
}

struct Native(Instant);

impl Host for Native {
    fn now_ms(&self) -> f64 {
        self.0.elapsed().as_secs_f64() * 1e3
    }

    async fn pause(&self) {}
}

fn micro_model() -> Vec<u8> {
    let path = std::env::temp_dir().join(format!("ternion-web-micro-{}.gguf", std::process::id()));
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

#[test]
fn streamed_gpu_upload_generates_the_cpu_ids() {
    let ctx = match GpuContext::new(&GpuOptions::default()) {
        Ok(c) => Arc::new(c),
        Err(e) if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping (TERNION_SKIP_GPU_TESTS=1): {e}");
            return;
        }
        Err(e) => panic!("no GPU adapter ({e}); install mesa-vulkan-drivers"),
    };
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

    let host = Native(Instant::now());
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
