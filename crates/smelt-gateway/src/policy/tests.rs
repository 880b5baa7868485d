//! The routing and eviction rules of issue 22 on plain data: every decision of
//! [`Cluster`](super::Cluster) checked exactly, with no sockets and no clock.

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
