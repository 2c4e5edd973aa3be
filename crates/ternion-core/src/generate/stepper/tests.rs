//! The stepper's rules on synthetic rows: prompt chunks, stop rules, forks, constraints.

use super::*;
use crate::sample::SamplerConfig;

fn tok() -> Tokenizer {
    crate::synth::byte_tokenizer()
}

fn stepper(max_tokens: usize, stop: &[&str], n_ctx: usize) -> Stepper<Sampler> {
    Stepper::new(
        Sampler::new(SamplerConfig::greedy()).unwrap(),
        (),
        Vec::new(),
        (0..600).map(|i| i % 200).collect(),
        StepperOptions {
            max_tokens,
            ignore_eos: false,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            n_ctx,
            max_chunk: 512,
        },
    )
}

/// Steps until the end, answering each draw with the next of `draws` (argmax rows);
/// returns the text, the size of every step and the end.
fn run(s: &mut Stepper<Sampler>, t: &Tokenizer, draws: &[u32]) -> (String, Vec<usize>, End) {
    let (mut text, mut steps, mut draws) = (String::new(), Vec::new(), draws.iter().peekable());
    loop {
        assert!(
            s.plan(&mut usize::MAX.clone()),
            "a running sequence has a step"
        );
        steps.push(s.tokens().len());
        let adv = s.advance(Row::Argmax(**draws.peek().unwrap()), t);
        if adv.drawn.is_some() {
            draws.next();
        }
        text.push_str(adv.text.as_deref().unwrap_or(""));
        if let Some(end) = adv.end {
            text.push_str(&end.text);
            return (text, steps, end);
        }
    }
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[test]
fn prompt_in_chunks_then_one_token_per_step_up_to_the_budget() {
    let t = tok();
    let mut s = stepper(3, &[], 1000);
    let (text, steps, end) = run(&mut s, &t, &bytes("abc"));
    assert_eq!(steps, [512, 88, 1, 1]);
    assert_eq!((text.as_str(), end.finish), ("abc", FinishReason::Length));
    let (history, last) = s.into_parts();
    assert_eq!(history.len(), 602);
    assert_eq!(
        last,
        Some(u32::from(b'c')),
        "the last draw is left to evaluate"
    );
}

#[test]
fn stop_strings_eog_and_the_context_end_a_sequence() {
    let t = tok();
    let mut s = stepper(10, &["yz"], 1000);
    let (text, _, end) = run(&mut s, &t, &bytes("xyyzq"));
    assert_eq!((text.as_str(), end.finish), ("xy", FinishReason::Stop));
    let mut s = stepper(10, &[], 603);
    let (_, _, end) = run(&mut s, &t, &bytes("xxxxxxxx"));
    assert_eq!(end.finish, FinishReason::Context);
    assert_eq!(s.generated().len(), 3);
    let mut s = stepper(10, &[], 1000);
    let (text, steps, end) = run(&mut s, &t, &[u32::from(b'x'), 257]);
    assert_eq!((text.as_str(), end.finish), ("x", FinishReason::Stop));
    assert_eq!(steps.len(), 3);
    assert_eq!(s.generated(), [u32::from(b'x')]);
}

#[test]
fn a_fork_after_the_prompt_draws_from_the_same_row_and_goes_on_alone() {
    let t = tok();
    let mut a = stepper(5, &[], 1000);
    while a.plan(&mut usize::MAX.clone()) && a.in_prompt() {
        if a.advance(Row::Argmax(u32::from(b'a')), &t).drawn.is_some() {
            break;
        }
    }
    let opts = a.opts.clone();
    let mut b = a.fork(Sampler::new(SamplerConfig::greedy()).unwrap(), (), opts);
    let adv = b.advance(Row::Argmax(u32::from(b'b')), &t);
    assert_eq!((adv.drawn, adv.text.as_deref()), (Some(98), Some("b")));
    assert_eq!((b.prompt_len(), b.in_prompt()), (600, false));
    assert!(
        b.plan(&mut 0) && a.plan(&mut 0),
        "each one's next step is its own draw"
    );
    assert_eq!((b.tokens(), a.tokens()), (&[98][..], &[97][..]));
    let (history, _) = b.into_parts();
    assert_eq!(history, a.into_parts().0);
}

/// Allows only the next byte of its text; complete after the last.
struct Spell {
    text: &'static [u8],
    at: usize,
    mask: Vec<u32>,
}

impl Constraint for Spell {
    fn mask(&mut self, _left: usize) -> Result<&crate::generate::Mask, String> {
        let b = self.text[self.at];
        self.mask = vec![0; 9];
        self.mask[usize::from(b / 32)] |= 1 << (b % 32);
        Ok(&self.mask)
    }

    fn commit(&mut self, id: u32) -> Result<bool, String> {
        if id != u32::from(self.text[self.at]) {
            return Err(format!("{id} is not allowed"));
        }
        self.at += 1;
        Ok(self.at == self.text.len())
    }
}

fn spell(text: &'static [u8]) -> Box<Spell> {
    Box::new(Spell {
        text,
        at: 0,
        mask: Vec::new(),
    })
}

#[test]
fn a_constraint_chooses_the_tokens_and_ends_the_sequence_with_logprobs_of_the_row() {
    let t = tok();
    let logits: Vec<f32> = (0..259).map(|i| ((i * 37) % 11) as f32 * 0.5).collect();
    let mut s = stepper(10, &[], 1000)
        .with_constraint(spell(b"ok!"))
        .with_logprobs(3);
    assert_eq!(s.need(8, false), Need::Logits);
    let mut text = String::new();
    let end = loop {
        assert!(s.plan(&mut usize::MAX.clone()));
        let adv = s.advance(Row::Logits(&logits), &t);
        if let Some(id) = adv.drawn {
            assert_eq!(adv.logprobs, Some(logprobs(&logits, id, 3)));
        }
        text.push_str(adv.text.as_deref().unwrap_or(""));
        if let Some(end) = adv.end {
            break end;
        }
    };
    assert_eq!((text.as_str(), end.finish), ("ok!", FinishReason::Stop));
    assert_eq!(end.error, None);
    // A backend that hands a constrained sequence its argmax alone is an error.
    let mut s = stepper(10, &[], 1000).with_constraint(spell(b"x"));
    let end = loop {
        assert!(s.plan(&mut usize::MAX.clone()));
        if let Some(end) = s.advance(Row::Argmax(3), &t).end {
            break end;
        }
    };
    assert!(end.error.unwrap().contains("logits"), "{:?}", s.finish());
}

/// Allows the printable bytes `b` with `(b + n) % 3 == 0` at its `n`-th draw; complete
/// after `len` draws. Keeps every `left` it was asked with in `lefts`.
struct Thirds {
    len: usize,
    drawn: usize,
    mask: Vec<u32>,
    lefts: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Constraint for Thirds {
    fn mask(&mut self, left: usize) -> Result<&crate::generate::Mask, String> {
        self.lefts.lock().unwrap().push(left);
        self.mask = vec![0; 9];
        for b in (32..127).filter(|b| (b + self.drawn).is_multiple_of(3)) {
            self.mask[b / 32] |= 1 << (b % 32);
        }
        Ok(&self.mask)
    }

    fn commit(&mut self, id: u32) -> Result<bool, String> {
        if !allows(&self.mask, id) {
            return Err(format!("{id} is not allowed"));
        }
        self.drawn += 1;
        Ok(self.drawn == self.len)
    }
}

/// The `k` best (id, logit) pairs of `logits` with the ids `mask` does not allow at −inf,
/// best first, ties to the lower id: what a masked GPU top-k returns.
fn masked_top(logits: &[f32], mask: &crate::generate::Mask, k: usize) -> Vec<(u32, f32)> {
    let mut pairs: Vec<(u32, f32)> = (0..logits.len() as u32)
        .map(|id| {
            let v = logits[id as usize];
            (
                id,
                if allows(mask, id) {
                    v
                } else {
                    f32::NEG_INFINITY
                },
            )
        })
        .collect();
    pairs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    pairs.truncate(k);
    pairs
}

/// Runs a constrained sequence to its end, each draw from the whole row or, with `top`,
/// from its top-8 selected under the mask the stepper handed out before the step. Returns
/// the generated ids and the `left` of every mask.
fn constrained(cfg: &SamplerConfig, top: bool, logits: &[f32]) -> (Vec<u32>, Vec<usize>) {
    let t = tok();
    let lefts = std::sync::Arc::default();
    let thirds = Thirds {
        len: 12,
        drawn: 0,
        mask: Vec::new(),
        lefts: std::sync::Arc::clone(&lefts),
    };
    let opts = StepperOptions {
        max_tokens: 40,
        ignore_eos: false,
        stop: Vec::new(),
        n_ctx: 100,
        max_chunk: 512,
    };
    let sampler = Sampler::new(cfg.clone()).unwrap();
    let mut s = Stepper::new(sampler, (), Vec::new(), (0..30).collect(), opts)
        .with_constraint(Box::new(thirds));
    loop {
        assert!(s.plan(&mut usize::MAX.clone()));
        let pairs = if top {
            assert_eq!(s.need(8, true), Need::Top);
            s.prepare_mask();
            s.prepare_mask(); // a second call keeps the mask computed
            s.step_parts().2.map(|m| masked_top(logits, m, 8))
        } else {
            None
        };
        let row = pairs.as_deref().map_or(Row::Logits(logits), Row::Top);
        if let Some(end) = s.advance(row, &t).end {
            assert_eq!((end.finish, end.error), (FinishReason::Stop, None));
            break;
        }
    }
    let lefts = lefts.lock().unwrap().clone();
    (s.take_generated(), lefts)
}

#[test]
fn a_constrained_draw_from_a_masked_top_k_equals_the_whole_row_masked() {
    let logits: Vec<f32> = (0..259)
        .map(|i| ((i * 37) % 11) as f32 * 0.5 + (i % 7) as f32 * 0.01)
        .collect();
    let sampled = SamplerConfig {
        top_k: 8,
        seed: 5,
        ..SamplerConfig::default()
    };
    for cfg in [SamplerConfig::greedy(), sampled] {
        let (whole, whole_lefts) = constrained(&cfg, false, &logits);
        let (top, top_lefts) = constrained(&cfg, true, &logits);
        assert_eq!(whole.len(), 12);
        assert_eq!(top, whole, "{cfg:?}");
        assert_eq!(
            top_lefts, whole_lefts,
            "one mask per draw, with the same budget"
        );
        assert_eq!(whole_lefts, (29..=40).rev().collect::<Vec<_>>());
    }
}

#[test]
fn a_constrained_sequence_takes_a_masked_top_k_only_where_it_draws_from_one() {
    let mut s = stepper(10, &[], 1000).with_constraint(spell(b"x"));
    assert_eq!(
        s.need(8, false),
        Need::Logits,
        "no masked top-k: whole rows"
    );
    assert_eq!(
        s.need(8, true),
        Need::Top,
        "greedy, constrained: never the argmax"
    );
    assert!(s.plan(&mut 100));
    s.prepare_mask();
    assert_eq!(
        s.step_parts().2,
        None,
        "the first chunk of the prompt draws nothing"
    );
    let s = s.with_logprobs(2);
    assert_eq!(
        s.need(8, true),
        Need::Logits,
        "log-probabilities need the row"
    );
    let penalised = SamplerConfig {
        repeat_penalty: 1.3,
        ..SamplerConfig::greedy()
    };
    let p = Stepper::new(
        Sampler::new(penalised).unwrap(),
        (),
        Vec::new(),
        vec![1, 2],
        s.opts.clone(),
    )
    .with_constraint(spell(b"x"));
    assert_eq!(p.need(8, true), Need::Logits, "penalties reorder the row");
}
