//! `n > 1` through the real server: a request's choices evaluate the prompt once and share
//! its full KV pages, and choice `i` draws the tokens a request of one choice seeded
//! `seed + i` draws.

use serde_json::{json, Value};

#[path = "support/server.rs"]
mod server;

use server::*;

/// A prompt of 70 token ids: two full KV pages of 32 positions and part of a third.
fn prompt() -> Vec<u32> {
    (0..70).map(|i| 100 + i * 37 % 3000).collect()
}

fn completion(s: &Server, n: usize, seed: u64) -> Vec<Value> {
    let body = json!({
        "model": "tiny", "prompt": prompt(), "max_tokens": 20, "n": n, "seed": seed,
        "temperature": 1.0, "ignore_eos": true, "return_token_ids": true,
    });
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 70, "{v}");
    let choices = v["choices"].as_array().unwrap().clone();
    assert_eq!(choices.len(), n);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["token_ids"].as_array().unwrap().len(), 20, "{c}");
    }
    choices.iter().map(|c| c["token_ids"].clone()).collect()
}

/// Requests 4 choices, then each alone seeded as the server seeds choice `i`; returns the
/// prompt tokens the server evaluated for the 4 choices.
fn choices_draw_as_separately_seeded_requests(s: &Server) -> f64 {
    let together = completion(s, 4, 41);
    let prompt_tokens = s.metric("ternion_prompt_tokens_total");
    assert!(
        together.windows(2).all(|w| w[0] != w[1]),
        "choices differ: {together:?}"
    );
    for (i, want) in together.iter().enumerate() {
        let alone = completion(s, 1, 41 + i as u64);
        assert_eq!(&alone[0], want, "choice {i} = a request seeded 41 + {i}");
    }
    assert_eq!(
        s.metric("ternion_prompt_tokens_total"),
        prompt_tokens + 4.0 * 70.0
    );
    // The engine drops a sequence just after its last event: the pages follow soon.
    let t0 = std::time::Instant::now();
    while s.metric("ternion_kv_pages_in_use") != 0.0 {
        assert!(t0.elapsed().as_secs() < 10, "KV pages are still in use");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    prompt_tokens
}

#[test]
fn choices_evaluate_the_prompt_once_and_draw_as_separately_seeded_requests() {
    // 8 pages hold the prompt's two full pages once and a third page per choice (4 × 90
    // positions without sharing would need 12).
    let s = Server::start(&["--max-active", "4", "--kv-pages", "8"]);
    assert_eq!(choices_draw_as_separately_seeded_requests(&s), 70.0);
    // More choices than --max-active run as sequences of their own, two at a time.
    let s = Server::start(&["--max-active", "2", "--kv-pages", "8"]);
    assert_eq!(choices_draw_as_separately_seeded_requests(&s), 4.0 * 70.0);
}

/// The same on the GPU backend (its page tables share pages too).
/// TERNION_SKIP_GPU_TESTS=1 skips it where no Vulkan driver is installed.
#[test]
fn gpu_choices_evaluate_the_prompt_once_too() {
    if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping GPU server test: TERNION_SKIP_GPU_TESTS=1");
        return;
    }
    let s = Server::start(&["--backend", "gpu", "--max-active", "4", "--kv-pages", "8"]);
    assert_eq!(choices_draw_as_separately_seeded_requests(&s), 70.0);
}
