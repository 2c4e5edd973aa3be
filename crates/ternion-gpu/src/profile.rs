//! Per-launch GPU timings (`GpuModelOptions::profile`): a timestamp after every launch group
//! of a step, summed per label.

use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::exec::GpuModel;
use super::plan::Plan;
use crate::{Error, Result};

/// Time spent in one kind of launch over the profiled steps.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// Launch label (`ternary`, `rmsnorm`, `attention`, ...).
    pub label: &'static str,
    /// Launches timed.
    pub count: u64,
    /// Total GPU time in nanoseconds.
    pub total_ns: f64,
}

/// Timestamp queries of the profiled steps.
pub(super) struct Profiler {
    /// One timestamp after each launch group (and one before the first).
    pub(super) queries: wgpu::QuerySet,
    resolve: GpuBuffer,
    staging: GpuBuffer,
    n: u32,
    period_ns: f64,
    totals: Vec<KernelTime>,
    /// Tokens of the step last recorded: the launch groups that dispatch nothing for it
    /// (a batch launch in a decode step) are not counted.
    pub(super) last_tokens: u32,
}

impl Profiler {
    /// Timestamp queries for every launch group of `plan`; an error when the adapter cannot
    /// time inside compute passes.
    pub(super) fn new(ctx: &GpuContext, plan: &Plan) -> Result<Profiler> {
        if !ctx
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
        {
            return Err(Error::UnsupportedFeature {
                what: format!("profiling on {}", ctx.caps().name),
                needs: "timestamp queries inside compute passes, which this adapter does not \
                        offer"
                    .into(),
            });
        }
        let n = plan.len() as u32 + 1;
        let queries = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: n,
        });
        let bytes = u64::from(n) * 8;
        let resolve = GpuBuffer::with_usage(
            ctx,
            "profile.resolve",
            bytes,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let staging = GpuBuffer::with_usage(
            ctx,
            "profile.staging",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let totals = (0..plan.len())
            .map(|i| KernelTime {
                label: plan.label(i),
                count: 0,
                total_ns: 0.0,
            })
            .collect();
        Ok(Profiler {
            queries,
            resolve,
            staging,
            n,
            period_ns: f64::from(ctx.queue.get_timestamp_period()),
            totals,
            last_tokens: 0,
        })
    }

    /// Copies the step's timestamps to the staging buffer (after the pass).
    pub(super) fn record_resolve(&self, enc: &mut wgpu::CommandEncoder) {
        enc.resolve_query_set(&self.queries, 0..self.n, &self.resolve.buf, 0);
        let bytes = u64::from(self.n) * 8;
        enc.copy_buffer_to_buffer(&self.resolve.buf, 0, &self.staging.buf, 0, bytes);
    }
}

impl GpuModel {
    /// GPU time per kind of launch, summed over the steps run since load (`None` unless built
    /// with [`GpuModelOptions::profile`]).
    pub fn profile(&self) -> Option<Vec<KernelTime>> {
        let p = self.profiler.as_ref()?;
        let mut by_label: Vec<KernelTime> = Vec::new();
        for t in &p.totals {
            match by_label.iter_mut().find(|k| k.label == t.label) {
                Some(k) => {
                    k.count += t.count;
                    k.total_ns += t.total_ns;
                }
                None => by_label.push(t.clone()),
            }
        }
        Some(by_label)
    }

    /// Clears the profile totals (e.g. after warm-up and prefill, to time decode alone).
    pub fn reset_profile(&mut self) {
        if let Some(p) = &mut self.profiler {
            for t in &mut p.totals {
                t.count = 0;
                t.total_ns = 0.0;
            }
        }
    }

    /// Adds the last step's timestamps to the profile.
    pub(super) async fn collect_profile(&mut self) -> Result<()> {
        if let Some(p) = &mut self.profiler {
            let bytes = self
                .ctx
                .map_read(&p.staging.buf, u64::from(p.n) * 8)
                .await?;
            let ticks: &[u64] = bytemuck::cast_slice(&bytes);
            for (i, w) in ticks.windows(2).enumerate() {
                // Two timestamps with nothing between them: not a launch.
                if self.plan.dispatches_of(i, p.last_tokens) == 0 {
                    continue;
                }
                let t = &mut p.totals[i];
                t.count += 1;
                t.total_ns += w[1].saturating_sub(w[0]) as f64 * p.period_ns;
            }
        }
        Ok(())
    }
}
