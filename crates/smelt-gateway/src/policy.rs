//! The gateway's decisions as plain data, with no sockets and no clock: which node serves a
//! request, where a model is loaded when it is loaded nowhere, what is evicted to make room,
//! and when the answer is "wait" or 503. The HTTP side ([`crate::proxy`], [`crate::nodes`])
//! holds a [`Cluster`] under a mutex and acts on what it returns, so every rule of issue 22's
//! routing and eviction is tested here exactly and fast.
//!
//! Everything in a [`Cluster`] is rebuilt from the nodes' own reports (their loaded models
//! and memory) except soft hints: in-flight counts of this gateway's requests and when each
//! model was last used here.

use std::collections::{BTreeMap, BTreeSet};

/// A model's phase on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Asked to load; its memory is reserved, requests wait for it.
    Loading,
    Loaded,
    /// Asked to unload (evicted); its memory counts until the node confirms.
    Unloading,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Loaded => "loaded",
            Phase::Unloading => "unloading",
        }
    }
}

/// One model on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub phase: Phase,
    /// What it takes of the node's room.
    pub bytes: u64,
    /// This gateway's requests on it (sent, or waiting for its load).
    pub in_flight: u32,
    /// When it was last routed to ([`Cluster::tick`] units; 0: never through this gateway).
    pub last_used: u64,
    /// Free KV blocks the node last reported for it.
    pub kv_free: u64,
}

/// Where a node comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A `[[node]]` of the config file.
    Static,
    /// Joined with `smelt serve --gateway` (registration and heartbeats).
    Registered,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub url: String,
    pub admin_key: Option<String>,
    pub origin: Origin,
    /// Answers `/live` (and was reachable at its last connection).
    pub up: bool,
    /// Room from the config (`memory_mb`), which wins over the node's report.
    pub room_configured: Option<u64>,
    /// Room the node reports (`max_models_bytes`; `None`: no limit or not known yet).
    pub room_reported: Option<u64>,
    /// This gateway's requests on the node, over all its models.
    pub in_flight: u32,
    pub models: BTreeMap<String, Placed>,
    /// Models never evicted from this node (config `pinned_on`, or pinned by hand).
    pub pins: BTreeSet<String>,
    /// Moves on with every load or unload this gateway makes here, so a report fetched
    /// before one finished is not applied over it (see [`Cluster::sync`]).
    pub epoch: u64,
    /// Since when it has been down (`None` while up).
    pub down_since: Option<std::time::Instant>,
    /// A node that joined by itself and stayed down past `forget_after_ms`: left out of every
    /// listing and no longer polled, until it registers again. (Kept in place rather than
    /// removed, so the indices requests in flight hold stay valid.)
    pub forgotten: bool,
}

impl Node {
    pub fn new(name: &str, url: &str, admin_key: Option<String>, origin: Origin) -> Node {
        Node {
            name: name.into(),
            url: url.trim_end_matches('/').into(),
            admin_key,
            origin,
            up: false,
            room_configured: None,
            room_reported: None,
            in_flight: 0,
            models: BTreeMap::new(),
            pins: BTreeSet::new(),
            epoch: 0,
            down_since: None,
            forgotten: false,
        }
    }

    /// Bytes models may take here (`u64::MAX`: no limit known).
    pub fn room(&self) -> u64 {
        self.room_configured
            .or(self.room_reported)
            .unwrap_or(u64::MAX)
    }

    /// Bytes taken by models in every phase (a loading one has its room reserved, an
    /// unloading one keeps its room until the node confirms).
    pub fn used(&self) -> u64 {
        self.models.values().map(|p| p.bytes).sum()
    }

    pub fn free(&self) -> u64 {
        self.room().saturating_sub(self.used())
    }

    fn has(&self, model: &str, phase: Phase) -> bool {
        self.models.get(model).is_some_and(|p| p.phase == phase)
    }

    /// Whether any model here is on its way in or out (room will change shortly).
    fn in_transition(&self) -> bool {
        self.models.values().any(|p| p.phase != Phase::Loaded)
    }
}

/// A catalogue model.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub source: String,
    /// Configured memory; `None`: learned from nodes' reports.
    pub bytes: Option<u64>,
}

/// What to do with a request for a model.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Send it to this node, where the model is loaded.
    Serve(usize),
    /// The model is loading on this node: wait for a change and route again.
    Wait(usize),
    /// Load the model on `node` (after unloading `evict` there, least recently used first),
    /// then route again.
    Load {
        node: usize,
        evict: Vec<String>,
        bytes: u64,
    },
    /// The model is in no catalogue and loaded on no healthy node.
    Unknown,
    /// 503, with a message that says why.
    Unavailable(String),
}

/// The gateway's view of its nodes and catalogue.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub catalogue: BTreeMap<String, Spec>,
    /// Bytes nodes reported for each model, for catalogue entries without `memory_mb`.
    pub learned: BTreeMap<String, u64>,
    /// A catalogue model's file plus its KV cache at its context, when the gateway can read
    /// the file (the estimate before any node has reported the model; see `estimate`).
    pub on_disk: BTreeMap<String, u64>,
    /// Use counter: each routed request moves it on by one (LRU order, no clock needed).
    pub tick: u64,
}

/// A model a node reported as loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    pub id: String,
    pub bytes: u64,
    pub kv_free: u64,
}

impl Cluster {
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// What `model` takes on a node: the config's `memory_mb`, else what a node reported,
    /// else its file's size, else nothing known (0).
    pub fn bytes_of(&self, model: &str) -> u64 {
        self.catalogue
            .get(model)
            .and_then(|s| s.bytes)
            .or_else(|| self.learned.get(model).copied())
            .or_else(|| self.on_disk.get(model).copied())
            .unwrap_or(0)
    }

    pub fn pinned(&self, node: usize, model: &str) -> bool {
        self.nodes[node].pins.contains(model)
    }

    /// Where a request for `model` goes, leaving out the nodes in `exclude` (tried already).
    pub fn route(&self, model: &str, exclude: &[usize]) -> Route {
        let usable = |i: usize| self.nodes[i].up && !exclude.contains(&i);
        // Fewest in flight; ties: most free KV; then the config's order.
        let serving = (0..self.nodes.len())
            .filter(|&i| usable(i) && self.nodes[i].has(model, Phase::Loaded))
            .min_by_key(|&i| {
                let n = &self.nodes[i];
                (n.in_flight, std::cmp::Reverse(n.models[model].kv_free), i)
            });
        if let Some(i) = serving {
            return Route::Serve(i);
        }
        if let Some(i) =
            (0..self.nodes.len()).find(|&i| usable(i) && self.nodes[i].has(model, Phase::Loading))
        {
            return Route::Wait(i);
        }
        if !self.catalogue.contains_key(model) {
            // A node's own model, not in the catalogue: servable only where it is.
            let anywhere = self.nodes.iter().any(|n| n.models.contains_key(model));
            return if anywhere {
                Route::Unavailable(format!(
                    "model `{model}` is loaded only on nodes that are down (or failed this \
                     request) and is not in the gateway's catalogue, so it cannot be loaded \
                     elsewhere"
                ))
            } else {
                Route::Unknown
            };
        }
        self.place(model, exclude)
    }

    /// Where to load `model`: the healthy node with the most free room when it fits there;
    /// else the first node, in order of free room, where unloading least recently used models
    /// that are neither pinned nor serving makes room.
    fn place(&self, model: &str, exclude: &[usize]) -> Route {
        let need = self.bytes_of(model);
        let mut up: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].up && !exclude.contains(&i))
            .collect();
        if up.is_empty() {
            return Route::Unavailable(format!(
                "no healthy node can take model `{model}`: every node is down{}",
                if exclude.is_empty() {
                    ""
                } else {
                    " or failed this request"
                }
            ));
        }
        up.sort_by_key(|&i| (std::cmp::Reverse(self.nodes[i].free()), i));
        if self.nodes[up[0]].free() >= need {
            return Route::Load {
                node: up[0],
                evict: Vec::new(),
                bytes: need,
            };
        }
        for &i in &up {
            if let Some(evict) = self.evictions(i, need) {
                return Route::Load {
                    node: i,
                    evict,
                    bytes: need,
                };
            }
        }
        // Room that is on its way out (an eviction) or being reserved may settle: wait.
        if let Some(&i) = up.iter().find(|&&i| self.nodes[i].in_transition()) {
            return Route::Wait(i);
        }
        let biggest = up.iter().map(|&i| self.nodes[i].room()).max().unwrap_or(0);
        if need > biggest {
            return Route::Unavailable(format!(
                "model `{model}` needs {} MiB, more than any healthy node has room for ({} MiB)",
                need >> 20,
                biggest >> 20
            ));
        }
        Route::Unavailable(format!(
            "no room for model `{model}` ({} MiB): every healthy node is full of models that \
             are pinned or serving requests; retry later or unpin one",
            need >> 20
        ))
    }

    /// The models to unload from `node` so `need` bytes fit, least recently used first, or
    /// `None` when only pinned or busy models would have to go.
    pub fn evictions(&self, node: usize, need: u64) -> Option<Vec<String>> {
        let n = &self.nodes[node];
        if need > n.room() {
            return None;
        }
        let mut free = n.free();
        let mut lru: Vec<(&String, &Placed)> = n
            .models
            .iter()
            .filter(|(m, p)| p.phase == Phase::Loaded && p.in_flight == 0 && !n.pins.contains(*m))
            .collect();
        lru.sort_by_key(|(m, p)| (p.last_used, *m));
        let mut out = Vec::new();
        for (m, p) in lru {
            if free >= need {
                break;
            }
            free = free.saturating_add(p.bytes);
            out.push(m.clone());
        }
        (free >= need).then_some(out)
    }

    /// Marks a planned load: evicted models start unloading, the model's room is reserved.
    pub fn begin_load(&mut self, node: usize, model: &str, bytes: u64, evict: &[String]) {
        let n = &mut self.nodes[node];
        n.epoch += 1;
        for e in evict {
            if let Some(p) = n.models.get_mut(e) {
                p.phase = Phase::Unloading;
            }
        }
        n.models.insert(
            model.to_string(),
            Placed {
                phase: Phase::Loading,
                bytes,
                in_flight: 0,
                last_used: 0,
                kv_free: 0,
            },
        );
    }

    /// The node confirmed (or failed) an unload.
    pub fn finish_unload(&mut self, node: usize, model: &str) {
        let n = &mut self.nodes[node];
        n.epoch += 1;
        if n.models
            .get(model)
            .is_some_and(|p| p.phase == Phase::Unloading)
        {
            n.models.remove(model);
        }
    }

    /// The load ended: `Some(report)` when the node has the model now, `None` when it failed.
    pub fn finish_load(&mut self, node: usize, model: &str, loaded: Option<Reported>) {
        self.nodes[node].epoch += 1;
        match loaded {
            Some(r) => {
                self.learned.insert(model.to_string(), r.bytes);
                let bytes = self.catalogue_bytes(model).unwrap_or(r.bytes);
                let p = self.nodes[node]
                    .models
                    .entry(model.to_string())
                    .or_insert(Placed {
                        phase: Phase::Loaded,
                        bytes,
                        in_flight: 0,
                        last_used: 0,
                        kv_free: r.kv_free,
                    });
                p.phase = Phase::Loaded;
                p.bytes = bytes;
                p.kv_free = r.kv_free;
            }
            None => {
                let n = &mut self.nodes[node];
                if n.models
                    .get(model)
                    .is_some_and(|p| p.phase == Phase::Loading)
                {
                    n.models.remove(model);
                }
            }
        }
    }

    fn catalogue_bytes(&self, model: &str) -> Option<u64> {
        self.catalogue.get(model).and_then(|s| s.bytes)
    }

    /// A request starts on `node` (sent there, or waiting for its load there).
    pub fn start(&mut self, node: usize, model: &str) {
        self.tick += 1;
        let tick = self.tick;
        let n = &mut self.nodes[node];
        n.in_flight += 1;
        if let Some(p) = n.models.get_mut(model) {
            p.in_flight += 1;
            p.last_used = tick;
        }
    }

    /// The request started with [`Cluster::start`] is over.
    pub fn end(&mut self, node: usize, model: &str) {
        self.tick += 1;
        let tick = self.tick;
        let n = &mut self.nodes[node];
        n.in_flight = n.in_flight.saturating_sub(1);
        if let Some(p) = n.models.get_mut(model) {
            p.in_flight = p.in_flight.saturating_sub(1);
            p.last_used = tick;
        }
    }

    /// The node failed a liveness check or a connection: no requests until it answers again.
    pub fn set_down(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.up = false;
        n.down_since.get_or_insert_with(std::time::Instant::now);
    }

    /// Forgets node `node` when it joined by itself and has been down for `after` or more:
    /// its models and pins go, and it leaves every listing. Returns whether it did.
    pub fn forget_if_gone(&mut self, node: usize, after: std::time::Duration) -> bool {
        let n = &mut self.nodes[node];
        let gone = n.origin == Origin::Registered
            && !n.up
            && n.down_since.is_some_and(|t| t.elapsed() >= after);
        if gone {
            n.forgotten = true;
            n.models.clear();
            n.pins.clear();
            n.in_flight = 0;
        }
        gone
    }

    /// A node answered `/live` and reported its models: the gateway's view of it becomes
    /// what it says, keeping loads and unloads in progress and this gateway's soft counts.
    pub fn sync(&mut self, node: usize, reported: &[Reported], room: Option<u64>) {
        for r in reported {
            self.learned.insert(r.id.clone(), r.bytes);
        }
        let bytes: Vec<u64> = reported
            .iter()
            .map(|r| self.catalogue_bytes(&r.id).unwrap_or(r.bytes))
            .collect();
        let n = &mut self.nodes[node];
        n.up = true;
        n.down_since = None;
        n.room_reported = room;
        n.models
            .retain(|m, p| p.phase != Phase::Loaded || reported.iter().any(|r| &r.id == m));
        for (r, bytes) in reported.iter().zip(bytes) {
            let p = n.models.entry(r.id.clone()).or_insert(Placed {
                phase: Phase::Loaded,
                bytes,
                in_flight: 0,
                last_used: 0,
                kv_free: r.kv_free,
            });
            if p.phase == Phase::Loaded {
                p.bytes = bytes;
            }
            p.kv_free = r.kv_free;
        }
    }

    /// Pinned models missing from healthy nodes, with the loads that would put them back.
    /// A pin that cannot get room now (busy models) is left for the next poll.
    pub fn pin_loads(&self) -> Vec<(usize, String, Vec<String>, u64)> {
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.up {
                continue;
            }
            for m in &n.pins {
                if n.models.contains_key(m) || !self.catalogue.contains_key(m) {
                    continue;
                }
                let need = self.bytes_of(m);
                if let Some(evict) = self.evictions(i, need) {
                    out.push((i, m.clone(), evict, need));
                    // One per node per round: the next sees this one's room taken.
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
