//! Every op of every layer of the real models against llama.cpp's own intermediate
//! tensors: `tests/oracle/llama_dump.py` runs llama.cpp (llama-cpp-python 0.3.36, one
//! thread, no flash attention) on a prompt with an eval callback that saves each f32
//! tensor of the graph; each op of the CPU backend then gets llama.cpp's inputs and must
//! give llama.cpp's output bit for bit. A failure names the first op and layer that
//! differ, which a whole-model logit comparison cannot.

mod common;

use std::path::Path;
use std::sync::Arc;

use smelt_engine::backend::cpu::{Cpu, CpuTensor};
use smelt_engine::backend::{AttnParams, AttnSeq, Backend, Glu, RopeParams};
use smelt_engine::model::ModelInfo;

fn load(dir: &Path, name: &str, rows: usize) -> CpuTensor {
    let bytes = std::fs::read(dir.join(format!("{name}.f32")))
        .unwrap_or_else(|e| panic!("llama.cpp tensor {name} missing: {e}"));
    let data: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let cols = data.len() / rows;
    CpuTensor { data, rows, cols }
}

/// The first index whose bits differ, with both values.
fn first_diff(ours: &[f32], theirs: &[f32]) -> Option<(usize, f32, f32, usize)> {
    assert_eq!(ours.len(), theirs.len());
    let n = ours
        .iter()
        .zip(theirs)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    ours.iter()
        .zip(theirs)
        .position(|(a, b)| a.to_bits() != b.to_bits())
        .map(|i| (i, ours[i], theirs[i], n))
}

fn check_model(file: &str, prompt: &str) {
    let path = common::model(file);
    let dir = tempfile::tempdir().unwrap();
    common::run_oracle(
        "llama_dump.py",
        &[path.to_str().unwrap(), prompt, dir.path().to_str().unwrap()],
    );
    let d = dir.path();
    let ids: Vec<u32> = std::fs::read(d.join("ids.i32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let n = ids.len();
    let gguf = Arc::new(smelt_gguf::Gguf::open(&path).unwrap());
    let info = ModelInfo::from_gguf(&gguf).unwrap();
    let cpu = Cpu;
    let w = |name: &str| cpu.load_weight(&gguf, name).unwrap();
    let mut failures = Vec::new();
    let mut check = |what: String, ours: &[f32], theirs: &CpuTensor| {
        if let Some((i, a, b, count)) = first_diff(ours, &theirs.data) {
            failures.push(format!(
                "{what}: {count} of {} values differ, first at {i}: ours {a:e}, llama.cpp {b:e}",
                ours.len()
            ));
        }
    };
    let gemma = info.embd_scale.is_some();
    let hd = info.head_dim;
    let positions: Vec<u32> = (0..n as u32).collect();
    let blocks: Vec<u32> = (0..n.div_ceil(16) as u32).collect();
    let seqs = [AttnSeq {
        row: 0,
        n_tokens: n,
        start_pos: 0,
        blocks: &blocks,
    }];
    let mut kv = cpu.kv_alloc(info.n_layer, blocks.len(), 16, info.n_head_kv * hd);
    for il in 0..info.n_layer {
        let t = |name: &str, k: usize, rows: usize| load(d, &format!("{name}-{il}#{k}"), rows);
        let p = |s: &str| format!("blk.{il}.{s}");
        let inp = if il == 0 {
            load(d, if gemma { "inp_scaled#0" } else { "embd#0" }, n)
        } else {
            load(d, &format!("l_out-{}#0", il - 1), n)
        };
        let mut out = cpu.alloc(0, 0);
        cpu.rms_norm(&inp, &w(&p("attn_norm.weight")), info.rms_eps, &mut out);
        check(
            format!("layer {il} attn_norm"),
            &out.data,
            &t("attn_norm", 0, n),
        );
        let x = t("attn_norm", 0, n);
        let mut q = cpu.alloc(0, 0);
        let mut k = cpu.alloc(0, 0);
        let mut v = cpu.alloc(0, 0);
        cpu.matmul(&w(&p("attn_q.weight")), &x, &mut q).unwrap();
        cpu.matmul(&w(&p("attn_k.weight")), &x, &mut k).unwrap();
        cpu.matmul(&w(&p("attn_v.weight")), &x, &mut v).unwrap();
        check(format!("layer {il} Q matmul"), &q.data, &t("Qcur", 0, n));
        check(format!("layer {il} K matmul"), &k.data, &t("Kcur", 0, n));
        check(format!("layer {il} V matmul"), &v.data, &t("Vcur", 0, n));
        let (mut q, mut k, v) = (t("Qcur", 0, n), t("Kcur", 0, n), t("Vcur", 0, n));
        // Q and K as rotated: the third tensor of that name (matmul out, reshaped, roped).
        let (q_last, k_last) = (2, 2);
        if gemma {
            let mut o = cpu.alloc(0, 0);
            cpu.rms_norm(&q, &w(&p("attn_q_norm.weight")), info.rms_eps, &mut o);
            check(
                format!("layer {il} q norm"),
                &o.data,
                &t("Qcur_normed", 0, n),
            );
            cpu.rms_norm(&k, &w(&p("attn_k_norm.weight")), info.rms_eps, &mut o);
            check(
                format!("layer {il} k norm"),
                &o.data,
                &t("Kcur_normed", 0, n),
            );
            q = t("Qcur_normed", 0, n);
            k = t("Kcur_normed", 0, n);
        }
        let (freq_base, freq_scale) = info.rope_for_layer(il);
        let rope = RopeParams {
            style: info.rope_style,
            n_rot: info.n_rot,
            freq_base,
            freq_scale,
        };
        cpu.rope(&mut q, &positions, hd, &rope, None);
        cpu.rope(&mut k, &positions, hd, &rope, None);
        check(format!("layer {il} rope q"), &q.data, &t("Qcur", q_last, n));
        check(format!("layer {il} rope k"), &k.data, &t("Kcur", k_last, n));
        let mut q = t("Qcur", q_last, n);
        let k = t("Kcur", k_last, n);
        if info.q_scale != 1.0 {
            cpu.scale(&mut q, info.q_scale);
        }
        cpu.kv_write(&mut kv, il, &k, &v, &seqs);
        let ap = AttnParams {
            n_head: info.n_head,
            n_head_kv: info.n_head_kv,
            head_dim: hd,
            scale: info.kq_scale,
            window: info.window_for_layer(il),
        };
        let mut att = cpu.alloc(0, 0);
        cpu.attention(&q, &kv, il, &seqs, &ap, &mut att);
        check(
            format!("layer {il} attention"),
            &att.data,
            &t("kqv_out", 0, n),
        );
        let att = t("kqv_out", 0, n);
        let mut o = cpu.alloc(0, 0);
        cpu.matmul(&w(&p("attn_output.weight")), &att, &mut o)
            .unwrap();
        // The last layer keeps only the output row from here on in llama.cpp.
        if il + 1 == info.n_layer {
            break;
        }
        let sa_out = if gemma {
            let mut pn = cpu.alloc(0, 0);
            cpu.rms_norm(
                &o,
                &w(&p("post_attention_norm.weight")),
                info.rms_eps,
                &mut pn,
            );
            check(
                format!("layer {il} attn_output matmul + post norm"),
                &pn.data,
                &t("attn_post_norm", 0, n),
            );
            let mut s = t("attn_post_norm", 0, n);
            cpu.add(&mut s, &inp);
            check(
                format!("layer {il} residual add"),
                &s.data,
                &t("sa_out", 0, n),
            );
            t("sa_out", 0, n)
        } else {
            let mut s = o;
            cpu.add(&mut s, &inp);
            check(
                format!("layer {il} attn_output matmul + residual"),
                &s.data,
                &t("ffn_inp", 0, n),
            );
            t("ffn_inp", 0, n)
        };
        let mut h = cpu.alloc(0, 0);
        cpu.rms_norm(&sa_out, &w(&p("ffn_norm.weight")), info.rms_eps, &mut h);
        check(
            format!("layer {il} ffn_norm"),
            &h.data,
            &t("ffn_norm", 0, n),
        );
        let h = t("ffn_norm", 0, n);
        let (mut g, mut u) = (cpu.alloc(0, 0), cpu.alloc(0, 0));
        cpu.matmul(&w(&p("ffn_gate.weight")), &h, &mut g).unwrap();
        cpu.matmul(&w(&p("ffn_up.weight")), &h, &mut u).unwrap();
        check(
            format!("layer {il} gate matmul"),
            &g.data,
            &t("ffn_gate", 0, n),
        );
        check(format!("layer {il} up matmul"), &u.data, &t("ffn_up", 0, n));
        let mut g = t("ffn_gate", 0, n);
        let u = t("ffn_up", 0, n);
        let act = if gemma { Glu::Gelu } else { Glu::Silu };
        cpu.glu(&mut g, &u, act);
        let glu_name = if gemma { "ffn_geglu" } else { "ffn_swiglu" };
        check(
            format!("layer {il} {glu_name}"),
            &g.data,
            &t(glu_name, 0, n),
        );
        let mut dn = cpu.alloc(0, 0);
        cpu.matmul(&w(&p("ffn_down.weight")), &t(glu_name, 0, n), &mut dn)
            .unwrap();
        check(
            format!("layer {il} down matmul"),
            &dn.data,
            &t("ffn_out", 0, n),
        );
        let mut l_out = if gemma {
            let mut pn = cpu.alloc(0, 0);
            cpu.rms_norm(
                &t("ffn_out", 0, n),
                &w(&p("post_ffw_norm.weight")),
                info.rms_eps,
                &mut pn,
            );
            check(
                format!("layer {il} ffn post norm"),
                &pn.data,
                &t("ffn_post_norm", 0, n),
            );
            t("ffn_post_norm", 0, n)
        } else {
            t("ffn_out", 0, n)
        };
        cpu.add(&mut l_out, &sa_out);
        check(format!("layer {il} l_out"), &l_out.data, &t("l_out", 0, n));
    }
    assert!(failures.is_empty(), "{file}: {failures:#?}");
}

#[test]
fn gemma3_layers_match_llama_cpp() {
    check_model(
        common::GEMMA3,
        "Translate to German: The weather is nice today.\nGerman:",
    );
}

#[test]
fn smollm2_layers_match_llama_cpp() {
    check_model(
        common::SMOLLM2,
        "Translate to German: The weather is nice today.\nGerman:",
    );
}
