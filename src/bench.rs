//! Throughput measurement for `reagent bench`, with the same definitions as the peers' benchmark
//! (`peer_bench.py`) so that ratios are meaningful:
//! - prefill: a ~N-token prompt ("Run r. " + filler text) on a cold cache, tokens / wall time;
//! - decode: greedy decode of exactly M tokens with EOS ignored, (M-1) / time from first to last token.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::decode::generate::{generate, prefill, rate, GenerateParams};
use crate::decode::sampler::Sampling;
use crate::error::{Error, Result};
use crate::model::{LanguageModel, Model};

const FILLER: &str = "The quick brown fox jumps over the lazy dog while the agent inspects the repository, \
reads the configuration files, runs the calculator tool on intermediate values and \
writes a short summary of what it found in each module of the project. ";
const DECODE_PROMPT: &str = "Write a long, detailed story about a robot who learns to paint. Once upon a time";

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchParams {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub runs: usize,
}

/// One benchmark's figures (per run and medians).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub backend: &'static str,
    pub model: String,
    pub threads: usize,
    pub load_s: f64,
    pub pp_tokens: usize,
    pub pp_tok_s: Vec<f64>,
    pub pp_tok_s_median: f64,
    pub decode_tokens: usize,
    pub decode_tok_s: Vec<f64>,
    pub decode_tok_s_median: f64,
    pub peak_rss_mb: Option<f64>,
}

/// Peak resident set size of this process in MiB (Linux), if known.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Runs the benchmark on a loaded model.
pub fn run(model: &mut Model, params: &BenchParams, threads: usize) -> Result<BenchReport> {
    if params.runs == 0 || params.prompt_tokens == 0 || params.gen_tokens < 2 {
        return Err(Error::InvalidArgument("bench needs runs >= 1, prompt tokens >= 1 and gen tokens >= 2".into()));
    }
    let need = params.prompt_tokens.max(params.gen_tokens + 64);
    if need > model.context_length() {
        return Err(Error::ContextOverflow { needed: need, capacity: model.context_length() });
    }
    let tok = model.tokenizer().clone();
    let bos: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { Vec::new() };
    let base = tok.encode(&FILLER.repeat(64), false)?;
    let mut pp = Vec::new();
    let mut pp_tokens = 0;
    for r in 0..params.runs {
        let mut toks = bos.clone();
        toks.extend(tok.encode(&format!("Run {r}. "), false)?);
        toks.extend_from_slice(&base);
        toks.truncate(params.prompt_tokens);
        pp_tokens = toks.len();
        model.truncate(0);
        let t = Instant::now();
        prefill(model, &toks, 0)?;
        pp.push(rate(toks.len(), t.elapsed()));
    }
    let mut prompt = bos.clone();
    prompt.extend(tok.encode(DECODE_PROMPT, false)?);
    let gp = GenerateParams {
        max_tokens: params.gen_tokens,
        sampling: Sampling::Greedy,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let mut dec = Vec::new();
    for _ in 0..params.runs {
        model.truncate(0);
        let g = generate(model, &tok, &[], &prompt, &gp, &mut |_| {})?;
        dec.push(g.stats.decode_tok_s());
    }
    let info = model.info();
    Ok(BenchReport {
        backend: "reagent",
        model: info.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        threads,
        load_s: round2(info.load_time.as_secs_f64() * 10.0) / 10.0,
        pp_tokens,
        pp_tok_s_median: round2(median(&pp)),
        pp_tok_s: pp.into_iter().map(round2).collect(),
        decode_tokens: params.gen_tokens,
        decode_tok_s_median: round2(median(&dec)),
        decode_tok_s: dec.into_iter().map(round2).collect(),
        peak_rss_mb: peak_rss_mb().map(round2),
    })
}

/// Formats a duration in seconds with millisecond precision.
pub fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
