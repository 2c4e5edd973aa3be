//! The GPU kernels in a browser (wasm-bindgen-test in headless Chromium, WebGPU on
//! SwiftShader: no shader-f16; subgroups, which wgpu alone cannot ask for), each against
//! the CPU reference on random inputs of odd sizes, with the subgroup variants and
//! without. The test bodies are the GPU crate's native ones
//! (`ternion-gpu/src/kernel_checks.rs`, with their tolerances), awaited here; only what is
//! particular to the browser is written in this file. Run by scripts/web-test.sh.
#![cfg(target_arch = "wasm32")]

use js_sys::{Function, Object, Promise, Reflect};
use ternion::backend::gpu::{GpuContext, GpuOptions};
use ternion_gpu::kernel_checks;
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn ctx(subgroups: bool) -> GpuContext {
    let opts = GpuOptions {
        disable_subgroups: !subgroups,
        ..GpuOptions::default()
    };
    GpuContext::new_async(&opts)
        .await
        .expect("a WebGPU adapter (run Chromium with --enable-unsafe-webgpu)")
}

/// One browser test per shared kernel body ([`kernel_checks`]), awaiting it with the
/// subgroup variants (where the browser has them) and without.
macro_rules! kernel_check {
    ($name:ident) => {
        #[wasm_bindgen_test]
        async fn $name() {
            for subgroups in [true, false] {
                kernel_checks::$name(&ctx(subgroups).await)
                    .await
                    .expect("gpu work");
            }
        }
    };
}

ternion_gpu::each_kernel_check!(kernel_check);

fn get(obj: &JsValue, key: &str) -> JsValue {
    Reflect::get(obj, &key.into()).expect(key)
}

/// `set.has(name)` of a JavaScript set-like object.
fn has(set: &JsValue, name: &str) -> bool {
    let f: Function = get(set, "has").into();
    f.call1(set, &name.into()).expect("has").is_truthy()
}

/// The page's `navigator.gpu`.
fn navigator_gpu() -> JsValue {
    get(&get(&js_sys::global(), "navigator"), "gpu")
}

#[wasm_bindgen_test]
async fn subgroups_are_asked_for_when_the_browser_offers_them() {
    let gpu = navigator_gpu();
    let request: Function = get(&gpu, "requestAdapter").into();
    let adapter = JsFuture::from(Promise::from(request.call0(&gpu).expect("requestAdapter")))
        .await
        .expect("an adapter");
    let offered = has(&get(&adapter, "features"), "subgroups")
        && has(&get(&gpu, "wgslLanguageFeatures"), "subgroup_id");

    let on = ctx(true).await;
    let c = on.caps();
    assert_eq!(c.backend, "webgpu", "{c:?}");
    assert_eq!(c.subgroups, offered, "{c:?}");
    let v = on.variant(1);
    assert!(v.subgroups == offered && v.f16 == c.f16, "{v:?} for {c:?}");
    // The view wgpu was created with is gone again.
    assert!(Object::is(&navigator_gpu(), &gpu));

    let off = ctx(false).await;
    assert!(!off.caps().subgroups, "{:?}", off.caps());
    assert!(!off.variant(1).subgroups);
}
