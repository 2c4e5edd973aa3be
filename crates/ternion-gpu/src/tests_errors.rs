//! Each GPU failure the context can provoke without a broken driver maps to its
//! [`Error`](crate::Error) variant (run on lavapipe).

use super::tests::ctx_with;
use super::*;
use crate::quant::GgmlType;
use crate::Error;

fn ctx() -> Option<GpuContext> {
    ctx_with(&GpuOptions::default())
}

#[test]
fn a_buffer_over_the_device_limit_names_the_limit() {
    let Some(ctx) = ctx() else { return };
    let max = ctx.caps().max_buffer;
    let e = ctx
        .create_buffer("huge", max + 1, wgpu::BufferUsages::STORAGE)
        .unwrap_err();
    assert!(
        matches!(&e, Error::ExceedsLimit { limit: "max_buffer_size", max: m, bytes, .. }
            if *m == max && *bytes > max),
        "{e}"
    );
    assert!(e.to_string().contains("buffer 'huge'"), "{e}");
    assert!(
        !e.is_device_fault(),
        "a refused request leaves the device usable"
    );
    ctx.check().unwrap();
}

#[test]
fn a_row_wider_than_a_binding_names_the_limit() {
    let Some(ctx) = ctx() else { return };
    let e = Sharded::zeroed(&ctx, "w", 4, 64, Some(32)).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::ExceedsLimit {
                bytes: 64,
                max: 32,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_weight_type_without_a_kernel_lists_the_supported_ones() {
    let Some(ctx) = ctx() else { return };
    let e = QWeights::upload(&ctx, "w", GgmlType::I32, &[0; 64], 16, 1, None).unwrap_err();
    let Error::Unsupported {
        found, supported, ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(found, "I32");
    assert!(supported.iter().any(|s| s == "Q8_0"), "{e}");
    assert!(!supported.iter().any(|s| s == "I32"), "{e}");
}

#[test]
fn a_destroyed_device_is_reported_lost() {
    let Some(ctx) = ctx() else { return };
    ctx.device.destroy();
    let e = ctx.wait().unwrap_err();
    assert!(
        matches!(&e, Error::DeviceLost { reason, .. } if reason == "Destroyed"),
        "{e}"
    );
    assert!(e.is_device_fault());
    assert_eq!(e.kind(), "DeviceLost");
}
