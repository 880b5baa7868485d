//! Tensor-parallel shard plans from model shapes alone (metadata, no weights): head splits
//! with fewer KV heads than ranks, delta-net and expert tensors, and real models' shapes in
//! K-quants over 2, 4 and 8 GPUs (what runs, and what is refused with a way out). Apart
//! from tests/tp.rs, which runs sharded forwards.

// A slice's columns are a list of runs, often of one: `vec![a..b]` is meant.
#![allow(clippy::single_range_in_vec_init)]

use smelt_engine::tp::{Placement, ShardPlan, TpOptions};
use smelt_gguf::{Gguf, GgufWriter, Metadata, Value};

#[test]
fn plan_splits_heads_with_fewer_kv_heads_than_ranks() {
    use smelt_engine::tp::plan::split_heads;
    // 14 query heads over 2 KV heads on 4 ranks: each KV head on 2 ranks, 4+3 heads each.
    let (q, kv) = split_heads(14, 2, 4, 1).expect("split");
    assert_eq!(q, vec![0..4, 4..7, 7..11, 11..14]);
    assert_eq!(kv, vec![0..1, 0..1, 1..2, 1..2]);
    // 32 heads over 8 KV heads on 2 ranks: 4 KV heads each.
    let (q, kv) = split_heads(32, 8, 2, 2).expect("split");
    assert_eq!(q, vec![0..16, 16..32]);
    assert_eq!(kv, vec![0..4, 4..8]);
    // Query-head cuts aligned to 2 heads when the group has 3 cannot work on 2 ranks/KV.
    assert!(split_heads(6, 2, 4, 2).is_err());
}

#[test]
fn plan_places_delta_net_and_expert_tensors() {
    // A Qwen3.5-MoE-like shape, metadata only: 4 key heads, 8 value heads of 128 (tiled:
    // value head h reads key head h % 4), 8 experts of 512 rows, a shared expert of 1024.
    let a = "qwen35moe";
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String(a.into()));
    let u = |v: u32| Value::U32(v);
    for (k, v) in [
        ("embedding_length", 1024),
        ("block_count", 4),
        ("attention.head_count", 16),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 256),
        ("attention.value_length", 256),
        ("vocab_size", 1000),
        ("expert_count", 8),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 512),
        ("expert_shared_feed_forward_length", 1024),
        ("ssm.conv_kernel", 4),
        ("ssm.state_size", 128),
        ("ssm.group_count", 4),
        ("ssm.time_step_rank", 8),
        ("ssm.inner_size", 1024),
        ("full_attention_interval", 4),
    ] {
        m.insert(format!("{a}.{k}"), u(v));
    }
    m.insert(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-6),
    );
    let w = GgufWriter::new(Vec::new(), &m, Vec::new()).expect("header");
    let g = Gguf::from_bytes(w.finish().expect("finish")).expect("parse");
    let info = smelt_engine::ModelInfo::from_gguf(&g).expect("info");
    let opts = TpOptions {
        n_ranks: 2,
        vocab_parallel: false,
    };
    let plan = ShardPlan::for_info(&info, opts, &|_| 32).expect("plan");
    assert_eq!(plan.ranks[1].delta_k, 2..4);
    // Tiled value heads: rank 1 reads key heads 2, 3, so value heads 2, 3, 6, 7.
    assert_eq!(plan.delta_v(&plan.ranks[1].delta_k), vec![2..4, 6..8]);
    let slice = |name: &str, shape: &[u64]| match plan.placement(name, shape).expect(name) {
        Placement::Split(s) => s,
        Placement::Replicated => panic!("{name} replicated"),
    };
    // attn_qkv rows: q (4 x 128), k (4 x 128), v (8 x 128).
    let qkv = slice("blk.0.attn_qkv.weight", &[1024, 2048]);
    assert_eq!(
        qkv[1].rows,
        vec![256..512, 768..1024, 1280..1536, 1792..2048]
    );
    assert_eq!(qkv[1].shape, vec![1024, 1024]);
    let conv = slice("blk.0.ssm_conv1d.weight", &[4, 2048]);
    assert_eq!(conv[1].shape, vec![4, 1024]);
    let ssm_a = slice("blk.0.ssm_a", &[8]);
    assert_eq!(ssm_a[1].rows, vec![2..4, 6..8]);
    assert_eq!(ssm_a[1].shape, vec![4]);
    // ssm_out's columns for tiled heads are two runs, side by side in the rank's order.
    let out = slice("blk.0.ssm_out.weight", &[1024, 1024]);
    assert_eq!(out[1].cols, Some(vec![256..512, 768..1024]));
    assert_eq!(out[1].shape, vec![512, 1024]);
    // Experts: each expert's rows split, down's columns split.
    let up = slice("blk.0.ffn_up_exps.weight", &[1024, 512, 8]);
    assert_eq!(up[0].rows.len(), 8);
    assert_eq!(up[0].rows[1], 512..768);
    assert_eq!(up[0].shape, vec![1024, 256, 8]);
    let down = slice("blk.0.ffn_down_exps.weight", &[512, 1024, 8]);
    assert_eq!(down[1].cols, Some(vec![256..512]));
    assert_eq!(down[1].shape, vec![256, 1024, 8]);
    let sh = slice("blk.0.ffn_down_shexp.weight", &[1024, 1024]);
    assert_eq!(sh[1].cols, Some(vec![512..1024]));
    // Routers and the gated attention's norms stay whole; its Q rows carry the gate.
    for name in ["blk.0.ffn_gate_inp.weight", "blk.3.attn_q_norm.weight"] {
        assert_eq!(
            plan.placement(name, &[1024, 8]).expect(name),
            Placement::Replicated
        );
    }
    let q = slice("blk.3.attn_q.weight", &[1024, 16 * 512]);
    assert_eq!(q[1].rows, vec![8 * 512..16 * 512]);
    let counts = plan.rank_counts(1);
    assert!(counts.contains(&(format!("{a}.ssm.time_step_rank"), 4)));
    assert!(counts.contains(&(format!("{a}.expert_feed_forward_length"), 256)));
}

/// A metadata-only model of architecture `a` with these `{a}.*` integer keys.
fn shape_only(a: &str, keys: &[(&str, u32)]) -> smelt_engine::ModelInfo {
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String(a.into()));
    for (k, v) in keys {
        m.insert(format!("{a}.{k}"), Value::U32(*v));
    }
    m.insert(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    let w = GgufWriter::new(Vec::new(), &m, Vec::new()).expect("header");
    let g = Gguf::from_bytes(w.finish().expect("finish")).expect("parse");
    smelt_engine::ModelInfo::from_gguf(&g).expect("info")
}

#[test]
fn plans_of_real_shapes_in_k_quants_for_2_4_and_8_gpus() {
    // TP=4 readiness, from the shapes alone (K-quant blocks of 256 columns everywhere):
    // Llama 3 8B and 70B split at 2, 4 and 8 (8B at 8: one KV head a rank; 70B: heads of
    // 128 cut every 2 heads), Mixtral 8x7B's experts (14336 rows) too. Qwen3-30B-A3B's
    // experts of 768 rows split unevenly on 256-column blocks at 2 and cannot be cut at 4:
    // refused with the way out in the message, not run wrong.
    let llama = |layers, e, ff, heads, kv| {
        shape_only(
            "llama",
            &[
                ("embedding_length", e),
                ("block_count", layers),
                ("feed_forward_length", ff),
                ("attention.head_count", heads),
                ("attention.head_count_kv", kv),
                ("vocab_size", 128_256),
            ],
        )
    };
    let k = |_: &str| 256usize;
    for (name, info) in [
        ("llama3-8b", llama(32, 4096, 14336, 32, 8)),
        ("llama3-70b", llama(80, 8192, 28672, 64, 8)),
    ] {
        for n in [2usize, 4, 8] {
            let opts = TpOptions {
                n_ranks: n,
                vocab_parallel: true,
            };
            let p = ShardPlan::for_info(&info, opts, &k)
                .unwrap_or_else(|e| panic!("{name} tp={n}: {e}"));
            let kv_each = info.n_head_kv / n.min(info.n_head_kv);
            for (r, s) in p.ranks.iter().enumerate() {
                assert_eq!(s.q_heads.len(), info.n_head / n, "{name} tp={n} rank {r}");
                assert_eq!(s.kv_heads.len(), kv_each, "{name} tp={n} rank {r}");
                assert_eq!(s.ff.len(), info.n_ff / n, "{name} tp={n} rank {r}");
                assert_eq!(s.ff.start % 256, 0, "{name} tp={n} rank {r}");
                assert!(s.vocab.len() >= 128_256 / n, "{name} tp={n} rank {r}");
            }
        }
    }
    let mixtral = shape_only(
        "llama",
        &[
            ("embedding_length", 4096),
            ("block_count", 32),
            ("feed_forward_length", 14336),
            ("attention.head_count", 32),
            ("attention.head_count_kv", 8),
            ("vocab_size", 32000),
            ("expert_count", 8),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", 14336),
        ],
    );
    for n in [2usize, 4] {
        let opts = TpOptions {
            n_ranks: n,
            vocab_parallel: true,
        };
        let p = ShardPlan::for_info(&mixtral, opts, &k).expect("mixtral");
        assert!(p.ranks.iter().all(|r| r.ff_exp.len() == 14336 / n));
    }
    let qwen3_30b = shape_only(
        "qwen3moe",
        &[
            ("embedding_length", 2048),
            ("block_count", 48),
            ("feed_forward_length", 6144),
            ("attention.head_count", 32),
            ("attention.head_count_kv", 4),
            ("attention.key_length", 128),
            ("attention.value_length", 128),
            ("vocab_size", 151_936),
            ("expert_count", 128),
            ("expert_used_count", 8),
            ("expert_feed_forward_length", 768),
        ],
    );
    let opts = |n| TpOptions {
        n_ranks: n,
        vocab_parallel: true,
    };
    // Two ranks: cut at 512 (uneven, on a block), so 512 and 256 rows.
    let p = ShardPlan::for_info(&qwen3_30b, opts(2), &k).expect("qwen3-30b-a3b tp=2");
    let rows: Vec<usize> = p.ranks.iter().map(|r| r.ff_exp.len()).collect();
    assert_eq!(rows, vec![512, 256]);
    // Four ranks: a rank would get none.
    let err = ShardPlan::for_info(&qwen3_30b, opts(4), &k)
        .expect_err("768 expert rows on 256-column blocks over 4 ranks")
        .to_string();
    assert!(err.contains("expert rows") && err.contains("256"), "{err}");
    // With 32-column blocks (Q8_0) they split.
    let p = ShardPlan::for_info(&qwen3_30b, opts(4), &|_| 32).expect("q8_0 experts");
    assert!(p.ranks.iter().all(|r| r.ff_exp.len() == 192));
}

#[test]
fn plans_of_the_hybrids_real_shapes_in_k_quants() {
    // Qwen3.6-27B (16 key / 48 tiled value heads of 128; attention 24 over 4 KV heads of 256)
    // splits at 2, 4 and 8 on 256-column blocks: each rank's ssm_out columns are 3 runs of
    // its key heads' width. Qwen3-Next-80B-A3B (grouped heads, 512 experts of 512 rows)
    // splits at 2; at 4 its experts' 512 rows cannot be cut into whole Q4_K blocks (refused
    // with the way out), with Q8_0's 32-column blocks they can.
    let hybrid = |a: &str, extra: &[(&str, u32)]| {
        let mut keys = vec![
            ("ssm.conv_kernel", 4),
            ("ssm.state_size", 128),
            ("ssm.group_count", 16),
            ("full_attention_interval", 4),
            ("rope.dimension_count", 64),
            ("attention.key_length", 256),
            ("attention.value_length", 256),
        ];
        keys.extend_from_slice(extra);
        shape_only(a, &keys)
    };
    let q27 = hybrid(
        "qwen35",
        &[
            ("embedding_length", 5120),
            ("block_count", 64),
            ("feed_forward_length", 17408),
            ("attention.head_count", 24),
            ("attention.head_count_kv", 4),
            ("vocab_size", 248_320),
            ("ssm.time_step_rank", 48),
            ("ssm.inner_size", 6144),
        ],
    );
    let opts = |n| TpOptions {
        n_ranks: n,
        vocab_parallel: true,
    };
    let k = |_: &str| 256usize;
    for n in [2usize, 4, 8] {
        let p =
            ShardPlan::for_info(&q27, opts(n), &k).unwrap_or_else(|e| panic!("27b tp={n}: {e}"));
        for (r, s) in p.ranks.iter().enumerate() {
            let per = 16 / n;
            assert_eq!(s.delta_k, r * per..(r + 1) * per, "27b tp={n}");
            let v = p.delta_v(&s.delta_k);
            assert_eq!(v.len(), if n == 1 { 1 } else { 3 }, "27b tp={n}");
            assert!(v.iter().all(|x| x.start * 128 % 256 == 0 && x.len() == per));
            assert_eq!(s.q_heads.len(), 24 / n, "27b tp={n}");
        }
        let out = match p
            .placement("blk.0.ssm_out.weight", &[6144, 5120])
            .expect("ssm_out")
        {
            Placement::Split(s) => s,
            Placement::Replicated => panic!("ssm_out replicated"),
        };
        assert_eq!(out[n - 1].shape, vec![6144 / n as u64, 5120]);
    }
    let next = hybrid(
        "qwen3next",
        &[
            ("embedding_length", 2048),
            ("block_count", 48),
            ("feed_forward_length", 5120),
            ("attention.head_count", 16),
            ("attention.head_count_kv", 2),
            ("vocab_size", 151_936),
            ("ssm.time_step_rank", 32),
            ("ssm.inner_size", 4096),
            ("expert_count", 512),
            ("expert_used_count", 10),
            ("expert_feed_forward_length", 512),
            ("expert_shared_feed_forward_length", 512),
        ],
    );
    let p = ShardPlan::for_info(&next, opts(2), &k).expect("80b tp=2");
    assert_eq!(p.delta_v(&p.ranks[1].delta_k), vec![16..32]);
    assert_eq!(p.ranks[1].ff_exp, 256..512);
    let err = ShardPlan::for_info(&next, opts(4), &k)
        .expect_err("512 expert rows on 256-column blocks over 4 ranks")
        .to_string();
    assert!(err.contains("expert rows"), "{err}");
    for n in [4usize, 8] {
        let p = ShardPlan::for_info(&next, opts(n), &|_| 32).expect("80b q8_0");
        assert!(p.ranks.iter().all(|r| r.delta_k.len() == 16 / n));
    }
}
