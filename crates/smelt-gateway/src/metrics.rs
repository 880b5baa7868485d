//! `GET /metrics` of the gateway, in Prometheus' text format: requests by model, node and
//! status, retries, evictions, loads with their durations, and each node's state and
//! in-flight count. A few maps under one mutex; written by hand as the server's are.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::policy::Cluster;

type Key = (String, String);

#[derive(Default)]
struct Counts {
    /// (model, node, status) -> requests answered.
    requests: BTreeMap<(String, String, u16), u64>,
    /// (model, node) -> requests sent again elsewhere after this node failed them.
    retries: BTreeMap<Key, u64>,
    evictions: BTreeMap<Key, u64>,
    /// (model, node) -> (loads ok, loads failed, seconds of successful loads).
    loads: BTreeMap<Key, (u64, u64, f64)>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Counts>,
}

fn key(model: &str, node: &str) -> Key {
    (model.to_string(), node.to_string())
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Counts) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request answered; `node` is empty when none was reached (503 from the gateway).
    pub fn request(&self, model: &str, node: &str, status: u16) {
        self.with(|c| {
            *c.requests
                .entry((model.into(), node.into(), status))
                .or_default() += 1
        });
    }

    pub fn retry(&self, model: &str, node: &str) {
        self.with(|c| *c.retries.entry(key(model, node)).or_default() += 1);
    }

    pub fn eviction(&self, model: &str, node: &str) {
        self.with(|c| *c.evictions.entry(key(model, node)).or_default() += 1);
    }

    pub fn load(&self, model: &str, node: &str, ok: bool, seconds: f64) {
        self.with(|c| {
            let e = c.loads.entry(key(model, node)).or_default();
            if ok {
                e.0 += 1;
                e.2 += seconds;
            } else {
                e.1 += 1;
            }
        });
    }

    pub fn render(&self, cluster: &Cluster) -> String {
        let mut out = String::new();
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        self.with(|c| {
            head(&mut out, "smelt_gateway_requests_total", "counter",
                "Requests answered, by model, node (empty: none reached) and status.");
            for ((m, n, s), v) in &c.requests {
                let _ = writeln!(out, "smelt_gateway_requests_total{{model=\"{}\",node=\"{}\",status=\"{s}\"}} {v}", esc(m), esc(n));
            }
            head(&mut out, "smelt_gateway_retries_total", "counter",
                "Requests sent to another node after this node failed them (or answered 429).");
            for ((m, n), v) in &c.retries {
                let _ = writeln!(out, "smelt_gateway_retries_total{{model=\"{}\",node=\"{}\"}} {v}", esc(m), esc(n));
            }
            head(&mut out, "smelt_gateway_evictions_total", "counter",
                "Models unloaded from a node to make room for another.");
            for ((m, n), v) in &c.evictions {
                let _ = writeln!(out, "smelt_gateway_evictions_total{{model=\"{}\",node=\"{}\"}} {v}", esc(m), esc(n));
            }
            head(&mut out, "smelt_gateway_loads_total", "counter",
                "Model loads asked of nodes, by outcome.");
            for ((m, n), (ok, failed, _)) in &c.loads {
                let _ = writeln!(out, "smelt_gateway_loads_total{{model=\"{}\",node=\"{}\",outcome=\"ok\"}} {ok}", esc(m), esc(n));
                let _ = writeln!(out, "smelt_gateway_loads_total{{model=\"{}\",node=\"{}\",outcome=\"failed\"}} {failed}", esc(m), esc(n));
            }
            head(&mut out, "smelt_gateway_load_seconds_total", "counter",
                "Seconds spent in successful loads (divide by loads_total{outcome=\"ok\"} for the mean).");
            for ((m, n), (_, _, s)) in &c.loads {
                let _ = writeln!(out, "smelt_gateway_load_seconds_total{{model=\"{}\",node=\"{}\"}} {s:.6}", esc(m), esc(n));
            }
        });
        head(
            &mut out,
            "smelt_gateway_node_up",
            "gauge",
            "1 while the node answers /live.",
        );
        for n in cluster.nodes.iter().filter(|n| !n.forgotten) {
            let _ = writeln!(
                out,
                "smelt_gateway_node_up{{node=\"{}\"}} {}",
                esc(&n.name),
                n.up as u8
            );
        }
        head(
            &mut out,
            "smelt_gateway_in_flight",
            "gauge",
            "This gateway's requests on each node.",
        );
        for n in cluster.nodes.iter().filter(|n| !n.forgotten) {
            let _ = writeln!(
                out,
                "smelt_gateway_in_flight{{node=\"{}\"}} {}",
                esc(&n.name),
                n.in_flight
            );
        }
        head(
            &mut out,
            "smelt_gateway_model_state",
            "gauge",
            "1 for each model on each node, labelled with its state (loading, loaded, unloading).",
        );
        for n in cluster.nodes.iter().filter(|n| !n.forgotten) {
            for (m, p) in &n.models {
                let _ = writeln!(
                    out,
                    "smelt_gateway_model_state{{model=\"{}\",node=\"{}\",state=\"{}\"}} 1",
                    esc(m),
                    esc(&n.name),
                    p.phase.as_str()
                );
            }
        }
        out
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
