//! Sampler tests.

use super::*;

fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        ..SamplerConfig::greedy()
    }
}

/// Deterministic pseudo-random logits in [-5, 5).
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random::<f32>() * 10.0 - 5.0).collect()
}

/// The first index holding the largest non-NaN value (0 when all are NaN), one element
/// at a time: what [`argmax`] must equal.
fn argmax_one_pass(logits: &[f32]) -> u32 {
    let mut best = (0, f32::NAN);
    for (i, &v) in logits.iter().enumerate() {
        if v > best.1 || (best.1.is_nan() && !v.is_nan()) {
            best = (i, v);
        }
    }
    best.0 as u32
}

/// Random lengths across the lanes' block boundaries, values drawn from a few levels (many
/// ties), NaNs and infinities sprinkled in, the maximum placed anywhere.
#[test]
fn argmax_equals_the_one_pass_reference() {
    let mut rng = StdRng::seed_from_u64(7);
    let levels = [
        f32::NEG_INFINITY,
        -3.0,
        -0.0,
        0.0,
        1.5,
        2.0,
        f32::INFINITY,
        f32::NAN,
    ];
    for n in (1..300).chain([4096, 4097, 128_256]) {
        for _ in 0..4 {
            let top = rng.random_range(2..=levels.len());
            let l: Vec<f32> = (0..n).map(|_| levels[rng.random_range(0..top)]).collect();
            assert_eq!(argmax(&l), argmax_one_pass(&l), "n={n}: {l:?}");
        }
    }
}

#[test]
fn argmax_ties_and_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 1.0]), 1);
    assert_eq!(argmax(&[-1.0, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY, -1e30]), 2);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
    assert_eq!(argmax(&[-0.0, 0.0]), 0);
    assert_eq!(argmax(&[0.0, -0.0]), 0);
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(s.sample(&[0.5, 2.0, 2.0, f32::NAN], &[]), 1);
}

#[test]
fn greedy_with_penalties_breaks_ties_low() {
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 1.5,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    assert_eq!(s.sample(&[1.0, 4.0, 4.0, f32::NAN], &[0]), 1);
}

#[test]
fn sampling_the_top_equals_sampling_the_row() {
    for seed in 0..30 {
        let l = logits(5000, seed);
        let mut ranked: Vec<(u32, f32)> =
            l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(64);
        for (t, k) in [(0.0, 0), (0.8, 40), (1.3, 64), (0.7, 1)] {
            let c = SamplerConfig {
                seed,
                ..cfg(t, k, 0.9, 0.05)
            };
            let (mut full, mut top) = (Sampler::new(c.clone()).unwrap(), Sampler::new(c).unwrap());
            assert!(top.needs_only_top(64));
            for _ in 0..5 {
                assert_eq!(top.sample_top(&ranked), full.sample(&l, &[]), "t {t} k {k}");
            }
        }
    }
    let mut no_k = Sampler::new(cfg(0.8, 0, 0.9, 0.0)).unwrap();
    assert!(!no_k.needs_only_top(64), "top-k off: the whole row matters");
    assert_eq!(no_k.sample_top(&[(u32::MAX, f32::NEG_INFINITY)]), 0);
    let pen = Sampler::new(SamplerConfig {
        repeat_penalty: 1.1,
        ..cfg(0.0, 40, 1.0, 0.0)
    })
    .unwrap();
    assert!(!pen.needs_only_top(64), "penalties reorder the row");
}

#[test]
fn top_k_one_equals_greedy() {
    for seed in 0..20 {
        let l = logits(1000, seed);
        let mut s = Sampler::new(SamplerConfig {
            seed,
            ..cfg(1.5, 1, 1.0, 0.0)
        })
        .unwrap();
        assert_eq!(s.sample(&l, &[]), argmax(&l));
    }
}

#[test]
fn top_k_restricts_to_best_k() {
    let l = logits(500, 7);
    let mut sorted: Vec<u32> = (0..500).collect();
    sorted.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
    let allowed = &sorted[..5];
    let mut s = Sampler::new(cfg(5.0, 5, 1.0, 0.0)).unwrap();
    for _ in 0..500 {
        assert!(allowed.contains(&s.sample(&l, &[])));
    }
}

#[test]
fn tiny_top_p_keeps_only_best() {
    let l = logits(2000, 3);
    let mut s = Sampler::new(cfg(2.0, 0, 1e-6, 0.0)).unwrap();
    for _ in 0..200 {
        assert_eq!(s.sample(&l, &[]), argmax(&l));
    }
}

#[test]
fn top_p_keeps_the_nucleus() {
    // Probabilities 0.5, 0.25, 0.125, 0.125: top-p 0.7 keeps the first two only.
    let l = [2f32.ln() * 2.0, 2f32.ln(), 0.0, 0.0];
    let mut s = Sampler::new(cfg(1.0, 0, 0.7, 0.0)).unwrap();
    let mut seen = [0usize; 4];
    for _ in 0..2000 {
        seen[s.sample(&l, &[]) as usize] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
}

#[test]
fn min_p_filters() {
    // Relative probabilities 1, 0.5, 0.05, 0.01: min-p 0.1 keeps ids 0 and 1.
    let l = [0.0, 0.5f32.ln(), 0.05f32.ln(), 0.01f32.ln()];
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.1)).unwrap();
    let mut seen = [0usize; 4];
    for _ in 0..3000 {
        seen[s.sample(&l, &[]) as usize] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
    // min-p 1 keeps only the best.
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0)).unwrap();
    for _ in 0..200 {
        assert_eq!(s.sample(&l, &[]), 0);
    }
}

#[test]
fn repetition_penalty_changes_greedy_choice() {
    let l = [2.0, 1.9, -1.0, -1.05];
    let mut plain = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(plain.sample(&l, &[0]), 0);
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 1.1,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    // 2.0 / 1.1 = 1.82 < 1.9.
    assert_eq!(s.sample(&l, &[0]), 1);
    // Outside the window the penalty does not apply.
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 1.1,
        repeat_last_n: 2,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    assert_eq!(s.sample(&l, &[0, 3, 3]), 0);
    // Negative logits are multiplied: -1.0 * 1.1 = -1.1 < -1.05.
    let neg = [-1.0, -1.05];
    assert_eq!(s.sample(&neg, &[0]), 1);
}

#[test]
fn presence_and_frequency_penalties() {
    let l = [1.0, 0.8, 0.5];
    let mut s = Sampler::new(SamplerConfig {
        presence_penalty: 0.3,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    assert_eq!(s.sample(&l, &[0, 0, 0]), 1);
    let mut s = Sampler::new(SamplerConfig {
        frequency_penalty: 0.2,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    // Id 0 twice: 0.6 < 0.8. Ids 0 three times and 1 twice: 0.4 and 0.4 < 0.5.
    assert_eq!(s.sample(&l, &[0, 0]), 1);
    assert_eq!(s.sample(&l, &[0, 0, 0, 1, 1]), 2);
}

#[test]
fn same_seed_same_tokens_different_seed_differs() {
    let l = logits(300, 11);
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig {
            seed,
            top_k: 0,
            min_p: 0.0,
            temperature: 2.0,
            ..SamplerConfig::default()
        })
        .unwrap();
        let mut history = Vec::new();
        for _ in 0..200 {
            let t = s.sample(&l, &history);
            history.push(t);
        }
        history
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn frequencies_follow_softmax_at_temperature_one() {
    let l = [1.0f32, 0.0, -0.5, 2.0, 0.3];
    let max = 2.0f32;
    let z: f64 = l.iter().map(|&x| f64::from(x - max).exp()).sum();
    let p: Vec<f64> = l.iter().map(|&x| f64::from(x - max).exp() / z).collect();
    let mut s = Sampler::new(SamplerConfig {
        seed: 1234,
        ..cfg(1.0, 0, 1.0, 0.0)
    })
    .unwrap();
    let n = 100_000;
    let mut counts = [0usize; 5];
    for _ in 0..n {
        counts[s.sample(&l, &[]) as usize] += 1;
    }
    let chi2: f64 = counts
        .iter()
        .zip(&p)
        .map(|(&c, &pi)| {
            let e = pi * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    // 4 degrees of freedom: the 0.999 quantile is 18.47.
    assert!(chi2 < 18.47, "chi2 = {chi2}, counts = {counts:?}");
}

#[test]
fn no_reallocation_after_first_call() {
    let l = logits(4096, 5);
    let history: Vec<u32> = (0..100).collect();
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 1.2,
        ..SamplerConfig::default()
    })
    .unwrap();
    s.sample(&l, &history);
    let (c, w) = (s.candidates.as_ptr(), s.window.as_ptr());
    for _ in 0..50 {
        s.sample(&l, &history);
    }
    assert_eq!((c, w), (s.candidates.as_ptr(), s.window.as_ptr()));
}

#[test]
fn invalid_configs_rejected() {
    let d = SamplerConfig::default;
    let cases = [
        (
            "temperature",
            SamplerConfig {
                temperature: -0.1,
                ..d()
            },
        ),
        (
            "temperature",
            SamplerConfig {
                temperature: f32::NAN,
                ..d()
            },
        ),
        ("top_p", SamplerConfig { top_p: 0.0, ..d() }),
        ("top_p", SamplerConfig { top_p: 1.5, ..d() }),
        (
            "top_p",
            SamplerConfig {
                top_p: f32::NAN,
                ..d()
            },
        ),
        ("min_p", SamplerConfig { min_p: -0.1, ..d() }),
        ("min_p", SamplerConfig { min_p: 1.1, ..d() }),
        (
            "min_p",
            SamplerConfig {
                min_p: f32::NAN,
                ..d()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: 0.0,
                ..d()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: f32::NAN,
                ..d()
            },
        ),
        (
            "presence_penalty",
            SamplerConfig {
                presence_penalty: f32::NAN,
                ..d()
            },
        ),
        (
            "frequency_penalty",
            SamplerConfig {
                frequency_penalty: f32::INFINITY,
                ..d()
            },
        ),
    ];
    for (field, c) in cases {
        match Sampler::new(c.clone()) {
            Err(Error::Request(msg)) => assert!(msg.contains(field), "{msg}"),
            other => panic!("{c:?} accepted: {other:?}"),
        }
    }
    assert!(SamplerConfig::default().validate().is_ok());
    assert!(SamplerConfig::greedy().validate().is_ok());
}

/// A mask allowing exactly `ids` among `n` tokens.
fn mask_of(n: usize, ids: &[u32]) -> Vec<u32> {
    let mut m = vec![0u32; n.div_ceil(32)];
    for &i in ids {
        m[i as usize / 32] |= 1 << (i % 32);
    }
    m
}

#[test]
fn masked_draws_only_allowed_tokens() {
    let l = logits(300, 7);
    let allowed = [3u32, 40, 77, 250];
    let mask = mask_of(300, &allowed);
    let mut greedy = Sampler::new(SamplerConfig::greedy()).unwrap();
    let want = *allowed
        .iter()
        .max_by(|a, b| l[**a as usize].total_cmp(&l[**b as usize]))
        .unwrap();
    assert_eq!(greedy.sample_masked(&l, &[], &mask), want);
    let mut s = Sampler::new(cfg(1.5, 0, 1.0, 0.0)).unwrap();
    for _ in 0..200 {
        let id = s.sample_masked(&l, &[], &mask);
        assert!(allowed.contains(&id), "drew {id}");
    }
    // A short mask disallows the ids past its end.
    let mut s = Sampler::new(cfg(1.0, 40, 0.95, 0.05)).unwrap();
    let short = mask_of(64, &[5]);
    assert_eq!(s.sample_masked(&l, &[], &short), 5);
}

#[test]
fn logprobs_are_the_log_softmax_of_the_row() {
    let l = logits(500, 9);
    let max = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = l.iter().map(|&v| f64::from(v - max).exp()).sum();
    let lsm = |i: usize| (f64::from(l[i] - max) - z.ln()) as f32;
    let r = logprobs(&l, 17, 5);
    assert!((r.logprob - lsm(17)).abs() < 1e-5);
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
    assert_eq!(r.top.len(), 5);
    for (k, &(id, lp)) in r.top.iter().enumerate() {
        assert_eq!(id as usize, order[k]);
        assert!((lp - lsm(order[k])).abs() < 1e-5);
    }
    let total: f64 = (0..l.len()).map(|i| f64::from(lsm(i)).exp()).sum();
    assert!((total - 1.0).abs() < 1e-4);
    assert!(logprobs(&l, 3, 0).top.is_empty());
}
