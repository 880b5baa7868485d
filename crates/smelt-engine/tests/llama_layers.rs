//! Every op of every layer of the real models against llama.cpp's own intermediate
//! tensors: `tests/oracle/llama_dump.py` runs llama.cpp (llama-cpp-python 0.3.36, one
//! thread, no flash attention) on a prompt with an eval callback that saves each f32
//! tensor of the graph; each op of the CPU backend then gets llama.cpp's inputs and must
//! give llama.cpp's output bit for bit. A failure names the first op and layer that
//! differ, which a whole-model logit comparison cannot.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use smelt_engine::backend::cpu::{Cpu, CpuTensor};
use smelt_engine::backend::{AttnParams, AttnSeq, Backend, Glu, RopeParams};
use smelt_engine::model::ModelInfo;

/// llama.cpp's tensors for one prompt. Live, every tensor is llama.cpp's; replayed (a CPU
/// without AVX-512), only the embeddings are, the rest recorded by digest: each op is then fed
/// our own previous output, which is llama.cpp's exactly as long as every check before it
/// passed, so the first failure still names the first op that differs.
struct Dump {
    answer: smelt_oracle::Answer,
    /// Our outputs that matched a recorded digest, standing in for llama.cpp's.
    ours: HashMap<String, CpuTensor>,
    failures: Vec<String>,
}

impl Dump {
    /// llama.cpp's tensor `name` (e.g. `Qcur-3#0`) as `rows` rows.
    fn t(&self, name: &str, rows: usize) -> CpuTensor {
        let file = format!("{name}.f32");
        if let Some(data) = self.answer.file(&file).f32s() {
            let cols = data.len() / rows;
            return CpuTensor { data, rows, cols };
        }
        self.ours.get(name).cloned().unwrap_or_else(|| {
            panic!("llama.cpp's {name} was recorded by digest only and no check produced ours")
        })
    }

    /// Our `ours` must equal llama.cpp's tensor `name` bit for bit.
    fn check(&mut self, what: String, ours: &[f32], name: &str, rows: usize) {
        let out = self.answer.file(&format!("{name}.f32"));
        if let Some(theirs) = out.f32s() {
            if let Some((i, a, b, count)) = first_diff(ours, &theirs) {
                self.failures.push(format!(
                    "{what}: {count} of {} values differ, first at {i}: ours {a:e}, llama.cpp {b:e}",
                    ours.len()
                ));
            }
            return;
        }
        let bytes: Vec<u8> = ours.iter().flat_map(|v| v.to_le_bytes()).collect();
        if !out.matches(&bytes) {
            self.failures.push(format!(
                "{what}: differs from llama.cpp's recorded digest (run on an AVX-512 CPU for the values)"
            ));
        }
        let cols = ours.len() / rows;
        self.ours.insert(
            name.to_owned(),
            CpuTensor {
                data: ours.to_vec(),
                rows,
                cols,
            },
        );
    }
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
    // The prompt's ids and embeddings whole (the chain's start), every other tensor by digest.
    let answer = common::recorded(
        "llama_dump.py",
        &[path.to_str().unwrap(), prompt, dir.path().to_str().unwrap()],
        smelt_oracle::Keep::Only(&["ids.i32", "embd#0.f32", "inp_scaled#0.f32"]),
    );
    let ids: Vec<u32> = answer
        .file("ids.i32")
        .bytes()
        .expect("the prompt ids are recorded whole")
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let n = ids.len();
    let gguf = Arc::new(smelt_gguf::Gguf::open(&path).unwrap());
    let info = ModelInfo::from_gguf(&gguf).unwrap();
    let cpu = Cpu::GGML;
    let w = |name: &str| cpu.load_weight(&gguf, name).unwrap();
    let mut dump = Dump {
        answer,
        ours: HashMap::new(),
        failures: Vec::new(),
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
        let key = |name: &str, k: usize| format!("{name}-{il}#{k}");
        let p = |s: &str| format!("blk.{il}.{s}");
        let inp = if il == 0 {
            dump.t(if gemma { "inp_scaled#0" } else { "embd#0" }, n)
        } else {
            dump.t(&format!("l_out-{}#0", il - 1), n)
        };
        let mut out = cpu.alloc(0, 0);
        cpu.rms_norm(&inp, &w(&p("attn_norm.weight")), info.rms_eps, &mut out);
        dump.check(
            format!("layer {il} attn_norm"),
            &out.data,
            &key("attn_norm", 0),
            n,
        );
        let x = dump.t(&key("attn_norm", 0), n);
        let mut q = cpu.alloc(0, 0);
        let mut k = cpu.alloc(0, 0);
        let mut v = cpu.alloc(0, 0);
        cpu.matmul(&w(&p("attn_q.weight")), &x, &mut q).unwrap();
        cpu.matmul(&w(&p("attn_k.weight")), &x, &mut k).unwrap();
        cpu.matmul(&w(&p("attn_v.weight")), &x, &mut v).unwrap();
        dump.check(format!("layer {il} Q matmul"), &q.data, &key("Qcur", 0), n);
        dump.check(format!("layer {il} K matmul"), &k.data, &key("Kcur", 0), n);
        dump.check(format!("layer {il} V matmul"), &v.data, &key("Vcur", 0), n);
        let (mut q, mut k, v) = (
            dump.t(&key("Qcur", 0), n),
            dump.t(&key("Kcur", 0), n),
            dump.t(&key("Vcur", 0), n),
        );
        // Q and K as rotated: the third tensor of that name (matmul out, reshaped, roped).
        let (q_last, k_last) = (2, 2);
        if gemma {
            let mut o = cpu.alloc(0, 0);
            cpu.rms_norm(&q, &w(&p("attn_q_norm.weight")), info.rms_eps, &mut o);
            dump.check(
                format!("layer {il} q norm"),
                &o.data,
                &key("Qcur_normed", 0),
                n,
            );
            cpu.rms_norm(&k, &w(&p("attn_k_norm.weight")), info.rms_eps, &mut o);
            dump.check(
                format!("layer {il} k norm"),
                &o.data,
                &key("Kcur_normed", 0),
                n,
            );
            q = dump.t(&key("Qcur_normed", 0), n);
            k = dump.t(&key("Kcur_normed", 0), n);
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
        dump.check(
            format!("layer {il} rope q"),
            &q.data,
            &key("Qcur", q_last),
            n,
        );
        dump.check(
            format!("layer {il} rope k"),
            &k.data,
            &key("Kcur", k_last),
            n,
        );
        let mut q = dump.t(&key("Qcur", q_last), n);
        let k = dump.t(&key("Kcur", k_last), n);
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
        dump.check(
            format!("layer {il} attention"),
            &att.data,
            &key("kqv_out", 0),
            n,
        );
        let att = dump.t(&key("kqv_out", 0), n);
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
            dump.check(
                format!("layer {il} attn_output matmul + post norm"),
                &pn.data,
                &key("attn_post_norm", 0),
                n,
            );
            let mut s = dump.t(&key("attn_post_norm", 0), n);
            cpu.add(&mut s, &inp);
            dump.check(
                format!("layer {il} residual add"),
                &s.data,
                &key("sa_out", 0),
                n,
            );
            dump.t(&key("sa_out", 0), n)
        } else {
            let mut s = o;
            cpu.add(&mut s, &inp);
            dump.check(
                format!("layer {il} attn_output matmul + residual"),
                &s.data,
                &key("ffn_inp", 0),
                n,
            );
            dump.t(&key("ffn_inp", 0), n)
        };
        let mut h = cpu.alloc(0, 0);
        cpu.rms_norm(&sa_out, &w(&p("ffn_norm.weight")), info.rms_eps, &mut h);
        dump.check(
            format!("layer {il} ffn_norm"),
            &h.data,
            &key("ffn_norm", 0),
            n,
        );
        let h = dump.t(&key("ffn_norm", 0), n);
        let (mut g, mut u) = (cpu.alloc(0, 0), cpu.alloc(0, 0));
        cpu.matmul(&w(&p("ffn_gate.weight")), &h, &mut g).unwrap();
        cpu.matmul(&w(&p("ffn_up.weight")), &h, &mut u).unwrap();
        dump.check(
            format!("layer {il} gate matmul"),
            &g.data,
            &key("ffn_gate", 0),
            n,
        );
        dump.check(
            format!("layer {il} up matmul"),
            &u.data,
            &key("ffn_up", 0),
            n,
        );
        let mut g = dump.t(&key("ffn_gate", 0), n);
        let u = dump.t(&key("ffn_up", 0), n);
        let act = if gemma { Glu::Gelu } else { Glu::Silu };
        cpu.glu(&mut g, &u, act);
        let glu_name = if gemma { "ffn_geglu" } else { "ffn_swiglu" };
        dump.check(
            format!("layer {il} {glu_name}"),
            &g.data,
            &key(glu_name, 0),
            n,
        );
        let mut dn = cpu.alloc(0, 0);
        cpu.matmul(
            &w(&p("ffn_down.weight")),
            &dump.t(&key(glu_name, 0), n),
            &mut dn,
        )
        .unwrap();
        dump.check(
            format!("layer {il} down matmul"),
            &dn.data,
            &key("ffn_out", 0),
            n,
        );
        let mut l_out = if gemma {
            let mut pn = cpu.alloc(0, 0);
            cpu.rms_norm(
                &dump.t(&key("ffn_out", 0), n),
                &w(&p("post_ffw_norm.weight")),
                info.rms_eps,
                &mut pn,
            );
            dump.check(
                format!("layer {il} ffn post norm"),
                &pn.data,
                &key("ffn_post_norm", 0),
                n,
            );
            dump.t(&key("ffn_post_norm", 0), n)
        } else {
            dump.t(&key("ffn_out", 0), n)
        };
        cpu.add(&mut l_out, &sa_out);
        dump.check(
            format!("layer {il} l_out"),
            &l_out.data,
            &key("l_out", 0),
            n,
        );
    }
    assert!(dump.failures.is_empty(), "{file}: {:#?}", dump.failures);
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
