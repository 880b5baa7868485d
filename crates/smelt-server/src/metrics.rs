//! Counters, gauges and histograms behind `GET /metrics`, written in Prometheus' text format
//! (version 0.0.4). The format is a few lines of text, so it is written here rather than
//! pulling in a metrics framework; every number is an atomic or a short critical section.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (seconds) of the inter-token latency buckets.
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A Prometheus histogram: cumulative counts are computed when written.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramData>,
}

#[derive(Debug, Default, Clone)]
struct HistogramData {
    /// Per bucket (not cumulative), plus one for +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            inner: Mutex::new(HistogramData {
                counts: vec![0; bounds.len() + 1],
                ..HistogramData::default()
            }),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        let mut d = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        d.counts[i] += 1;
        d.sum += seconds;
        d.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).count
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let d = self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cum = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += d.counts[i];
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        cum += d.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", d.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", d.count);
    }
}

/// One model's numbers; its scheduler writes them, `/metrics` reads them.
#[derive(Debug)]
pub struct ModelStats {
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Requests waiting for a place in the running batch (preempted ones included).
    pub queue_depth: AtomicU64,
    pub running: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_free: AtomicU64,
    /// Sequences pushed back to the queue because the KV cache was full.
    pub preemptions: AtomicU64,
    /// Forward steps run.
    pub steps: AtomicU64,
    /// Grammar token masks computed (one per constrained token), and the time they took.
    pub grammar_masks: AtomicU64,
    pub grammar_mask_us: AtomicU64,
    /// Prompt tokens looked up in the prefix cache (whole blocks before the last token),
    /// and those found there.
    pub prefix_query_tokens: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    /// 1 when the model caches prompt prefixes, 0 when it does not (turned off, or a model
    /// with recurrent layers, which cannot).
    pub prefix_cache_enabled: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub time: StepTime,
}

/// Where the scheduler's time goes while it has work: in the engine's forward, and in its
/// whole loop (taking requests, planning the step, the forward, sending tokens out). Their
/// difference is the host work between forwards, during which a GPU waits.
#[derive(Debug, Default)]
pub struct StepTime {
    pub forward_us: AtomicU64,
    pub busy_us: AtomicU64,
}

impl Default for ModelStats {
    fn default() -> Self {
        ModelStats {
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            running: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_blocks_free: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            grammar_masks: AtomicU64::new(0),
            grammar_mask_us: AtomicU64::new(0),
            prefix_query_tokens: AtomicU64::new(0),
            prefix_hit_tokens: AtomicU64::new(0),
            prefix_cache_enabled: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            time: StepTime::default(),
        }
    }
}

/// A metric family read from a model's stats: name, help text, accessor.
type Family<T> = (&'static str, &'static str, fn(&ModelStats) -> &T);

/// Server-wide numbers.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Responses by HTTP status.
    requests: Mutex<BTreeMap<u16, u64>>,
}

impl ServerStats {
    pub fn count_response(&self, status: u16) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    /// The whole exposition: server counters, then one labelled series per model.
    pub fn render(&self, models: &[(String, std::sync::Arc<ModelStats>)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP smelt_requests_total HTTP responses by status code.\n");
        out.push_str("# TYPE smelt_requests_total counter\n");
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (status, n) in &requests {
            let _ = writeln!(out, "smelt_requests_total{{status=\"{status}\"}} {n}");
        }
        let counters: [Family<AtomicU64>; 10] = [
            (
                "smelt_prompt_tokens_total",
                "Prompt tokens of accepted requests.",
                |s| &s.prompt_tokens,
            ),
            ("smelt_generated_tokens_total", "Tokens generated.", |s| {
                &s.generated_tokens
            }),
            (
                "smelt_preemptions_total",
                "Sequences sent back to the queue because the KV cache was full.",
                |s| &s.preemptions,
            ),
            ("smelt_steps_total", "Batched forward steps run.", |s| {
                &s.steps
            }),
            (
                "smelt_grammar_masks_total",
                "Token masks computed for constrained decoding (one per constrained token).",
                |s| &s.grammar_masks,
            ),
            (
                "smelt_grammar_mask_microseconds_total",
                "Time spent computing and applying those masks, in microseconds.",
                |s| &s.grammar_mask_us,
            ),
            (
                "smelt_forward_microseconds_total",
                "Time in the engine's forward steps, in microseconds.",
                |s| &s.time.forward_us,
            ),
            (
                "smelt_scheduler_busy_microseconds_total",
                "Time the scheduler worked (its forwards and the host work between them), in microseconds.",
                |s| &s.time.busy_us,
            ),
            (
                "smelt_prefix_cache_query_tokens_total",
                "Prompt tokens looked up in the prefix cache (its hit rate: hits over these).",
                |s| &s.prefix_query_tokens,
            ),
            (
                "smelt_prefix_cache_hit_tokens_total",
                "Prompt tokens found in the prefix cache (their KV blocks reused, not computed).",
                |s| &s.prefix_hit_tokens,
            ),
        ];
        let gauges: [Family<AtomicU64>; 5] = [
            (
                "smelt_queue_depth",
                "Requests waiting for a place in the batch.",
                |s| &s.queue_depth,
            ),
            (
                "smelt_running_sequences",
                "Sequences in the running batch.",
                |s| &s.running,
            ),
            ("smelt_kv_blocks_used", "KV cache blocks in use.", |s| {
                &s.kv_blocks_used
            }),
            ("smelt_kv_blocks_free", "KV cache blocks free.", |s| {
                &s.kv_blocks_free
            }),
            (
                "smelt_prefix_cache_enabled",
                "1 when the model caches prompt prefixes; 0 when off (--no-prefix-cache, or a \
                 model with recurrent layers, which cannot).",
                |s| &s.prefix_cache_enabled,
            ),
        ];
        for (kind, list) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
            for (name, help, get) in list.iter() {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for (id, s) in models {
                    let v = get(s).load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}{{model=\"{}\"}} {v}", escape(id));
                }
            }
        }
        // The hit rate itself, for dashboards without PromQL: hits over lookups since load.
        let name = "smelt_prefix_cache_hit_rate";
        let _ = writeln!(
            out,
            "# HELP {name} Prompt tokens found in the prefix cache over those looked up, since \
             the model loaded (0 before any lookup).\n# TYPE {name} gauge"
        );
        for (id, s) in models {
            let q = s.prefix_query_tokens.load(Ordering::Relaxed);
            let h = s.prefix_hit_tokens.load(Ordering::Relaxed);
            let rate = if q == 0 { 0.0 } else { h as f64 / q as f64 };
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {rate}", escape(id));
        }
        let hists: [Family<Histogram>; 2] = [
            (
                "smelt_time_to_first_token_seconds",
                "From a request's arrival to its first generated token.",
                |s| &s.ttft,
            ),
            (
                "smelt_inter_token_latency_seconds",
                "Between consecutive generated tokens of one request.",
                |s| &s.itl,
            ),
        ];
        for (name, help, get) in hists {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (id, s) in models {
                get(s).write(&mut out, name, &format!("model=\"{}\"", escape(id)));
            }
        }
        out
    }
}

/// A label value with `\`, `"` and newlines escaped as the format asks.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut s = String::new();
        h.write(&mut s, "x", "model=\"m\"");
        assert!(s.contains("x_bucket{model=\"m\",le=\"0.1\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{model=\"m\",le=\"1\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{model=\"m\",le=\"+Inf\"} 3\n"), "{s}");
        assert!(s.contains("x_count{model=\"m\"} 3\n"), "{s}");
        assert!(s.contains("x_sum{model=\"m\"} 5.55\n"), "{s}");
    }

    #[test]
    fn exposition_has_every_family() {
        let srv = ServerStats::default();
        srv.count_response(200);
        srv.count_response(200);
        srv.count_response(429);
        let m = Arc::new(ModelStats::default());
        m.running.store(3, Ordering::Relaxed);
        m.prefix_query_tokens.store(400, Ordering::Relaxed);
        m.prefix_hit_tokens.store(100, Ordering::Relaxed);
        m.prefix_cache_enabled.store(1, Ordering::Relaxed);
        let text = srv.render(&[("a\"b".to_string(), m)]);
        assert!(text.contains("smelt_requests_total{status=\"200\"} 2\n"));
        assert!(text.contains("smelt_requests_total{status=\"429\"} 1\n"));
        assert!(text.contains("smelt_running_sequences{model=\"a\\\"b\"} 3\n"));
        assert!(text.contains("smelt_prefix_cache_hit_rate{model=\"a\\\"b\"} 0.25\n"));
        assert!(text.contains("smelt_prefix_cache_enabled{model=\"a\\\"b\"} 1\n"));
        for family in [
            "smelt_prompt_tokens_total",
            "smelt_generated_tokens_total",
            "smelt_queue_depth",
            "smelt_kv_blocks_used",
            "smelt_kv_blocks_free",
            "smelt_time_to_first_token_seconds_bucket",
            "smelt_inter_token_latency_seconds_count",
        ] {
            assert!(text.contains(family), "{family} missing:\n{text}");
        }
    }
}
