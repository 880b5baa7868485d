//! Tensor parallelism for the hybrids (Qwen3.5 `qwen35`, Qwen3.5-MoE `qwen35moe`, Qwen3-Next
//! `qwen3next` in both tensor layouts) on the CPU: tiny random models written here, split
//! over 2 and 4 simulated ranks (delta-net heads, their recurrent state, attention heads and
//! experts divided), against the whole model: the same greedy tokens for 32 steps after a
//! short prompt and after one long enough for two chunks of the delta rule's prompt form,
//! logits within float tolerance; each rank's state made with its sequence and dropped with
//! it; and the plan's placement of every delta-net tensor, and its refusals.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use smelt_engine::tp::{CpuTp, Placement, ShardPlan, TpOptions};
use smelt_engine::{Device, Engine, EngineOptions, Logits, SeqId, SeqInput};
use smelt_gguf::{Array, GgmlType, Gguf, Metadata, Value};

mod common;

/// A tiny hybrid: layers `delta, delta, attention` (repeated), attention of 4 query over 2
/// KV heads of 64 with a gate, delta-net heads of 32.
#[derive(Clone, Copy)]
struct Hybrid {
    arch: &'static str,
    n_layer: usize,
    n_k: usize,
    n_v: usize,
    /// Type of the big matrices (norms, the convolution, routers stay f32).
    ty: GgmlType,
    /// (experts, used, expert rows, shared-expert rows).
    moe: Option<(usize, usize, usize, usize)>,
    /// Qwen3-Next's fused `ssm_in` / `ssm_ba` (older converters) instead of the split ones.
    fused: bool,
    /// The experts' gate and up in one `ffn_gate_up_exps` (Qwen3.5-MoE files).
    gate_up: bool,
}

const E: usize = 256;
const VOCAB: usize = 97;
const HEADS: usize = 4;
const KV: usize = 2;
const HD: usize = 64;
const DH: usize = 32;

fn qwen35(ty: GgmlType) -> Hybrid {
    Hybrid {
        arch: "qwen35",
        n_layer: 3,
        n_k: 4,
        n_v: 8,
        ty,
        moe: None,
        fused: false,
        gate_up: false,
    }
}

fn qwen35moe(ty: GgmlType) -> Hybrid {
    Hybrid {
        arch: "qwen35moe",
        moe: Some((8, 2, 128, 128)),
        gate_up: true,
        ..qwen35(ty)
    }
}

fn qwen3next(ty: GgmlType, fused: bool) -> Hybrid {
    Hybrid {
        arch: "qwen3next",
        moe: Some((8, 2, 128, 128)),
        fused,
        ..qwen35(ty)
    }
}

/// Writes `s` with random weights to memory.
fn tiny(s: &Hybrid, seed: u64) -> Gguf {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let a = s.arch;
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String(a.into()));
    let u = |v: usize| Value::U32(v as u32);
    for (k, v) in [
        ("embedding_length", E),
        ("block_count", s.n_layer),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV),
        ("attention.key_length", HD),
        ("attention.value_length", HD),
        ("feed_forward_length", 512),
        ("context_length", 4096),
        ("rope.dimension_count", 32),
        ("full_attention_interval", 3),
        ("ssm.conv_kernel", 4),
        ("ssm.state_size", DH),
        ("ssm.group_count", s.n_k),
        ("ssm.time_step_rank", s.n_v),
        ("ssm.inner_size", s.n_v * DH),
    ] {
        m.insert(format!("{a}.{k}"), u(v));
    }
    m.insert(format!("{a}.rope.freq_base"), Value::F32(1e7));
    m.insert(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-6),
    );
    if a != "qwen3next" {
        m.insert(
            format!("{a}.rope.dimension_sections"),
            Value::Array(Array::I32(vec![6, 5, 5, 0])),
        );
    }
    if let Some((ne, k, ff, sh)) = s.moe {
        m.insert(format!("{a}.expert_count"), u(ne));
        m.insert(format!("{a}.expert_used_count"), u(k));
        m.insert(format!("{a}.expert_feed_forward_length"), u(ff));
        m.insert(format!("{a}.expert_shared_feed_forward_length"), u(sh));
    }
    let (e, v) = (E as u64, VOCAB as u64);
    let (q, kv) = ((HEADS * HD) as u64, (KV * HD) as u64);
    let (kd, vd, hv) = ((s.n_k * DH) as u64, (s.n_v * DH) as u64, s.n_v as u64);
    // (name, shape, quantized?)
    let mut t: Vec<(String, Vec<u64>, bool)> = vec![
        ("token_embd.weight".into(), vec![e, v], false),
        ("output_norm.weight".into(), vec![e], false),
        ("output.weight".into(), vec![e, v], true),
    ];
    for il in 0..s.n_layer {
        let mut p =
            |n: &str, shape: Vec<u64>, quant: bool| t.push((format!("blk.{il}.{n}"), shape, quant));
        p("attn_norm.weight", vec![e], false);
        p("post_attention_norm.weight", vec![e], false);
        if (il + 1) % 3 != 0 {
            if s.fused {
                p("ssm_in.weight", vec![e, 2 * kd + 2 * vd], true);
                p("ssm_ba.weight", vec![e, 2 * hv], false);
            } else {
                p("attn_qkv.weight", vec![e, 2 * kd + vd], true);
                p("attn_gate.weight", vec![e, vd], true);
                if a == "qwen3next" {
                    p("ssm_ba.weight", vec![e, 2 * hv], false);
                } else {
                    p("ssm_beta.weight", vec![e, hv], false);
                    p("ssm_alpha.weight", vec![e, hv], false);
                }
            }
            p("ssm_conv1d.weight", vec![4, 2 * kd + vd], false);
            p("ssm_dt.bias", vec![hv], false);
            p("ssm_a", vec![hv], false);
            p("ssm_norm.weight", vec![DH as u64], false);
            p("ssm_out.weight", vec![vd, e], true);
        } else {
            p("attn_q.weight", vec![e, 2 * q], true);
            p("attn_k.weight", vec![e, kv], true);
            p("attn_v.weight", vec![e, kv], true);
            p("attn_output.weight", vec![q, e], true);
            p("attn_q_norm.weight", vec![HD as u64], false);
            p("attn_k_norm.weight", vec![HD as u64], false);
        }
        match s.moe {
            None => {
                p("ffn_gate.weight", vec![e, 512], true);
                p("ffn_up.weight", vec![e, 512], true);
                p("ffn_down.weight", vec![512, e], true);
            }
            Some((ne, _, ff, sh)) => {
                let (ne, ff, sh) = (ne as u64, ff as u64, sh as u64);
                p("ffn_gate_inp.weight", vec![e, ne], false);
                if s.gate_up {
                    p("ffn_gate_up_exps.weight", vec![e, 2 * ff, ne], true);
                } else {
                    p("ffn_gate_exps.weight", vec![e, ff, ne], true);
                    p("ffn_up_exps.weight", vec![e, ff, ne], true);
                }
                p("ffn_down_exps.weight", vec![ff, e, ne], true);
                p("ffn_gate_inp_shexp.weight", vec![e], false);
                p("ffn_gate_shexp.weight", vec![e, sh], true);
                p("ffn_up_shexp.weight", vec![e, sh], true);
                p("ffn_down_shexp.weight", vec![sh, e], true);
            }
        }
    }
    common::tiny_gguf(&m, &t, s.ty, |spec, row| {
        let rows: usize = spec.shape.iter().skip(1).product::<u64>() as usize;
        let name = spec.name.as_str();
        (0..row * rows)
            .map(|_| {
                let x: f32 = rng.gen_range(-1.0..1.0);
                if name.ends_with(".ssm_a") {
                    // -exp(A_log): the state decays.
                    -(0.05 + 0.5 * x.abs())
                } else if name.ends_with(".bias") {
                    0.5 * x
                } else if spec.shape.len() == 1 && name.contains("norm") {
                    1.0 + 0.2 * x
                } else {
                    x * 1.7 / (row as f32).sqrt()
                }
            })
            .collect()
    })
}

const STEPS: usize = 32;

/// A short prompt (recurrent form after it) and one of 100 tokens (the chunked form: two
/// chunks of 64).
fn prompts() -> [Vec<u32>; 2] {
    [
        vec![1, 5, 9, 33, 2, 71, 40, 8],
        (0..100u32).map(|i| (i * 37 + 11) % VOCAB as u32).collect(),
    ]
}

/// Greedy tokens of each prompt (two sequences decoding side by side in one batch, so each
/// rank keeps two states), and the logits each token was chosen from.
fn greedy(e: &mut Engine) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let ps = prompts();
    let ids: Vec<SeqId> = ps.iter().map(|_| e.new_sequence()).collect();
    let batch = |toks: &[Vec<u32>]| -> Vec<SeqInput> {
        ids.iter()
            .zip(toks)
            .map(|(&seq, t)| SeqInput {
                seq,
                tokens: t.clone(),
                logits: Logits::Last,
            })
            .collect()
    };
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![Default::default(); ps.len()];
    let mut rows = e.forward(&batch(&ps)).expect("prompts");
    for _ in 0..STEPS {
        let next: Vec<Vec<u32>> = rows
            .iter_mut()
            .zip(&mut out)
            .map(|(r, (toks, ls))| {
                let l = r.remove(0);
                let t = smelt_engine::argmax(&l);
                toks.push(t);
                ls.push(l);
                vec![t]
            })
            .collect();
        rows = e.forward(&batch(&next)).expect("decode");
    }
    for id in ids {
        e.free_sequence(id);
    }
    out
}

/// `--device cpu --tp n` against the whole model: the same tokens, logits within `rel` of
/// their scale (reordered sums: ~1e-6 in f32; a q8 activation rounding step in Q8_0).
fn same_as_whole(s: Hybrid, ranks: &[usize], rel: f32) {
    let g = Arc::new(tiny(&s, 5));
    let opts = EngineOptions {
        kv_tokens: 512,
        ..EngineOptions::default()
    };
    let mut whole = Engine::from_gguf(g.clone(), &opts).expect("load");
    let want = greedy(&mut whole);
    for &n in ranks {
        let what = format!("{} {:?} fused={} tp={n}", s.arch, s.ty, s.fused);
        let mut tp =
            Engine::from_gguf_tp(g.clone(), &opts, &vec![Device::Cpu; n]).expect("tp load");
        assert!(!tp.prefix_cache_on(), "{what}: prefix cache on a hybrid");
        let got = greedy(&mut tp);
        let mut worst = 0f32;
        for (p, ((wt, wl), (gt, gl))) in want.iter().zip(&got).enumerate() {
            let div = wt.iter().zip(gt).position(|(a, b)| a != b);
            for (i, (a, b)) in wl.iter().zip(gl).enumerate() {
                let scale = a.iter().fold(1f32, |m, x| m.max(x.abs()));
                let d = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                if div.is_some_and(|d| i > d) {
                    break;
                }
                worst = worst.max(d / scale);
                let ta = wt[i] as usize;
                let gap = a[ta] - a[gt[i] as usize];
                assert!(
                    d <= rel * scale,
                    "{what}: prompt {p} step {i}: logits differ by {d} (scale {scale}); \
                     first token difference {div:?}, lead there {gap}"
                );
            }
            assert_eq!(div, None, "{what}: prompt {p}: tokens differ");
        }
        eprintln!("{what}: {STEPS} tokens equal, worst logit difference {worst:.1e} of the scale");
    }
}

#[test]
fn qwen35_tp_generates_what_the_whole_model_does() {
    // 4 key heads over 8 tiled value heads: 2 key heads a rank at tp=2 (value heads 0,1,4,5
    // and 2,3,6,7), one at tp=4. Attention's 2 KV heads: replicated at tp=4.
    same_as_whole(qwen35(GgmlType::F32), &[1, 2, 4], 1e-4);
    same_as_whole(qwen35(GgmlType::Q8_0), &[2], 2e-2);
}

#[test]
fn qwen35moe_tp_generates_what_the_whole_model_does() {
    same_as_whole(qwen35moe(GgmlType::F32), &[2, 4], 1e-4);
}

#[test]
fn qwen3next_tp_generates_what_the_whole_model_does() {
    // Grouped value heads, split layout, then the fused `ssm_in`/`ssm_ba` one.
    same_as_whole(qwen3next(GgmlType::F32, false), &[2, 4], 1e-4);
    same_as_whole(qwen3next(GgmlType::Q8_0, true), &[2], 2e-2);
}

#[test]
fn each_rank_keeps_a_state_per_sequence_for_its_heads_and_drops_it_with_the_sequence() {
    let g = tiny(&qwen35(GgmlType::F32), 2);
    let opts = TpOptions {
        n_ranks: 2,
        vocab_parallel: true,
    };
    let mut tp = CpuTp::load(&g, opts, 16, 16).expect("tp load");
    // Rank r's model has its own heads: 2 key, 4 value heads.
    for r in 0..2 {
        let d = tp.rank_model(r).info.delta.clone().expect("delta");
        assert_eq!((d.n_k_heads, d.n_v_heads), (2, 4), "rank {r}");
    }
    let blocks: Vec<u32> = (0..8).collect();
    let blocks2: Vec<u32> = (8..16).collect();
    let seqs = [
        smelt_engine::backend::AttnSeq {
            row: 0,
            n_tokens: 3,
            start_pos: 0,
            blocks: &blocks,
        },
        smelt_engine::backend::AttnSeq {
            row: 3,
            n_tokens: 2,
            start_pos: 0,
            blocks: &blocks2,
        },
    ];
    let ids = [SeqId(7), SeqId(9)];
    tp.forward_seqs(&ids, &[1, 2, 3, 4, 5], &[0, 1, 2, 0, 1], &seqs, &[2, 4])
        .expect("step");
    assert_eq!((tp.n_states(0), tp.n_states(1)), (2, 2));
    tp.free_state(SeqId(7));
    assert_eq!((tp.n_states(0), tp.n_states(1)), (1, 1));
    // Ids and sequences must pair up.
    assert!(tp
        .forward_seqs(&ids[..1], &[1, 2, 3, 4, 5], &[0, 1, 2, 0, 1], &seqs, &[4])
        .is_err());
}

fn split(plan: &ShardPlan, g: &Gguf, name: &str) -> Vec<smelt_engine::tp::Slice> {
    let t = g.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    match plan.placement(name, &t.shape).expect(name) {
        Placement::Split(s) => s,
        Placement::Replicated => panic!("{name} replicated"),
    }
}

#[test]
#[allow(clippy::single_range_in_vec_init)]
fn plan_places_every_delta_net_tensor() {
    let opts = |n| TpOptions {
        n_ranks: n,
        vocab_parallel: false,
    };
    // Qwen3.5 (tiled: value head h reads key head h % 4), 4 key and 8 value heads of 32.
    let g = tiny(&qwen35(GgmlType::Q8_0), 1);
    let plan = ShardPlan::new(&g, opts(2)).expect("plan");
    assert_eq!(plan.ranks[1].delta_k, 2..4);
    assert_eq!(plan.delta_v(&plan.ranks[1].delta_k), vec![2..4, 6..8]);
    let qkv = split(&plan, &g, "blk.0.attn_qkv.weight");
    // q heads 2,3 | k heads 2,3 | v heads 2,3 and 6,7 (channels of 32).
    assert_eq!(qkv[1].rows, vec![64..128, 192..256, 320..384, 448..512]);
    assert_eq!(qkv[1].shape, vec![256, 256]);
    assert_eq!(
        split(&plan, &g, "blk.0.ssm_conv1d.weight")[1].rows,
        qkv[1].rows
    );
    assert_eq!(
        split(&plan, &g, "blk.1.attn_gate.weight")[1].rows,
        vec![64..128, 192..256]
    );
    for name in [
        "blk.0.ssm_beta.weight",
        "blk.0.ssm_alpha.weight",
        "blk.0.ssm_a",
    ] {
        assert_eq!(split(&plan, &g, name)[1].rows, vec![2..4, 6..8], "{name}");
    }
    assert_eq!(
        split(&plan, &g, "blk.0.ssm_dt.bias")[0].rows,
        vec![0..2, 4..6]
    );
    // ssm_out: row-parallel over the value heads' columns, two runs side by side.
    let out = split(&plan, &g, "blk.0.ssm_out.weight");
    assert_eq!(out[1].cols, Some(vec![64..128, 192..256]));
    assert_eq!(out[1].shape, vec![128, 256]);
    for name in ["blk.0.ssm_norm.weight", "blk.0.post_attention_norm.weight"] {
        let t = g.tensor(name).expect(name);
        assert_eq!(
            plan.placement(name, &t.shape).expect(name),
            Placement::Replicated,
            "{name}"
        );
    }
    // The rank's file: its head counts, and its tensors' shapes.
    let r1 = smelt_engine::tp::rank_gguf(&g, &plan, 1).expect("rank file");
    let md = r1.metadata();
    assert_eq!(md.get_u64("qwen35.ssm.group_count"), Some(2));
    assert_eq!(md.get_u64("qwen35.ssm.time_step_rank"), Some(4));
    assert_eq!(md.get_u64("qwen35.ssm.inner_size"), Some(128));
    assert_eq!(
        r1.tensor("blk.0.ssm_out.weight").expect("out").shape,
        vec![128, 256]
    );

    // Qwen3.5-MoE's fused expert gate|up: each expert's rank rows of gate, then of up.
    let g = tiny(&qwen35moe(GgmlType::Q8_0), 1);
    let plan = ShardPlan::new(&g, opts(2)).expect("plan");
    let gu = split(&plan, &g, "blk.0.ffn_gate_up_exps.weight");
    assert_eq!(gu[1].rows.len(), 16);
    assert_eq!(&gu[1].rows[..4], &[64..128, 192..256, 320..384, 448..512]);
    assert_eq!(gu[1].shape, vec![256, 128, 8]);
    // Qwen3-Next fused (grouped: key head g's value heads are 2g, 2g+1): `ssm_in` rows are
    // whole key-head groups [q, k, v v, z z] of 32 each, `ssm_ba`'s [b b, a a].
    let g = tiny(&qwen3next(GgmlType::Q8_0, true), 1);
    let plan = ShardPlan::new(&g, opts(4)).expect("plan");
    assert_eq!(plan.delta_v(&plan.ranks[3].delta_k), vec![6..8]);
    assert_eq!(
        split(&plan, &g, "blk.0.ssm_in.weight")[3].rows,
        vec![576..768]
    );
    assert_eq!(
        split(&plan, &g, "blk.0.ssm_ba.weight")[3].rows,
        vec![12..16]
    );
    assert_eq!(
        split(&plan, &g, "blk.0.ssm_out.weight")[3].cols,
        Some(vec![192..256])
    );
    // Shared expert rows and columns.
    assert_eq!(
        split(&plan, &g, "blk.0.ffn_up_shexp.weight")[1].rows,
        vec![32..64]
    );
    assert_eq!(
        split(&plan, &g, "blk.0.ffn_down_shexp.weight")[1].cols,
        Some(vec![32..64])
    );
}

#[test]
fn a_tp_that_cannot_split_the_delta_net_heads_is_refused_with_the_reason() {
    let opts = |n| TpOptions {
        n_ranks: n,
        vocab_parallel: false,
    };
    // 4 key heads: 8 ranks would leave some without one.
    let g = Arc::new(tiny(&qwen35(GgmlType::F32), 1));
    let msg = ShardPlan::new(&g, opts(8))
        .expect_err("8 ranks")
        .to_string();
    assert!(
        msg.contains(
            "--tp 8 cannot split this model's delta-net heads (4 key heads, 8 value heads of 32)"
        ) && msg.contains("more ranks than key heads"),
        "{msg}"
    );
    // The engine says the same, before any rank loads.
    let err = Engine::from_gguf_tp(g, &EngineOptions::default(), &[Device::Cpu; 8])
        .err()
        .expect("refused");
    assert!(err.to_string().contains("delta-net heads"), "{err}");
    // Q4_K ssm_out (256-column blocks) over tiled value heads 128 columns apart: no cut
    // keeps whole blocks at 2 ranks.
    let g = tiny(&qwen35(GgmlType::Q4_K), 1);
    let msg = ShardPlan::new(&g, opts(2))
        .expect_err("q4_k cut")
        .to_string();
    assert!(msg.contains("256-column blocks"), "{msg}");
    // One rank takes everything.
    ShardPlan::new(&g, opts(1)).expect("one rank");
}
