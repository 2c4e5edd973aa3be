//! Workgroup memory per entry point, read from a kernel's WGSL with naga. wgpu 30 leaves
//! the device's `max_compute_workgroup_storage_size` to the driver, and an NVIDIA driver
//! given a kernel 4 bytes over its 48 KiB hung instead of failing (BENCHMARKS.md, session
//! 19): the pipeline cache checks each entry point against the limit with these figures,
//! and the tests check the sizes the host assumes when it picks a kernel.

use std::collections::HashMap;

/// Bytes of workgroup memory each entry point of the WGSL `code` uses: the workgroup
/// variables it reads or writes, each placed at its type's alignment. Empty when naga
/// cannot parse or validate `code` (wgpu then reports why). Native builds only: a browser's
/// WebGPU checks the limit itself.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn entry_bytes(code: &str) -> HashMap<String, u32> {
    let Ok(module) = naga::front::wgsl::parse_str(code) else {
        return HashMap::new();
    };
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::empty(),
        naga::valid::Capabilities::all(),
    );
    let Ok(info) = validator.validate(&module) else {
        return HashMap::new();
    };
    let mut layouter = naga::proc::Layouter::default();
    if layouter.update(module.to_ctx()).is_err() {
        return HashMap::new();
    }
    module
        .entry_points
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            let uses = info.get_entry_point(i);
            let bytes = module
                .global_variables
                .iter()
                .filter(|(h, v)| v.space == naga::AddressSpace::WorkGroup && !uses[*h].is_empty())
                .fold(0u32, |end, (_, v)| {
                    let layout = layouter[v.ty];
                    layout.alignment.round_up(end) + layout.size
                });
            (ep.name.clone(), bytes)
        })
        .collect()
}

/// Why entry point `entry` cannot run on a device (named `device`) that allows `limit`
/// bytes of workgroup memory, or None when it fits (or its use is unknown).
pub(crate) fn overflow(
    usage: &HashMap<String, u32>,
    entry: &str,
    limit: u32,
    device: &str,
) -> Option<String> {
    let bytes = *usage.get(entry)?;
    (bytes > limit).then(|| {
        format!(
            "entry point {entry} uses {bytes} bytes of workgroup memory; {device} allows {limit} \
             (max_compute_workgroup_storage_size)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{entry_bytes, overflow};
    use crate::context::COOP_WORKGROUP_BYTES;
    use crate::ops::{
        MatmulKind, ATTN_PROMPT_BYTES, ATTN_PROMPT_COOP_BYTES, ATTN_PROMPT_F32_BYTES,
    };
    use crate::pipelines::{workgroup_bytes, Epilogue, GluAct, Kernel, Variant};

    /// The workgroup memory the browser host checks for the subgroup-matrix tiles is what
    /// `ternary_sgmat.wgsl` declares (naga cannot read that file: it is counted from the
    /// text, every `var<workgroup>` an array of i32, `array<i32, N>` or nested,
    /// `array<array<i32, N>, B>`).
    #[test]
    fn sgmat_figure_matches_the_kernel() {
        let bytes: u32 = include_str!("kernels/ternary_sgmat.wgsl")
            .lines()
            .filter_map(|l| l.strip_prefix("var<workgroup> "))
            .map(|l| {
                let ty = l.split_once(": ").expect("a typed variable").1;
                assert!(ty.contains("array<i32, "), "an i32 array: {l}");
                4 * ty
                    .split(", ")
                    .skip(1)
                    .map(|n| {
                        n.trim_end_matches([';', '>'])
                            .parse::<u32>()
                            .expect("a number")
                    })
                    .product::<u32>()
            })
            .sum();
        assert_eq!(bytes, crate::context::SGMAT_WORKGROUP_BYTES);
    }

    /// The host dispatches `ternary_sgmat.wgsl` in the tiles it declares (`TM`, `TN`).
    #[test]
    fn sgmat_tiles_match_the_kernel() {
        let text = include_str!("kernels/ternary_sgmat.wgsl");
        let constant = |name: &str| -> u32 {
            let line = format!("const {name}: u32 = ");
            let rest = text.lines().find_map(|l| l.strip_prefix(line.as_str()));
            rest.and_then(|r| r.strip_suffix("u;"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no `{line}…u;` in ternary_sgmat.wgsl"))
        };
        assert_eq!(constant("TM"), MatmulKind::SubgroupMatrix.tile_rows());
        assert_eq!(constant("TN"), MatmulKind::SubgroupMatrix.tile_tokens());
    }

    /// The workgroup memory the host assumes when it picks the prompt tiles and the prompt
    /// attention (`coop_usable`, `ops::paged`) is what those kernels use: a kernel that grew
    /// past its figure would reach devices that cannot run it, and a figure above the
    /// kernel's would turn away devices that can.
    #[test]
    fn host_figures_match_the_kernels() {
        let coop = Variant {
            f16: true,
            subgroups: true,
            kv_f32: false,
        };
        let tiles = [
            Kernel::TernaryMatmul {
                kind: MatmulKind::Coop,
                epilogue: Epilogue::Store,
                wide: false,
            },
            Kernel::TernaryMatmul {
                kind: MatmulKind::Coop,
                epilogue: Epilogue::Add,
                wide: true,
            },
            Kernel::TernaryCoop3,
            Kernel::TernaryCoopGlu { act: GluAct::Silu },
            Kernel::TernaryCoopSplit {
                sms: 132,
                epilogue: Epilogue::Add,
                sum: false,
            },
        ];
        for k in tiles {
            assert_eq!(
                workgroup_bytes(k, coop, false),
                COOP_WORKGROUP_BYTES,
                "{k:?}"
            );
        }
        for head_dim in [64, 128] {
            let attn = |coop_pv| Kernel::AttentionPrompt {
                coop: coop_pv,
                head_dim,
            };
            let plain = Variant { f16: false, ..coop };
            assert_eq!(
                workgroup_bytes(attn(false), plain, false),
                ATTN_PROMPT_BYTES
            );
            assert_eq!(workgroup_bytes(attn(false), coop, false), ATTN_PROMPT_BYTES);
            assert_eq!(
                workgroup_bytes(attn(false), plain, true),
                ATTN_PROMPT_F32_BYTES
            );
            assert_eq!(
                workgroup_bytes(attn(true), coop, true),
                ATTN_PROMPT_COOP_BYTES
            );
        }
    }

    /// Each entry point counts the workgroup variables it uses, aligned, and no others.
    #[test]
    fn counts_the_variables_each_entry_uses() {
        let code = "
            var<workgroup> a: array<f32, 100>;
            var<workgroup> b: vec4<f32>;
            var<workgroup> c: array<u32, 3>;
            @compute @workgroup_size(64) fn one() { a[0] = 1.0; b.x = 2.0; }
            @compute @workgroup_size(64) fn two() { c[1] = 3u; }
            @compute @workgroup_size(64) fn none() {}
        ";
        let got = entry_bytes(code);
        assert_eq!(got["one"], 400 + 16);
        assert_eq!(got["two"], 12);
        assert_eq!(got["none"], 0);
        assert!(entry_bytes("fn broken( {").is_empty());
        assert_eq!(overflow(&got, "one", 416, "gpu"), None);
        assert_eq!(
            overflow(&got, "one", 415, "gpu").as_deref(),
            Some(
                "entry point one uses 416 bytes of workgroup memory; gpu allows 415 \
                 (max_compute_workgroup_storage_size)"
            )
        );
        assert_eq!(overflow(&got, "missing", 0, "gpu"), None);
    }
}
