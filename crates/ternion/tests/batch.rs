//! Batched forward passes across sequences give the same logits as each sequence alone:
//! prefill chunks and single-token decode steps of several sequences stacked into one pass,
//! on BitNet (I2_S, TQ2_0), Llama (F16, Q4_K), Phi-3 (F16) and GPT-2 (Q8_0) models.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ternion::backend::cpu::{SeqStep, Workspace};
use ternion::kv::{KvGeometry, KvPool, KvSeq};
use ternion::model::{self, Logits, Model};
use ternion::quant::GgmlType;
use ternion::session::{CpuEngine, Session};
use ternion::Error;
use ternion_testkit::synth::{self, Shape, Spec, Vocab};

use ternion_testkit::shared;

/// One sequence's tokens and how they are fed: (chunk length, logits wanted) per step.
struct Plan {
    tokens: Vec<u32>,
    chunks: Vec<(usize, Logits)>,
}

fn plans() -> Vec<Plan> {
    use Logits::{All, Last};
    let chunks = [
        vec![(5, All), (1, All), (1, Last), (3, Last), (1, All), (1, All)],
        vec![(2, Last), (3, All), (1, All), (1, All), (1, Last)],
        vec![
            (1, All),
            (1, All),
            (4, All),
            (1, All),
            (1, All),
            (1, All),
            (1, All),
        ],
        vec![(9, Last), (1, All)],
    ];
    chunks
        .into_iter()
        .enumerate()
        .map(|(s, chunks)| {
            let n: usize = chunks.iter().map(|c| c.0).sum();
            Plan {
                tokens: (0..n)
                    .map(|i| ((i * 37 + s * 11 + 3) % 97) as u32)
                    .collect(),
                chunks,
            }
        })
        .collect()
}

/// Logits of every chunk of `plan`, the sequence running alone.
fn alone(m: &Model, plan: &Plan) -> Vec<Vec<f32>> {
    let mut st = m.cpu_state(64);
    let mut at = 0;
    plan.chunks
        .iter()
        .map(|&(n, which)| {
            let out = m
                .forward_cpu(&plan.tokens[at..at + n], which, &mut st)
                .unwrap()
                .to_vec();
            at += n;
            out
        })
        .collect()
}

/// Logits of every chunk of every plan, all sequences stepped together: round `r` runs
/// chunk `r` of every plan that has one, as one pass.
fn batched(m: &Model, plans: &[Plan], pool: &Arc<KvPool>) -> Vec<Vec<Vec<f32>>> {
    let mut kvs: Vec<KvSeq> = plans.iter().map(|_| KvSeq::new(pool.clone(), 64)).collect();
    let mut at = vec![0usize; plans.len()];
    let mut out = vec![Vec::new(); plans.len()];
    let mut ws = Workspace::default();
    let rounds = plans.iter().map(|p| p.chunks.len()).max().unwrap();
    for r in 0..rounds {
        let live: Vec<usize> = (0..plans.len())
            .filter(|&s| r < plans[s].chunks.len())
            .collect();
        let mut steps: Vec<SeqStep<'_>> = kvs
            .iter_mut()
            .enumerate()
            .filter(|(s, _)| live.contains(s))
            .map(|(s, kv)| {
                let (n, logits) = plans[s].chunks[r];
                SeqStep {
                    kv,
                    tokens: &plans[s].tokens[at[s]..at[s] + n],
                    logits,
                }
            })
            .collect();
        m.forward_batch(&mut steps, &mut ws).unwrap();
        drop(steps);
        for (i, &s) in live.iter().enumerate() {
            out[s].push(ws.logits(m.graph(), i).to_vec());
            at[s] += plans[s].chunks[r].0;
        }
    }
    out
}

fn check(path: &Path, what: &str) {
    let (_file, m) = model::load(path).unwrap();
    let plans = plans();
    let want: Vec<_> = plans.iter().map(|p| alone(&m, p)).collect();
    let pool = m.kv_pool(64, plans.len());
    let got = batched(&m, &plans, &pool);
    for (s, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.len(), g.len());
        for (c, (a, b)) in w.iter().zip(g).enumerate() {
            assert!(!a.is_empty());
            assert_eq!(a.len(), b.len(), "{what}: sequence {s} chunk {c}");
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            let max = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                same,
                "{what}: sequence {s} chunk {c} differs (max |diff| {max})"
            );
        }
    }
    assert_eq!(
        pool.pages_in_use(),
        0,
        "{what}: pages freed with the sequences"
    );
}

fn synth_bitnet(ty: GgmlType, name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ternion-batch-{}-{name}", std::process::id()));
    synth::write(
        &Spec {
            arch: "bitnet-b1.58",
            shape: Shape::named("tiny").unwrap(),
            weight_type: ty,
            vocab: Vocab::Bytes { n_vocab: 300 },
            seed: 5,
        },
        &path,
    )
    .unwrap();
    path
}

#[test]
fn batched_equals_alone_bitnet_i2s() {
    let p = synth_bitnet(GgmlType::I2_S, "i2s.gguf");
    check(&p, "bitnet I2_S");
    std::fs::remove_file(&p).ok();
}

#[test]
fn batched_equals_alone_golden_families() {
    let dir = shared::shared_path("golden/models");
    for f in [
        "llama-spm-d32-f16.gguf",
        "llama-spm-d256-q4_k.gguf",
        "phi3-d32-f16.gguf",
        "gpt2-d32-q8_0.gguf",
        "bitnet-spm-d256-tq2_0.gguf",
    ] {
        check(&dir.join(f), f);
    }
}

#[test]
fn exhausted_pool_fails_the_pass_and_changes_no_cache() {
    let p = synth_bitnet(GgmlType::I2_S, "pool.gguf");
    let (_file, m) = model::load(&p).unwrap();
    let g: KvGeometry = m.kv_geometry();
    // Three pages: the first sequence needs two (40 positions), the second two more.
    let pool = KvPool::new(g, 3);
    let mut a = KvSeq::new(pool.clone(), 64);
    let mut b = KvSeq::new(pool.clone(), 64);
    let (ta, tb) = (vec![1u32; 40], vec![2u32; 33]);
    let mut ws = Workspace::default();
    let mut steps = [
        SeqStep {
            kv: &mut a,
            tokens: &ta,
            logits: Logits::Last,
        },
        SeqStep {
            kv: &mut b,
            tokens: &tb,
            logits: Logits::Last,
        },
    ];
    let e = m.forward_batch(&mut steps, &mut ws).unwrap_err();
    assert!(matches!(e, Error::KvPoolExhausted { .. }), "{e}");
    assert_eq!((a.len(), b.len(), pool.pages_in_use()), (0, 0, 0));
    // Alone, each fits; a context overflow is its own error.
    let mut one = [SeqStep {
        kv: &mut a,
        tokens: &ta,
        logits: Logits::Last,
    }];
    m.forward_batch(&mut one, &mut ws).unwrap();
    assert_eq!((a.len(), pool.pages_in_use()), (40, 2));
    let long = vec![3u32; 65];
    let mut over = [SeqStep {
        kv: &mut b,
        tokens: &long,
        logits: Logits::Last,
    }];
    let e = m.forward_batch(&mut over, &mut ws).unwrap_err();
    assert!(e.to_string().contains("context full"), "{e}");
    drop(a);
    assert_eq!(pool.pages_in_use(), 0);
    std::fs::remove_file(&p).ok();
}

#[test]
fn sessions_share_a_pool_and_give_pages_back_on_reset_and_drop() {
    let p = synth_bitnet(GgmlType::I2_S, "sessions.gguf");
    let (_file, m) = model::load(&p).unwrap();
    let pool = m.kv_pool(128, 2);
    let mut a = Session::with_engine(Box::new(CpuEngine::in_pool(&m, pool.clone(), 128)));
    let mut b = Session::with_engine(Box::new(CpuEngine::in_pool(&m, pool.clone(), 128)));
    let (pa, pb) = (vec![7u32; 40], vec![9u32; 10]);
    let got = a.prefill(&pa).unwrap().to_vec();
    b.prefill(&pb).unwrap();
    assert_eq!(
        pool.pages_in_use(),
        3,
        "40 positions take 2 pages of 32, 10 take 1"
    );
    // A session in a shared pool computes what a standalone one does.
    let mut solo = Session::new(&m, 128);
    assert_eq!(solo.prefill(&pa).unwrap(), &got[..]);
    a.reset();
    assert_eq!(pool.pages_in_use(), 1);
    drop(b);
    assert_eq!(pool.pages_in_use(), 0);
    std::fs::remove_file(&p).ok();
}

/// A prompt one token longer than a prefill chunk runs as 511 + 2 tokens, never as
/// 512 + a single token with decode numerics: its logits equal the whole prompt's as one
/// batch, and the generation after it is the same.
#[test]
fn prompt_of_513_tokens_gives_the_logits_of_one_batch() {
    use ternion::sample::{Sampler, SamplerConfig};
    use ternion::session::GenerateOptions;
    use ternion::tokenizer::{Tokenizer, TokenizerOptions};
    let p = synth_bitnet(GgmlType::I2_S, "p513.gguf");
    let (file, m) = model::load(&p).unwrap();
    let prompt: Vec<u32> = (0..513u32).map(|i| (i * 37 + 11) % 256).collect();
    let mut whole = m.cpu_state(600);
    let want = m
        .forward_cpu(&prompt, Logits::Last, &mut whole)
        .unwrap()
        .to_vec();
    let mut s = Session::new(&m, 600);
    assert_eq!(s.prefill(&prompt).unwrap(), &want[..]);
    // The old split (512 + 1) differs: the single token runs with decode numerics.
    let mut split = m.cpu_state(600);
    m.forward_cpu(&prompt[..512], Logits::Last, &mut split)
        .unwrap();
    let last = m
        .forward_cpu(&prompt[512..], Logits::Last, &mut split)
        .unwrap();
    assert_ne!(last, &want[..], "a 1-token step has its own numerics");
    // Generation through the stepper starts from the same logits.
    let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default()).unwrap();
    let opts = GenerateOptions {
        max_tokens: 8,
        ignore_eos: true,
    };
    let mut g = Session::new(&m, 600);
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let got = g
        .generate(&prompt, &tok, &mut sampler, &opts, |_| true)
        .unwrap();
    assert_eq!(got.generated[0], ternion::sample::argmax(&want));
    assert_eq!(got.generated.len(), 8);
    std::fs::remove_file(&p).ok();
}

/// A CPU session started after another ended reuses its buffers (the KV pool with its
/// pages, and the workspace) and gives the same logits bit for bit as one on fresh
/// buffers, also after a longer prompt left larger buffers behind; a pool of another
/// size is not reused.
#[test]
fn a_new_session_reuses_the_last_ones_buffers() {
    let p = synth_bitnet(GgmlType::I2_S, "reuse.gguf");
    let (_file, m) = model::load(&p).unwrap();
    let run = |n: usize| {
        let prompt: Vec<u32> = (0..n).map(|i| (i * 7 % 97) as u32).collect();
        let mut s = Session::new(&m, 64);
        let a = s.prefill(&prompt).unwrap().to_vec();
        let b = s.decode(5).unwrap().to_vec();
        [a, b].concat()
    };
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let fresh = bits(run(40));
    run(60);
    assert_eq!(bits(run(40)), fresh, "logits after reuse");

    let mut st = m.cpu_state(64);
    m.forward_cpu(&[1, 2, 3], Logits::Last, &mut st).unwrap();
    let pages = st.kv().pool().pages_allocated();
    assert!(pages > 0);
    m.give_back_cpu_state(&mut st);
    let next = m.cpu_state(64);
    assert!(Arc::ptr_eq(st.kv().pool(), next.kv().pool()), "pool reused");
    assert_eq!(
        (next.kv().len(), next.kv().pool().pages_allocated()),
        (0, pages)
    );
    let mut next = next;
    m.give_back_cpu_state(&mut next);
    let other = m.cpu_state(32);
    assert!(
        !Arc::ptr_eq(next.kv().pool(), other.kv().pool()),
        "other size"
    );
    std::fs::remove_file(&p).ok();
}
