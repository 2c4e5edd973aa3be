//! The browser's WebGPU `subgroups` feature, which wgpu 30 cannot ask for.
//!
//! wgpu's WebGPU backend maps its features to the browser's through a table that lacks
//! SUBGROUP (`FEATURES_MAPPING` in wgpu 30.0.1's `src/backend/webgpu.rs`; gfx-rs/wgpu
//! issue 10146, fix proposed in PR 10220), so the adapter never reports it and
//! `requestDevice` never asks for it. Chrome and Dawn ship it. So, for the moment one
//! `wgpu::Instance` is created (synchronous: no other script runs meanwhile),
//! `navigator.gpu` is replaced by a view of itself whose adapters add "subgroups" to the
//! features `requestDevice` asks for, when they offer it; the device's own feature list
//! then says whether the kernels may use subgroups ([`device_has_subgroups`]), and
//! [`directives`] puts the `enable subgroups;` that browsers require (and naga rejects)
//! in front of those kernels.
//!
//! The subgroup kernels also use the `subgroup_id` and `num_subgroups` builtins (WGSL
//! language feature `subgroup_id`), so nothing is asked for where the browser's WGSL
//! lacks it.
//!
//! The same view asks for `chromium-experimental-subgroup-matrix` (Dawn and Chrome, behind
//! their unsafe-API switches: Dawn's `allow_unsafe_apis` toggle, Chrome's
//! `--enable-unsafe-webgpu`) where the adapter offers it with the configuration
//! `ternary_sgmat.wgsl` multiplies in (16×16×32 i8 with i32 results) and subgroups of
//! exactly 32 lanes (the kernel gives each of a workgroup's 8 subgroups its own blocks);
//! [`device_has_subgroup_matrix`] then says whether the prompt tiles may use it.

use wasm_bindgen::prelude::*;

use crate::pipelines::Variant;

#[wasm_bindgen(inline_js = r#"
const view = (target, own) => new Proxy(target, {
  get(t, key) {
    if (Object.hasOwn(own, key)) return own[key];
    const v = Reflect.get(t, key);
    return typeof v === "function" ? v.bind(t) : v;
  },
});

const SGMAT = "chromium-experimental-subgroup-matrix";

// The adapter's int8 16×16×32 subgroup-matrix configuration (i32 results), on 32-lane
// subgroups: what ternary_sgmat.wgsl needs.
const sgmatFits = (a) => a.info?.subgroupMinSize === 32 && a.info?.subgroupMaxSize === 32 &&
  [...(a.info?.subgroupMatrixConfigs ?? [])].some((c) => c.componentType === "i8" &&
    c.resultComponentType === "i32" && c.M === 16 && c.N === 16 && c.K === 32);

// sgmat: ask for the subgroup matrices where they fit.
const withFeatures = (a, sgmat) => {
  if (!a || !a.features.has("subgroups")) return a;
  const extra = ["subgroups"];
  if (sgmat && a.features.has(SGMAT) && sgmatFits(a)) extra.push(SGMAT);
  return view(a, {
    requestDevice: (d = {}) =>
      a.requestDevice({ ...d, requiredFeatures: [...(d.requiredFeatures ?? []), ...extra] }),
  });
};

export function viewNavigatorGpu(sgmat) {
  const nav = globalThis.navigator;
  const gpu = nav?.gpu;
  if (!gpu || !gpu.wgslLanguageFeatures?.has("subgroup_id")) return () => {};
  const own = Object.getOwnPropertyDescriptor(nav, "gpu");
  const requestAdapter = async (o) => withFeatures(await gpu.requestAdapter(o), sgmat);
  try {
    Object.defineProperty(nav, "gpu", { value: view(gpu, { requestAdapter }), configurable: true });
  } catch (_) {
    return () => {};
  }
  return () => { own ? Object.defineProperty(nav, "gpu", own) : delete nav.gpu; };
}

export function deviceHasFeature(device, name) {
  return device.features.has(name);
}
"#)]
extern "C" {
    /// Puts the view of `navigator.gpu` in place (with `sgmat`, asking for subgroup matrices
    /// where they fit); the returned function puts it back.
    #[wasm_bindgen(js_name = viewNavigatorGpu)]
    fn view_navigator_gpu(sgmat: bool) -> js_sys::Function;

    /// True when the `GPUDevice` was created with feature `name`.
    #[wasm_bindgen(js_name = deviceHasFeature)]
    fn device_has_feature(device: &JsValue, name: &str) -> bool;
}

/// Puts in front of a kernel's WGSL what a browser needs and naga rejects: for a subgroup
/// variant, `enable subgroups;`, and the subgroup uniformity rule turned off (a browser's
/// uniformity analysis cannot see that a loop bounded by the subgroup size, read through
/// a private variable, is uniform in each subgroup; naga does not check it).
pub(crate) fn directives(code: &mut String, variant: Variant) {
    if variant.subgroups {
        code.insert_str(
            0,
            "enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n",
        );
    }
}

/// A wgpu instance over the page's WebGPU; with `subgroups`, its adapters ask for the
/// `subgroups` feature when they offer it, and with `sgmat` for subgroup matrices where
/// they fit the prompt tiles (see the module docs).
pub(crate) fn instance(
    desc: wgpu::InstanceDescriptor,
    subgroups: bool,
    sgmat: bool,
) -> wgpu::Instance {
    if !subgroups {
        return wgpu::Instance::new(desc);
    }
    let restore = view_navigator_gpu(sgmat);
    let instance = wgpu::Instance::new(desc);
    // The restore function only redefines a property that the view just defined.
    let _ = restore.call0(&JsValue::NULL);
    instance
}

/// True when the browser created `device` with the `subgroups` feature.
pub(crate) fn device_has_subgroups(device: &wgpu::Device) -> bool {
    device
        .as_webgpu()
        .is_some_and(|d| device_has_feature(d, "subgroups"))
}

/// True when the browser created `device` with subgroup matrices.
pub(crate) fn device_has_subgroup_matrix(device: &wgpu::Device) -> bool {
    device
        .as_webgpu()
        .is_some_and(|d| device_has_feature(d, "chromium-experimental-subgroup-matrix"))
}
