//! Counters and gauges shared by the HTTP side and the engine thread, rendered in the
//! Prometheus text exposition format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the time-to-first-token histogram buckets.
pub const TTFT_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Server-wide metrics. Every field is a relaxed atomic: readers may see a slightly stale
/// but never torn value.
#[derive(Debug, Default)]
pub struct Metrics {
    /// The model is loaded and the engine accepts work.
    pub model_loaded: AtomicBool,
    /// Requests waiting in the queue.
    pub queue_length: AtomicU64,
    /// Sequences being generated (each holds a KV cache).
    pub active_sequences: AtomicU64,
    /// Configured bound on active sequences.
    pub max_active_sequences: AtomicU64,
    /// Requests accepted into the queue.
    pub requests_total: AtomicU64,
    /// Requests refused because the queue was full.
    pub rejected_queue_full_total: AtomicU64,
    /// Sequences that finished normally (stop or length).
    pub finished_total: AtomicU64,
    /// Sequences cancelled (client gone, or shutdown).
    pub cancelled_total: AtomicU64,
    /// Sequences that ended with an engine error.
    pub failed_total: AtomicU64,
    /// Prompt tokens evaluated.
    pub prompt_tokens_total: AtomicU64,
    /// Tokens generated.
    pub generated_tokens_total: AtomicU64,
    /// Engine iterations (one forward batch each).
    pub engine_steps_total: AtomicU64,
    /// Forward passes run (one per iteration when batching, one per sequence otherwise).
    pub forward_passes_total: AtomicU64,
    /// KV-cache pages held by sequences.
    pub kv_pages_in_use: AtomicU64,
    /// KV-cache pages in the shared pool.
    pub kv_pages_capacity: AtomicU64,
    /// Bytes of one KV-cache page.
    pub kv_page_bytes: AtomicU64,
    /// Recent generation rate over all sequences (f64 bits).
    tokens_per_second_bits: AtomicU64,
    ttft_buckets: [AtomicU64; TTFT_BUCKETS.len()],
    ttft_count: AtomicU64,
    ttft_sum_micros: AtomicU64,
}

impl Metrics {
    /// Records one time-to-first-token observation.
    pub fn observe_ttft(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (b, &le) in self.ttft_buckets.iter().zip(TTFT_BUCKETS.iter()) {
            if s <= le {
                b.fetch_add(1, Relaxed);
            }
        }
        self.ttft_count.fetch_add(1, Relaxed);
        self.ttft_sum_micros
            .fetch_add(d.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Sets the recent generation rate.
    pub fn set_tokens_per_second(&self, v: f64) {
        self.tokens_per_second_bits.store(v.to_bits(), Relaxed);
    }

    /// The recent generation rate.
    pub fn tokens_per_second(&self) -> f64 {
        f64::from_bits(self.tokens_per_second_bits.load(Relaxed))
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let g = |a: &AtomicU64| a.load(Relaxed).to_string();
        one(
            "ternion_model_loaded",
            "gauge",
            "1 when the model is loaded and requests are served.",
            u8::from(self.model_loaded.load(Relaxed)).to_string(),
        );
        one(
            "ternion_queue_length",
            "gauge",
            "Requests waiting for a free sequence slot.",
            g(&self.queue_length),
        );
        one(
            "ternion_active_sequences",
            "gauge",
            "Sequences being generated, each holding a KV cache.",
            g(&self.active_sequences),
        );
        one(
            "ternion_max_active_sequences",
            "gauge",
            "Most sequences generated at once.",
            g(&self.max_active_sequences),
        );
        one(
            "ternion_requests_total",
            "counter",
            "Generation requests accepted into the queue.",
            g(&self.requests_total),
        );
        one(
            "ternion_requests_rejected_queue_full_total",
            "counter",
            "Generation requests refused with 429 because the queue was full.",
            g(&self.rejected_queue_full_total),
        );
        one(
            "ternion_sequences_finished_total",
            "counter",
            "Sequences that ended on a stop condition or a length limit.",
            g(&self.finished_total),
        );
        one(
            "ternion_sequences_cancelled_total",
            "counter",
            "Sequences cancelled because the client went away or the server shut down.",
            g(&self.cancelled_total),
        );
        one(
            "ternion_sequences_failed_total",
            "counter",
            "Sequences that ended with an engine error.",
            g(&self.failed_total),
        );
        one(
            "ternion_prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated.",
            g(&self.prompt_tokens_total),
        );
        one(
            "ternion_generated_tokens_total",
            "counter",
            "Tokens generated.",
            g(&self.generated_tokens_total),
        );
        one(
            "ternion_engine_steps_total",
            "counter",
            "Engine iterations (one forward batch each).",
            g(&self.engine_steps_total),
        );
        one(
            "ternion_forward_passes_total",
            "counter",
            "Forward passes run; with batching, one pass steps every active sequence.",
            g(&self.forward_passes_total),
        );
        one(
            "ternion_kv_pages_in_use",
            "gauge",
            "KV-cache pages held by active sequences.",
            g(&self.kv_pages_in_use),
        );
        one(
            "ternion_kv_pages_capacity",
            "gauge",
            "KV-cache pages in the pool shared by all sequences.",
            g(&self.kv_pages_capacity),
        );
        one(
            "ternion_kv_page_bytes",
            "gauge",
            "Bytes of one KV-cache page.",
            g(&self.kv_page_bytes),
        );
        one(
            "ternion_tokens_per_second",
            "gauge",
            "Generated tokens per second over all sequences, recent window.",
            format!("{:.3}", self.tokens_per_second()),
        );
        let name = "ternion_time_to_first_token_seconds";
        let _ = writeln!(
            o,
            "# HELP {name} Time from request arrival to the first generated token.\n\
             # TYPE {name} histogram"
        );
        for (b, le) in self.ttft_buckets.iter().zip(TTFT_BUCKETS.iter()) {
            let _ = writeln!(o, "{name}_bucket{{le=\"{le}\"}} {}", b.load(Relaxed));
        }
        let count = self.ttft_count.load(Relaxed);
        let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.ttft_sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(o, "{name}_sum {sum:.6}\n{name}_count {count}");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_ttft(Duration::from_millis(20));
        m.observe_ttft(Duration::from_secs(2));
        let text = m.render();
        assert!(text.contains("ternion_time_to_first_token_seconds_bucket{le=\"0.01\"} 0"));
        assert!(text.contains("ternion_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
        assert!(text.contains("ternion_time_to_first_token_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("ternion_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("ternion_time_to_first_token_seconds_count 2"));
        assert!(text.contains("ternion_time_to_first_token_seconds_sum 2.020000"));
    }
}
