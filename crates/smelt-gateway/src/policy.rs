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
    /// Bytes of a catalogue model's file when the gateway can see it (a fallback estimate).
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
        self.nodes[node].up = false;
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
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    /// `nodes` nodes of `room_mb` each, all up, and models `m0..` of `model_mb` each.
    fn cluster(nodes: usize, room_mb: u64, models: usize, model_mb: u64) -> Cluster {
        let mut c = Cluster::default();
        for i in 0..nodes {
            let mut n = Node::new(
                &format!("n{i}"),
                &format!("http://h:{i}"),
                None,
                Origin::Static,
            );
            n.up = true;
            n.room_configured = Some(room_mb * MB);
            c.nodes.push(n);
        }
        for m in 0..models {
            c.catalogue.insert(
                format!("m{m}"),
                Spec {
                    source: "s".into(),
                    bytes: Some(model_mb * MB),
                },
            );
        }
        c
    }

    /// Routes, performs the load it asks for at once (as a node that always succeeds), and
    /// routes again: the node that serves, and what was evicted on the way.
    fn serve(c: &mut Cluster, model: &str) -> (usize, Vec<String>) {
        match c.route(model, &[]) {
            Route::Serve(i) => (i, vec![]),
            Route::Load { node, evict, bytes } => {
                c.begin_load(node, model, bytes, &evict);
                for e in &evict {
                    c.finish_unload(node, e);
                }
                c.finish_load(
                    node,
                    model,
                    Some(Reported {
                        id: model.into(),
                        bytes,
                        kv_free: 10,
                    }),
                );
                assert_eq!(c.route(model, &[]), Route::Serve(node));
                (node, evict)
            }
            other => panic!("{model}: {other:?}"),
        }
    }

    fn loaded(c: &Cluster, node: usize) -> Vec<&str> {
        c.nodes[node].models.keys().map(String::as_str).collect()
    }

    #[test]
    fn the_fewest_in_flight_serves_then_the_most_free_kv() {
        let mut c = cluster(3, 1000, 1, 100);
        for i in 0..3 {
            c.begin_load(i, "m0", 100 * MB, &[]);
            c.finish_load(
                i,
                "m0",
                Some(Reported {
                    id: "m0".into(),
                    bytes: 1,
                    kv_free: [5, 9, 7][i] as u64,
                }),
            );
        }
        // All idle: the most free KV (node 1).
        assert_eq!(c.route("m0", &[]), Route::Serve(1));
        c.start(1, "m0");
        // Node 1 busy: of 0 and 2 (idle), 2 has more KV.
        assert_eq!(c.route("m0", &[]), Route::Serve(2));
        c.start(2, "m0");
        assert_eq!(c.route("m0", &[]), Route::Serve(0));
        c.start(0, "m0");
        c.start(0, "m0");
        c.end(1, "m0");
        assert_eq!(c.route("m0", &[]), Route::Serve(1));
        // A node's in-flight counts every model on it.
        assert_eq!(c.nodes[0].in_flight, 2);
        // Excluded (tried) and down nodes are skipped.
        assert_eq!(c.route("m0", &[1]), Route::Serve(2));
        c.set_down(2);
        assert_eq!(c.route("m0", &[1]), Route::Serve(0));
        // Configured bytes win over the node's report.
        assert_eq!(c.nodes[0].models["m0"].bytes, 100 * MB);
    }

    #[test]
    fn a_model_loaded_nowhere_loads_where_there_is_most_room_and_requests_wait_for_it() {
        let mut c = cluster(3, 1000, 2, 300);
        c.begin_load(0, "m1", 300 * MB, &[]);
        c.nodes[2].room_configured = Some(900 * MB);
        // Free: n0 700, n1 1000, n2 900.
        let r = c.route("m0", &[]);
        assert_eq!(
            r,
            Route::Load {
                node: 1,
                evict: vec![],
                bytes: 300 * MB
            }
        );
        c.begin_load(1, "m0", 300 * MB, &[]);
        // While it loads, the next request waits for it instead of loading a second copy.
        assert_eq!(c.route("m0", &[]), Route::Wait(1));
        assert_eq!(c.nodes[1].models["m0"].phase, Phase::Loading);
        assert_eq!(c.nodes[1].free(), 700 * MB);
        // A failed load frees the reservation; the next request plans again.
        c.finish_load(1, "m0", None);
        assert!(!c.nodes[1].models.contains_key("m0"));
        assert!(matches!(c.route("m0", &[]), Route::Load { node: 1, .. }));
        // A node tried already is not chosen.
        assert!(matches!(c.route("m0", &[1]), Route::Load { node: 2, .. }));
    }

    #[test]
    fn eviction_takes_the_least_recently_used_idle_unpinned_model() {
        // One node with room for two of three models.
        let mut c = cluster(1, 700, 4, 300);
        serve(&mut c, "m0");
        serve(&mut c, "m1");
        c.start(0, "m0");
        c.end(0, "m0"); // m0 used after m1: m1 is least recently used
        let (_, ev) = serve(&mut c, "m2");
        assert_eq!(ev, ["m1"]);
        assert_eq!(loaded(&c, 0), ["m0", "m2"]);
        // Busy models are not evicted: m2 serves a request, so m0 goes although newer.
        c.start(0, "m2");
        c.start(0, "m0");
        c.end(0, "m0");
        let (_, ev) = serve(&mut c, "m3");
        assert_eq!(ev, ["m0"]);
        assert_eq!(loaded(&c, 0), ["m2", "m3"]);
        // Never past the room: used stays within it through all of this.
        assert!(c.nodes[0].used() <= c.nodes[0].room());
    }

    #[test]
    fn several_small_models_go_for_one_big_one() {
        let mut c = cluster(1, 1000, 3, 300);
        c.catalogue.get_mut("m2").unwrap().bytes = Some(900 * MB);
        serve(&mut c, "m0");
        serve(&mut c, "m1");
        let (_, ev) = serve(&mut c, "m2");
        assert_eq!(ev, ["m0", "m1"]);
    }

    #[test]
    fn pinned_models_stay_and_all_pinned_or_busy_is_503() {
        let mut c = cluster(2, 700, 4, 300);
        c.nodes[0].pins.insert("m0".into());
        c.nodes[1].pins.insert("m1".into());
        // Pins load at start, one round each poll.
        let mut rounds = 0;
        loop {
            let loads = c.pin_loads();
            if loads.is_empty() {
                break;
            }
            for (i, m, ev, b) in loads {
                c.begin_load(i, &m, b, &ev);
                c.finish_load(
                    i,
                    &m,
                    Some(Reported {
                        id: m.clone(),
                        bytes: b,
                        kv_free: 1,
                    }),
                );
            }
            rounds += 1;
        }
        assert_eq!(rounds, 1);
        assert_eq!(loaded(&c, 0), ["m0"]);
        assert_eq!(loaded(&c, 1), ["m1"]);
        // m2 and m3 fill the free slots; m0 and m1 stay through all later loads.
        serve(&mut c, "m2");
        serve(&mut c, "m3");
        for m in ["m2", "m3", "m2", "m3"] {
            serve(&mut c, m);
            assert!(c.nodes[0].models.contains_key("m0"));
            assert!(c.nodes[1].models.contains_key("m1"));
        }
        // Pin the other two as well: a fifth model has nowhere to go.
        c.catalogue.insert(
            "m4".into(),
            Spec {
                source: "s".into(),
                bytes: Some(300 * MB),
            },
        );
        for (i, n) in c.nodes.iter_mut().enumerate() {
            let other: Vec<String> = n.models.keys().cloned().collect();
            n.pins.extend(other);
            assert_eq!(n.pins.len(), 2, "node {i}");
        }
        match c.route("m4", &[]) {
            Route::Unavailable(m) => assert!(m.contains("pinned or serving"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Unpinned but busy is the same answer.
        let ps: Vec<String> = c.nodes[0].pins.iter().cloned().collect();
        c.nodes[0].pins.clear();
        for m in &ps {
            c.start(0, m);
        }
        assert!(matches!(c.route("m4", &[]), Route::Unavailable(_)));
        for m in &ps {
            c.end(0, m);
        }
        assert!(matches!(c.route("m4", &[]), Route::Load { node: 0, .. }));
    }

    #[test]
    fn a_model_bigger_than_any_node_says_so() {
        let mut c = cluster(2, 500, 1, 600);
        match c.route("m0", &[]) {
            Route::Unavailable(m) => assert!(m.contains("more than any healthy node"), "{m}"),
            other => panic!("{other:?}"),
        }
        c.nodes[1].room_configured = Some(600 * MB);
        assert!(matches!(c.route("m0", &[]), Route::Load { node: 1, .. }));
    }

    #[test]
    fn evictions_in_progress_make_requests_wait_not_fail() {
        let mut c = cluster(1, 700, 3, 300);
        serve(&mut c, "m0");
        serve(&mut c, "m1");
        // m2 is planned (m0 unloading, m2 loading); m0 busy-free but m1 in flight.
        let Route::Load { node, evict, bytes } = c.route("m2", &[]) else {
            panic!()
        };
        c.begin_load(node, "m2", bytes, &evict);
        c.start(0, "m1");
        // A request for m0 now: m1 busy, m2 loading, m0 unloading: wait, don't 503.
        assert_eq!(c.route("m0", &[]), Route::Wait(0));
    }

    #[test]
    fn down_nodes_get_nothing_and_their_models_load_elsewhere() {
        let mut c = cluster(2, 1000, 1, 300);
        let (i, _) = serve(&mut c, "m0");
        assert_eq!(i, 0);
        c.set_down(0);
        assert!(matches!(c.route("m0", &[]), Route::Load { node: 1, .. }));
        c.set_down(1);
        match c.route("m0", &[]) {
            Route::Unavailable(m) => assert!(m.contains("every node is down"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.route("nope", &[]), Route::Unknown);
    }

    #[test]
    fn sync_adopts_what_the_node_says_and_keeps_transitions() {
        let mut c = cluster(1, 1000, 2, 300);
        serve(&mut c, "m0");
        c.start(0, "m0");
        c.begin_load(0, "m1", 300 * MB, &[]);
        c.set_down(0);
        // The node restarted with only its own model: m0 is gone, m1 still loading, the
        // node's own model (not in the catalogue) counts with what it reports.
        c.sync(
            0,
            &[Reported {
                id: "own".into(),
                bytes: 200 * MB,
                kv_free: 4,
            }],
            Some(2000 * MB),
        );
        assert!(c.nodes[0].up);
        assert_eq!(loaded(&c, 0), ["m1", "own"]);
        assert_eq!(c.nodes[0].models["own"].bytes, 200 * MB);
        assert_eq!(c.nodes[0].room(), 1000 * MB, "the config's room wins");
        c.nodes[0].room_configured = None;
        assert_eq!(c.nodes[0].room(), 2000 * MB);
        // A model that is not in the catalogue serves where it is, and nowhere else.
        assert_eq!(c.route("own", &[]), Route::Serve(0));
        assert!(matches!(c.route("own", &[0]), Route::Unavailable(_)));
        assert_eq!(c.route("other", &[]), Route::Unknown);
        // The node's own model is evictable like any other (never used here: first to go).
        assert_eq!(
            c.evictions(0, 1990 * MB - 300 * MB),
            Some(vec!["own".into()])
        );
    }

    #[test]
    fn unknown_bytes_come_from_reports_then_files() {
        let mut c = cluster(1, 1000, 1, 0);
        c.catalogue.get_mut("m0").unwrap().bytes = None;
        assert_eq!(c.bytes_of("m0"), 0);
        c.on_disk.insert("m0".into(), 50);
        assert_eq!(c.bytes_of("m0"), 50);
        serve(&mut c, "m0");
        c.sync(
            0,
            &[Reported {
                id: "m0".into(),
                bytes: 77,
                kv_free: 1,
            }],
            None,
        );
        assert_eq!(c.bytes_of("m0"), 77);
        assert_eq!(c.nodes[0].models["m0"].bytes, 77);
    }
}
