//! The device's measured read bandwidth: the yardstick `ternion bench` compares a decode
//! step's achieved GB/s against (`kernels/read_bw.wgsl`).

use std::time::Instant;

use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::ops::Dispatch;
use super::pipelines::{Kernel, PipelineKey, Variant};
use crate::Result;

/// Workgroups of the probe: enough to fill any current GPU.
const GROUPS: u32 = 4096;
/// Probe passes timed together.
const REPEATS: u32 = 20;

/// Reads a buffer as large as one binding allows (at most 1 GiB) `REPEATS` times in one
/// submit, after one untimed warm-up submit, and returns bytes read per second in GB/s.
/// Allocates its buffers on every call: for benchmarks, not the decode path.
pub fn measure_read_bandwidth(ctx: &GpuContext) -> Result<f64> {
    let caps = ctx.caps();
    let bytes = caps
        .max_binding
        .min(caps.max_buffer)
        .min(1 << 30)
        .next_multiple_of(16)
        - 16;
    let src = GpuBuffer::zeroed(ctx, "read_bw.src", bytes)?;
    let sink = GpuBuffer::zeroed(ctx, "read_bw.sink", u64::from(GROUPS) * 256 * 4)?;
    let key = PipelineKey {
        kernel: Kernel::ReadProbe,
        variant: Variant::default(),
    };
    let d = Dispatch::new(
        ctx,
        key,
        "read_bw",
        &[(0, src.binding()), (1, sink.binding())],
        GROUPS,
    )?;
    let run = |repeats: u32| -> Result<f64> {
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for _ in 0..repeats {
                d.record(&mut pass, 1);
            }
        }
        let t = Instant::now();
        ctx.submit(enc);
        ctx.wait()?;
        Ok(t.elapsed().as_secs_f64())
    };
    run(REPEATS)?;
    let secs = run(REPEATS)?;
    Ok(bytes as f64 * f64::from(REPEATS) / secs / 1e9)
}
