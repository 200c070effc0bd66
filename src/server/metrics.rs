//! `/metrics` in the Prometheus text format: HTTP requests by endpoint and status, and the
//! scheduler's counters and gauges.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use super::AppState;

/// The `status` label of a request: the HTTP status answered, or `cancelled` when the client
/// left before the answer was ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Code(u16),
    Cancelled,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Code(c) => write!(f, "{c}"),
            Status::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// Requests answered, by endpoint and status; connections.
#[derive(Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(&'static str, Status), u64>>,
    /// Connections being served.
    pub connections_open: AtomicUsize,
    /// Connections turned away past `--max-connections`.
    pub connections_refused: AtomicU64,
    /// Connections closed by a timeout, by kind (`header`, `idle`, `write`).
    timeouts: Mutex<BTreeMap<&'static str, u64>>,
}

impl HttpMetrics {
    pub fn record(&self, endpoint: &'static str, status: u16) {
        self.record_status(endpoint, Status::Code(status));
    }

    pub fn record_status(&self, endpoint: &'static str, status: Status) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint, status)).or_insert(0) += 1;
        }
    }

    pub fn timed_out(&self, kind: &'static str) {
        if let Ok(mut m) = self.timeouts.lock() {
            *m.entry(kind).or_insert(0) += 1;
        }
    }
}

/// The whole exposition.
pub fn render(st: &AppState) -> String {
    let mut out = String::new();
    let w = &mut out;
    header(
        w,
        "kiln_requests_total",
        "counter",
        "HTTP requests answered, by endpoint and status (`cancelled`: the client left first).",
    );
    if let Ok(m) = st.http.requests.lock() {
        for ((ep, status), n) in m.iter() {
            let _ = writeln!(
                w,
                "kiln_requests_total{{endpoint=\"{ep}\",status=\"{status}\"}} {n}"
            );
        }
    }
    header(
        w,
        "kiln_http_timeouts_total",
        "counter",
        "Connections closed by a timeout, by kind (header, idle, write).",
    );
    if let Ok(m) = st.http.timeouts.lock() {
        for (kind, n) in m.iter() {
            let _ = writeln!(w, "kiln_http_timeouts_total{{kind=\"{kind}\"}} {n}");
        }
    }
    metric(
        w,
        "kiln_http_connections_refused_total",
        "counter",
        "Connections turned away past --max-connections.",
        st.http.connections_refused.load(Relaxed),
    );
    metric(
        w,
        "kiln_http_connections_open",
        "gauge",
        "Connections being served.",
        st.http.connections_open.load(Relaxed),
    );
    let s = &st.sched;
    let counters: [(&str, &str, u64); 13] = [
        (
            "kiln_requests_admitted_total",
            "Generation requests given a slot.",
            s.requests_admitted.load(Relaxed),
        ),
        (
            "kiln_requests_finished_total",
            "Generations that ran to a stop or a length limit.",
            s.requests_finished.load(Relaxed),
        ),
        (
            "kiln_requests_cancelled_total",
            "Generations cancelled because the client went away.",
            s.requests_cancelled.load(Relaxed),
        ),
        (
            "kiln_requests_failed_total",
            "Generations the engine refused.",
            s.requests_failed.load(Relaxed),
        ),
        (
            "kiln_prompt_tokens_total",
            "Prompt tokens of admitted requests (tokens in).",
            s.prompt_tokens.load(Relaxed),
        ),
        (
            "kiln_prefill_tokens_total",
            "Prompt tokens evaluated.",
            s.prefill_tokens.load(Relaxed),
        ),
        (
            "kiln_prefill_tokens_saved_total",
            "Prompt tokens whose KV came from the prefix cache.",
            s.prefill_tokens_saved.load(Relaxed),
        ),
        (
            "kiln_prefix_cache_hits_total",
            "Requests that reused a cached prefix.",
            s.prefix_hits.load(Relaxed),
        ),
        (
            "kiln_generated_tokens_total",
            "Tokens generated (tokens out).",
            s.generated_tokens.load(Relaxed),
        ),
        (
            "kiln_decode_steps_total",
            "Batched decode steps.",
            s.decode_steps.load(Relaxed),
        ),
        (
            "kiln_spec_passes_total",
            "Speculative verification passes (a token and its drafts evaluated together).",
            s.spec_passes.load(Relaxed),
        ),
        (
            "kiln_spec_draft_tokens_total",
            "Draft tokens evaluated by speculative decoding.",
            s.spec_drafted.load(Relaxed),
        ),
        (
            "kiln_spec_accepted_tokens_total",
            "Draft tokens accepted (generated without a step of their own).",
            s.spec_accepted.load(Relaxed),
        ),
    ];
    for (name, help, v) in counters {
        metric(w, name, "counter", help, v);
    }
    let gauges: [(&str, &str, f64); 5] = [
        (
            "kiln_queue_depth",
            "Requests waiting for a slot.",
            s.queue_depth.load(Relaxed) as f64,
        ),
        (
            "kiln_kv_slots_in_use",
            "KV slots holding an active sequence.",
            s.slots_in_use.load(Relaxed) as f64,
        ),
        (
            "kiln_kv_slots_total",
            "KV slots (--parallel).",
            s.slots_total.load(Relaxed) as f64,
        ),
        (
            "kiln_tokens_per_second",
            "Aggregate decode speed over recent steps.",
            s.decode_tps(),
        ),
        (
            "kiln_kv_cache_bytes",
            "Bytes allocated to the KV caches of all slots.",
            st.kv_bytes as f64,
        ),
    ];
    for (name, help, v) in gauges {
        metric(w, name, "gauge", help, v);
    }
    router_gauges(w, st);
    out
}

/// A metric of one value: its `# HELP` and `# TYPE` lines, then `name value`.
fn metric(w: &mut String, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
    header(w, name, kind, help);
    let _ = writeln!(w, "{name} {v}");
}

/// What routers read, under vLLM's names (the Gateway API Inference Extension's model-server
/// protocol: queued and running requests, KV-cache usage as a fraction; its prefix-aware
/// scorers and dashboards: prefix-cache queries and hits, in tokens), labelled by model.
fn router_gauges(w: &mut String, st: &AppState) {
    let s = &st.sched;
    let model = escape_label(&st.opts.model_id);
    let total = s.kv_tokens_total.load(Relaxed);
    let usage = if total == 0 {
        0.0
    } else {
        s.kv_tokens_in_use.load(Relaxed) as f64 / total as f64
    };
    let rows: [(&str, &str, &str, f64); 6] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Requests holding a sequence slot (generating, or evaluating their prompt).",
            s.slots_in_use.load(Relaxed) as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting for a sequence slot.",
            s.queue_depth.load(Relaxed) as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage, 0 to 1: positions holding running requests' tokens over all positions (a finished sequence's cached prefix counts as free).",
            usage,
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "KV-cache usage, 0 to 1 (vLLM's older name of vllm:kv_cache_usage_perc).",
            usage,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache (prompt tokens of admitted requests).",
            s.prompt_tokens.load(Relaxed) as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache (not evaluated again).",
            s.prefill_tokens_saved.load(Relaxed) as f64,
        ),
    ];
    for (name, kind, help, v) in rows {
        header(w, name, kind, help);
        let _ = writeln!(w, "{name}{{model_name=\"{model}\"}} {v}");
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(w: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(w, "# HELP {name} {help}");
    let _ = writeln!(w, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::escape_label;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("model-1"), "model-1");
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
