//! `ternion`: run, chat with, inspect, validate and benchmark GGUF models.

mod bench;
mod bench_serve;
mod chat;
mod check;
mod common;
mod constrain;
mod cores;
mod embed;
mod hub;
mod inspect;
mod logits;
mod perplexity;
mod prompt;
mod run;
mod serve;
mod synth;
mod validate;
mod validate_golden;

use clap::{Parser, Subcommand};

/// Ternion: fast, trustworthy inference for ternary (BitNet b1.58) and GGUF models.
#[derive(Parser)]
#[command(name = "ternion", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(run::RunArgs),
    /// Interactive, streaming chat (multi-turn, reuses the KV cache).
    Chat(chat::ChatArgs),
    /// Evaluate a prompt as one batch and write its logits as a .npy file.
    Logits(logits::LogitsArgs),
    /// Measure a model's perplexity over a text file, as llama-perplexity does.
    Perplexity(perplexity::PerplexityArgs),
    /// Print the token ids of a text as a JSON list.
    Tokenize(inspect::TokenizeArgs),
    /// Compute text embeddings (pooled final hidden states) on the CPU.
    Embed(embed::EmbedArgs),
    /// Check the engine against a golden manifest.
    Validate(validate::ValidateArgs),
    /// Print a GGUF file's metadata and tensor table, and check that the model loads.
    Inspect(inspect::InspectArgs),
    /// Write a random-weight model of a real shape.
    Synth(synth::SynthArgs),
    /// Measure prompt and decode speed.
    Bench(bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Load-test the server: N concurrent streams, tok/s, time to first token, latency.
    BenchServe(bench_serve::BenchServeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::chat(a),
        Command::Logits(a) => logits::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Tokenize(a) => inspect::tokenize(a),
        Command::Embed(a) => embed::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Inspect(a) => inspect::inspect(a),
        Command::Synth(a) => synth::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of stdout went away (`ternion inspect m.gguf | head -1`): what it
        // wanted was written, so this is a normal end, as for other command-line tools.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether `e` (or an error it wraps) is a write to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
