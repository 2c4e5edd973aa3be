//! The device's measured floors, the yardsticks `ternion bench` compares a decode step
//! against: read bandwidth (`kernels/read_bw.wgsl` over a large buffer) and the cost of one
//! dependent launch (the same kernel over a tiny buffer, launched many times in a row, with
//! 132 workgroups or as many as asked).

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
    time_probe(ctx, bytes, GROUPS, REPEATS)
        .map(|secs| bytes as f64 * f64::from(REPEATS) / secs / 1e9)
}

/// Launches in the dispatch-latency probe.
const LAUNCHES: u32 = 1000;

/// The time of one dependent launch, in µs: the probe kernel over a 64 KiB buffer launched
/// [`LAUNCHES`] times in one compute pass (each launch writes the buffer the next one binds
/// read-write, so the driver orders them as it orders a decode step's launches), minus one
/// launch alone, divided by the launches added. Allocates its buffers on every call.
pub fn measure_dispatch_latency(ctx: &GpuContext) -> Result<f64> {
    dispatch_latency_with(ctx, 132, &[Variant::default()])
}

/// [`measure_dispatch_latency`] with `groups` workgroups a launch (a prompt step's
/// per-token launches run one workgroup a token), the probe's pipelines for `variants`
/// taking turns (two: a pipeline switch at every launch, as in a prompt step).
pub(crate) fn dispatch_latency_with(
    ctx: &GpuContext,
    groups: u32,
    variants: &[Variant],
) -> Result<f64> {
    let (src, sink) = probe_buffers(ctx, 64 << 10, groups)?;
    let probes = variants
        .iter()
        .map(|&v| probe(ctx, (&src, &sink), groups, v))
        .collect::<Result<Vec<_>>>()?;
    let many = time_launches(ctx, &probes, LAUNCHES)?;
    let one = time_launches(ctx, &probes, 1)?;
    Ok((many - one).max(0.0) / f64::from(LAUNCHES - 1) * 1e6)
}

/// Seconds for `repeats` launches of the read probe over a buffer of `bytes` with `groups`
/// workgroups, in one submit, after one untimed warm-up submit.
fn time_probe(ctx: &GpuContext, bytes: u64, groups: u32, repeats: u32) -> Result<f64> {
    let (src, sink) = probe_buffers(ctx, bytes, groups)?;
    let d = probe(ctx, (&src, &sink), groups, Variant::default())?;
    time_launches(ctx, &[d], repeats)
}

/// The probe's source of `bytes` and its sink for `groups` workgroups.
fn probe_buffers(ctx: &GpuContext, bytes: u64, groups: u32) -> Result<(GpuBuffer, GpuBuffer)> {
    let src = GpuBuffer::zeroed(ctx, "read_bw.src", bytes)?;
    let sink = GpuBuffer::zeroed(ctx, "read_bw.sink", u64::from(groups) * 256 * 4)?;
    Ok((src, sink))
}

/// The read probe's launch over `src` into `sink` with `groups` workgroups, from the
/// pipeline of `variant`.
fn probe(
    ctx: &GpuContext,
    (src, sink): (&GpuBuffer, &GpuBuffer),
    groups: u32,
    variant: Variant,
) -> Result<Dispatch> {
    let key = PipelineKey {
        kernel: Kernel::ReadProbe,
        variant,
    };
    let bindings = [(0, src.binding()), (1, sink.binding())];
    Dispatch::new(ctx, key, "read_bw", &bindings, groups)
}

/// Seconds for `repeats` launches, `launches` taking turns, in one submit, after one
/// untimed warm-up submit.
fn time_launches(ctx: &GpuContext, launches: &[Dispatch], repeats: u32) -> Result<f64> {
    let run = || -> Result<f64> {
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for i in 0..repeats as usize {
                launches[i % launches.len()].record(&mut pass, 1);
            }
        }
        let t = Instant::now();
        ctx.submit(enc);
        ctx.wait()?;
        Ok(t.elapsed().as_secs_f64())
    };
    run()?;
    run()
}
