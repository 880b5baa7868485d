//! A batch of sequences at different positions in one forward call gives each sequence
//! what it gets alone, and freeing sequences returns their KV blocks.

mod common;

use smelt_engine::{Engine, EngineError, EngineOptions, Logits, SeqInput};

fn engine(kv_tokens: usize) -> Engine {
    let opts = EngineOptions {
        threads: Some(2),
        kv_tokens,
        block_size: 16,
        ..EngineOptions::default()
    };
    Engine::load(&common::model(common::SMOLLM2), &opts).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn batched_sequences_equal_their_single_runs() {
    let prompts: [Vec<u32>; 4] = [
        (1..=37).collect(),
        vec![504, 3458, 282, 4649, 314],
        (100..117).collect(),
        vec![42],
    ];
    let follow: [Vec<u32>; 4] = [vec![7, 8], vec![9], vec![10, 11, 12], vec![13]];

    // Alone: prompt, then the follow-up tokens with all their logits.
    let mut single = engine(1024);
    let mut want = Vec::new();
    for (p, f) in prompts.iter().zip(&follow) {
        let s = single.new_sequence();
        let a = single
            .forward(&[SeqInput {
                seq: s,
                tokens: p.clone(),
                logits: Logits::Last,
            }])
            .unwrap();
        let b = single
            .forward(&[SeqInput {
                seq: s,
                tokens: f.clone(),
                logits: Logits::All,
            }])
            .unwrap();
        want.push((a[0][0].clone(), b[0].clone()));
        single.free_sequence(s);
    }

    // Together: all prompts in one call, then all follow-ups (different positions) in one.
    let mut e = engine(1024);
    let free0 = e.free_blocks();
    let seqs: Vec<_> = prompts.iter().map(|_| e.new_sequence()).collect();
    let batch: Vec<_> = seqs
        .iter()
        .zip(&prompts)
        .map(|(&seq, p)| SeqInput {
            seq,
            tokens: p.clone(),
            logits: Logits::Last,
        })
        .collect();
    let got = e.forward(&batch).unwrap();
    let batch: Vec<_> = seqs
        .iter()
        .zip(&follow)
        .map(|(&seq, f)| SeqInput {
            seq,
            tokens: f.clone(),
            logits: Logits::All,
        })
        .collect();
    let got2 = e.forward(&batch).unwrap();
    for i in 0..prompts.len() {
        assert_eq!(got[i].len(), 1);
        assert_eq!(got2[i].len(), follow[i].len());
        // Same numbers: rows are computed independently of their batch neighbours.
        assert_eq!(max_diff(&got[i][0], &want[i].0), 0.0, "sequence {i} prompt");
        for (r, w) in got2[i].iter().zip(&want[i].1) {
            assert_eq!(max_diff(r, w), 0.0, "sequence {i} follow-up");
        }
        assert_eq!(e.seq_len(seqs[i]), prompts[i].len() + follow[i].len());
    }
    // 39 + 6 + 20 + 2 tokens in blocks of 16: 3 + 1 + 2 + 1 blocks.
    assert_eq!(free0 - e.free_blocks(), 7);
    for &s in &seqs {
        e.free_sequence(s);
    }
    assert_eq!(e.free_blocks(), free0);
    assert!(matches!(
        e.forward(&[SeqInput {
            seq: seqs[0],
            tokens: vec![1],
            logits: Logits::Last
        }]),
        Err(EngineError::UnknownSequence(_))
    ));
}

#[test]
fn full_cache_is_an_error_not_a_panic() {
    let mut e = engine(64);
    let a = e.new_sequence();
    let b = e.new_sequence();
    e.forward(&[SeqInput {
        seq: a,
        tokens: vec![1; 48],
        logits: Logits::None,
    }])
    .unwrap();
    let err = e
        .forward(&[SeqInput {
            seq: b,
            tokens: vec![1; 17],
            logits: Logits::Last,
        }])
        .unwrap_err();
    assert!(
        matches!(err, EngineError::OutOfKvBlocks { need: 2, free: 1 }),
        "{err}"
    );
    assert_eq!(e.seq_len(b), 0);
    e.free_sequence(a);
    e.forward(&[SeqInput {
        seq: b,
        tokens: vec![1; 17],
        logits: Logits::Last,
    }])
    .unwrap();
    let bad = e.forward(&[SeqInput {
        seq: b,
        tokens: vec![1_000_000],
        logits: Logits::Last,
    }]);
    assert!(matches!(bad, Err(EngineError::BadToken { .. })));
    assert_eq!(e.seq_len(b), 17);
}

/// The greedy step gives, per sequence, the argmax of the logits the plain step gives
/// (`None` where no logits were asked for), and refuses `Logits::All`.
#[test]
fn greedy_steps_give_the_argmax_of_the_logits() {
    let mut plain = engine(512);
    let mut greedy = engine(512);
    let prompts: [Vec<u32>; 3] = [(1..=21).collect(), vec![504, 3458, 282], vec![42]];
    let wants = [Logits::Last, Logits::None, Logits::Last];
    let mk = |e: &mut Engine| -> Vec<_> { prompts.iter().map(|_| e.new_sequence()).collect() };
    let (sp, sg) = (mk(&mut plain), mk(&mut greedy));
    let batch = |seqs: &[smelt_engine::SeqId], toks: &[Vec<u32>]| -> Vec<SeqInput> {
        seqs.iter()
            .zip(toks)
            .zip(wants)
            .map(|((&seq, t), logits)| SeqInput {
                seq,
                tokens: t.clone(),
                logits,
            })
            .collect()
    };
    let mut toks: Vec<Vec<u32>> = prompts.to_vec();
    for _step in 0..4 {
        let rows = plain.forward(&batch(&sp, &toks)).unwrap();
        let picks = greedy.forward_greedy(&batch(&sg, &toks)).unwrap();
        for (i, (r, p)) in rows.iter().zip(&picks).enumerate() {
            let want = r.last().map(|row| smelt_engine::argmax(row));
            assert_eq!(*p, want, "sequence {i}");
        }
        // Every sequence goes on with one token (the greedy one where there is one).
        toks = picks.iter().map(|p| vec![p.unwrap_or(7)]).collect();
    }
    let all = [SeqInput {
        seq: sg[0],
        tokens: vec![1],
        logits: Logits::All,
    }];
    assert!(matches!(
        greedy.forward_greedy(&all),
        Err(EngineError::BadOptions(_))
    ));
}

/// `batch_invariant` on the CPU: a sequence's rows have the same bits whether its prompt
/// comes whole, one token at a time, or beside other sequences' prompts in one step, on a
/// model whose Q4_K, Q6_K and attention rows otherwise take ggml's batch orders (which is
/// checked too: without the switch, the whole prompt and the token-by-token one differ).
#[test]
fn batch_invariant_rows_do_not_depend_on_the_step() {
    let load = |invariant: bool| {
        let opts = EngineOptions {
            threads: Some(2),
            kv_tokens: 512,
            block_size: 16,
            batch_invariant: invariant,
            ..EngineOptions::default()
        };
        Engine::load(&common::model(common::GEMMA3), &opts).unwrap()
    };
    let prompt: Vec<u32> = vec![
        2, 818, 5279, 529, 7001, 563, 9079, 236764, 532, 1041, 8732, 236761,
    ];
    let others: [Vec<u32>; 3] = [
        (300..317).collect(),
        vec![2, 90, 91],
        (1000..1009).collect(),
    ];
    let whole = |e: &mut Engine| {
        let s = e.new_sequence();
        let rows = e
            .forward(&[SeqInput {
                seq: s,
                tokens: prompt.clone(),
                logits: Logits::All,
            }])
            .unwrap()
            .remove(0);
        e.free_sequence(s);
        rows
    };
    let one_by_one = |e: &mut Engine| {
        let s = e.new_sequence();
        let rows: Vec<Vec<f32>> = prompt
            .iter()
            .map(|&t| {
                e.forward(&[SeqInput {
                    seq: s,
                    tokens: vec![t],
                    logits: Logits::Last,
                }])
                .unwrap()
                .remove(0)
                .remove(0)
            })
            .collect();
        e.free_sequence(s);
        rows
    };
    let mut e = load(true);
    let want = whole(&mut e);
    assert_eq!(want.len(), prompt.len());
    assert!(one_by_one(&mut e) == want, "token by token differs");
    let seqs: Vec<_> = (0..4).map(|_| e.new_sequence()).collect();
    let batch: Vec<SeqInput> = std::iter::once(&prompt)
        .chain(&others)
        .zip(&seqs)
        .map(|(p, &seq)| SeqInput {
            seq,
            tokens: p.clone(),
            logits: Logits::All,
        })
        .collect();
    let got = e.forward(&batch).unwrap();
    assert!(got[0] == want, "beside three other prompts differs");
    for s in seqs {
        e.free_sequence(s);
    }
    // llama.cpp's orders (the default) are not invariant on this model.
    let mut g = load(false);
    assert!(
        whole(&mut g) != one_by_one(&mut g),
        "the ggml orders agreed here"
    );
}
