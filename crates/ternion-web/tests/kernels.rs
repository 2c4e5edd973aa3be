//! The GPU kernels in a browser (wasm-bindgen-test in headless Chromium, WebGPU on
//! SwiftShader: no shader-f16, no subgroups through wgpu), each against the CPU reference
//! on random inputs of odd sizes. The test bodies are the GPU crate's native ones
//! (`ternion-gpu/src/kernel_checks.rs`, with their tolerances), awaited here; only what is
//! particular to the browser is written in this file. Run by scripts/web-test.sh.
#![cfg(target_arch = "wasm32")]

use ternion::backend::gpu::{GpuContext, GpuOptions};
use ternion_gpu::kernel_checks;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn ctx() -> GpuContext {
    GpuContext::new_async(&GpuOptions::default())
        .await
        .expect("a WebGPU adapter (run Chromium with --enable-unsafe-webgpu)")
}

/// One browser test per shared kernel body ([`kernel_checks`]), awaiting it.
macro_rules! kernel_check {
    ($name:ident) => {
        #[wasm_bindgen_test]
        async fn $name() {
            kernel_checks::$name(&ctx().await).await.expect("gpu work");
        }
    };
}

kernel_check!(embed_matches_f16_rows);
kernel_check!(rmsnorm_f32_matches_cpu);
kernel_check!(rmsnorm_quant_matches_cpu_quantizer);
kernel_check!(ternary_matvec_matches_cpu);
kernel_check!(topk_and_argmax_match_cpu);
kernel_check!(masked_topk_matches_cpu);

#[wasm_bindgen_test]
async fn webgpu_variant_has_no_subgroups() {
    let ctx = ctx().await;
    let c = ctx.caps();
    assert_eq!(c.backend, "webgpu", "{c:?}");
    assert!(
        !c.subgroups,
        "wgpu's WebGPU backend exposes no subgroups: {c:?}"
    );
    let v = ctx.variant(32);
    assert!(!v.subgroups && v.f16 == c.f16, "{v:?} for {c:?}");
}
