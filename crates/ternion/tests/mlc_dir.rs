//! An MLC `q4f16_1` directory loads into the same model as the GGUF written beside it:
//! bit-equal logits on the CPU and on the GPU, and the Phi-3 tokenizer's vectors through
//! the converted vocabulary.

use std::sync::Arc;

use ternion::gguf::GgufFile;
use ternion::mlc::load_dir;
use ternion::model::{LoadOptions, Logits, Model};
use ternion::quant::GgmlType;
use ternion::tokenizer::{Tokenizer, TokenizerOptions};
use ternion_testkit::mlc_synth::{fixture, phi3_vocab};
use ternion_testkit::shared::vectors;

fn model(file: GgufFile) -> Model {
    Model::from_file(Arc::new(file), &LoadOptions::default()).unwrap()
}

const PROMPT: [u32; 7] = [1, 450, 4996, 17354, 1701, 32010, 13];

#[test]
fn loaded_directory_equals_the_gguf_on_cpu() {
    let (mlc, gguf) = fixture("cpu", true);
    let file = load_dir(&mlc).unwrap();
    for (name, ty) in [
        ("token_embd.weight", GgmlType::Q4_0),
        ("blk.0.ffn_down.weight", GgmlType::Q8_0),
        ("blk.1.ffn_down.weight", GgmlType::Q4_0),
        ("blk.1.attn_qkv.weight", GgmlType::Q4_0),
        ("output.weight", GgmlType::Q4_0),
        ("output_norm.weight", GgmlType::F32),
    ] {
        assert_eq!(file.tensor(name).map(|t| t.ty), Some(ty), "{name}");
    }
    let reference = GgufFile::open(&gguf).unwrap();
    for t in &reference.tensors {
        let got = file
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!((got.ty, &got.shape), (t.ty, &t.shape), "{}", t.name);
        assert!(
            file.tensor_data(got) == reference.tensor_data(t),
            "{}: bytes differ",
            t.name
        );
    }
    let (a, b) = (model(file), model(reference));
    let cfg = a.config();
    assert_eq!(
        (cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.n_ff),
        (64, 2, 4, 2, 96)
    );
    assert_eq!(
        (cfg.n_vocab, cfg.n_rot, cfg.sliding_window),
        (32064, 16, Some(2047))
    );
    let (mut sa, mut sb) = (a.cpu_state(32), b.cpu_state(32));
    let la = a
        .forward_cpu(&PROMPT, Logits::All, &mut sa)
        .unwrap()
        .to_vec();
    let lb = b
        .forward_cpu(&PROMPT, Logits::All, &mut sb)
        .unwrap()
        .to_vec();
    assert_eq!(la.len(), PROMPT.len() * 32064);
    assert!(la.iter().all(|v| v.is_finite()));
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()));
    // A decode step after the prompt too.
    let da = a
        .forward_cpu(&[29871], Logits::Last, &mut sa)
        .unwrap()
        .to_vec();
    let db = b
        .forward_cpu(&[29871], Logits::Last, &mut sb)
        .unwrap()
        .to_vec();
    assert!(da.iter().zip(&db).all(|(x, y)| x.to_bits() == y.to_bits()));
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
}

#[cfg(feature = "gpu")]
#[test]
fn loaded_directory_equals_the_gguf_on_gpu() {
    use ternion::backend::gpu::{GpuContext, GpuModel, GpuModelOptions, GpuOptions};
    let ctx = match GpuContext::new(&GpuOptions::default()) {
        Ok(c) => Arc::new(c),
        Err(e) if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping GPU test: {e}");
            return;
        }
        Err(e) => panic!("no usable GPU adapter: {e} (TERNION_SKIP_GPU_TESTS=1 skips)"),
    };
    let (mlc, gguf) = fixture("gpu", false);
    let (a, b) = (
        model(load_dir(&mlc).unwrap()),
        model(GgufFile::open(&gguf).unwrap()),
    );
    let opts = || GpuModelOptions {
        n_ctx: 32,
        max_batch: 16,
        ..GpuModelOptions::default()
    };
    let mut ga = GpuModel::from_model(ctx.clone(), &a, opts()).unwrap();
    let mut gb = GpuModel::from_model(ctx, &b, opts()).unwrap();
    let la = ga.forward(&PROMPT, Logits::All).unwrap();
    let lb = gb.forward(&PROMPT, Logits::All).unwrap();
    assert_eq!(la.len(), PROMPT.len() * 32064);
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()));
    // The GPU run of the MLC model is also close to its CPU run.
    let mut st = a.cpu_state(32);
    let lc = a.forward_cpu(&PROMPT, Logits::All, &mut st).unwrap();
    let max_err = la
        .iter()
        .zip(lc)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    println!("GPU vs CPU max |Δlogit| = {max_err:e}");
    assert!(max_err < 5e-2, "GPU vs CPU max |Δlogit| = {max_err}");
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
}

#[test]
fn tokenizer_reproduces_the_phi3_vocabulary_and_vectors() {
    let (mlc, _) = fixture("tok", false);
    let file = load_dir(&mlc).unwrap();
    let source = GgufFile::open(phi3_vocab()).unwrap();
    assert_eq!(
        file.get_str_array("tokenizer.ggml.tokens").unwrap(),
        source.get_str_array("tokenizer.ggml.tokens").unwrap()
    );
    assert_eq!(
        file.get_f32_array("tokenizer.ggml.scores").unwrap(),
        source.get_f32_array("tokenizer.ggml.scores").unwrap()
    );
    assert_eq!(
        file.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        source.get_i32_array("tokenizer.ggml.token_type").unwrap()
    );
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.chat_template",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
    ] {
        assert_eq!(
            file.get(key).map(|v| v.summary()),
            source.get(key).map(|v| v.summary()),
            "{key}"
        );
    }
    let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default()).unwrap();
    let cases = vectors("phi-3");
    let failed: Vec<String> = cases
        .iter()
        .filter_map(|(text, want)| {
            let got = tok.encode(text, false, false).unwrap();
            (&got != want).then(|| format!("{text:?}: want {want:?}, got {got:?}"))
        })
        .collect();
    println!(
        "phi-3 through MLC: {}/{} vectors pass",
        cases.len() - failed.len(),
        cases.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
}
