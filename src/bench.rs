//! Throughput measurement for `reagent bench`, with the same definitions as the peers' benchmark
//! (`peer_bench.py`) so that ratios are meaningful:
//! - prefill: a ~N-token prompt ("Run r. " + filler text) on a cold cache, tokens / wall time;
//! - decode: greedy decode of exactly M tokens with EOS ignored, (M-1) / time from first to last token.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::decode::generate::{generate, prefill, rate, GenerateParams, Request};
use crate::decode::sampler::Sampling;
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::text::Model;

const FILLER: &str = "The quick brown fox jumps over the lazy dog while the agent inspects the repository, \
reads the configuration files, runs the calculator tool on intermediate values and \
writes a short summary of what it found in each module of the project. ";
const DECODE_PROMPT: &str = "Write a long, detailed story about a robot who learns to paint. Once upon a time";

/// What to measure.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BenchParams {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub runs: usize,
}

impl BenchParams {
    /// A prompt of `prompt_tokens`, `gen_tokens` generated, `runs` times.
    pub fn new(prompt_tokens: usize, gen_tokens: usize, runs: usize) -> Self {
        Self { prompt_tokens, gen_tokens, runs }
    }
}

/// One benchmark's figures (per run and medians).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BenchReport {
    pub backend: &'static str,
    pub model: String,
    pub threads: usize,
    /// The CPU kernel tier in use (scalar, avx2, avx_vnni).
    pub kernels: String,
    /// How prompt batches are multiplied (`amx_bf16` or `f32_gemm`).
    pub prefill_kernel: &'static str,
    pub load_s: f64,
    /// Whether the weights were read from huge pages (`LoadOptions::huge_pages`).
    pub huge_pages: bool,
    pub pp_tokens: usize,
    pub pp_tok_s: Vec<f64>,
    pub pp_tok_s_median: f64,
    pub decode_tokens: usize,
    pub decode_tok_s: Vec<f64>,
    pub decode_tok_s_median: f64,
    /// Megabytes of weights a decode step reads (every matrix once, the embedding's one row aside).
    pub decode_weights_mb: f64,
    /// Those bytes times the median decode rate: the weight bandwidth decoding reaches, GB/s.
    pub decode_gb_s: f64,
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
        return Err(Error::param("bench", "it needs runs >= 1, prompt tokens >= 1 and gen tokens >= 2"));
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
    let gp = GenerateParams::default().max_tokens(params.gen_tokens).sampling(Sampling::Greedy).ignore_eos(true);
    let mut dec = Vec::new();
    for _ in 0..params.runs {
        model.truncate(0);
        let g = generate(model, &tok, Request::new(&prompt), &gp, &mut |_| {})?;
        dec.push(g.stats.decode_tok_s());
    }
    let info = model.info();
    let decode = median(&dec);
    Ok(BenchReport {
        backend: "reagent",
        model: info.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        threads,
        kernels: format!("{:?}", crate::model::kernels::Tier::best()),
        prefill_kernel: crate::model::prefill_kernel(),
        load_s: round2(info.load_time.as_secs_f64() * 10.0) / 10.0,
        huge_pages: info.huge_pages,
        pp_tokens,
        pp_tok_s_median: round2(median(&pp)),
        pp_tok_s: pp.into_iter().map(round2).collect(),
        decode_tokens: params.gen_tokens,
        decode_tok_s_median: round2(decode),
        decode_weights_mb: round2(info.decode_bytes_per_token as f64 / 1e6),
        decode_gb_s: round2(info.decode_bytes_per_token as f64 * decode / 1e9),
        decode_tok_s: dec.into_iter().map(round2).collect(),
        peak_rss_mb: peak_rss_mb().map(round2),
    })
}

/// Formats a duration in seconds with millisecond precision.
pub fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// The ReAct decision prompt of `peer_bench.py` (system + user), so constrained figures compare with
/// llama.cpp's JSON-grammar run.
const DECISION_SYSTEM: &str = "You are an agent that decides the next step. Reply with ONE JSON object with keys: \
\"thought\" (string), \"type\" (\"call_tool\" or \"final_answer\"), optionally \"tool\" (\"calculator\" or \"search\"), \
\"args\" (object, e.g. {\"expression\": \"2+2\"}) and \"answer\" (string).";
const DECISION_USER: &str = "Question: What is 37 * 43 + 12? Decide the next step.";

/// Figures of `reagent bench --constrained`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ConstrainedReport {
    pub backend: &'static str,
    pub model: String,
    pub threads: usize,
    /// Building the token trie and parser factory (once per model).
    pub engine_build_s: f64,
    /// Compiling the decision grammar of a 20-tool set (median of the runs).
    pub grammar_20_tools_ms: f64,
    pub free_tokens: usize,
    pub free_decode_tok_s_median: f64,
    pub constrained_tokens: usize,
    pub constrained_decode_tok_s: Vec<f64>,
    pub constrained_decode_tok_s_median: f64,
    /// constrained / free decode tok/s.
    pub ratio: f64,
    pub forced_tokens: usize,
    pub forced_share: f64,
    pub mask_mean_us: f64,
    pub mask_p50_us: f64,
    pub mask_p99_us: f64,
    pub sample_output: String,
}

fn bench_tools(n: usize) -> Vec<crate::tools::ToolSpec> {
    use serde_json::json;
    let mut tools = vec![
        crate::tools::ToolSpec::new(
            "calculator",
            "Evaluates an arithmetic expression.",
            json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
        ),
        crate::tools::ToolSpec::new(
            "search",
            "Searches the web.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
    ];
    for i in tools.len()..n {
        tools.push(crate::tools::ToolSpec::new(
            format!("tool_{i}"),
            "A tool.",
            json!({"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"},
                   "mode": {"enum": ["a", "b"]}, "xs": {"type": "array", "items": {"type": "number"}}}, "required": ["q"]}),
        ));
    }
    tools.into_iter().map(|t| t.expect("bench tools are valid")).collect()
}

/// Measures a decision-shaped generation with the decision grammar against the same prompt unconstrained.
pub fn run_constrained(model: &mut Model, params: &BenchParams, threads: usize) -> Result<ConstrainedReport> {
    use crate::agent::decision::{decision_schema, DecisionOptions, ToolChoice};
    use crate::decode::constraint::{ConstraintStats, Grammar, GrammarEngine};
    use crate::text::chat::ChatMessage;

    if params.runs == 0 || params.gen_tokens < 2 {
        return Err(Error::param("bench", "it needs runs >= 1 and gen tokens >= 2"));
    }
    let tok = model.tokenizer().clone();
    let stops = model.stop_tokens().to_vec();
    let text = model.chat_template().render(
        &[ChatMessage::system(DECISION_SYSTEM), ChatMessage::user(DECISION_USER)],
        true,
        None,
    )?;
    let prompt = tok.encode(&text, true)?;
    let t = Instant::now();
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), &stops)?;
    let engine_build_s = t.elapsed().as_secs_f64();
    let opts = DecisionOptions::default();
    let schema = decision_schema(&bench_tools(2), &ToolChoice::Auto, &opts)?;
    let gp = GenerateParams::default().max_tokens(params.gen_tokens).sampling(Sampling::Greedy);

    let mut free = Vec::new();
    let mut free_tokens = 0;
    for _ in 0..params.runs {
        let g = generate(model, &tok, Request::new(&prompt).stop_tokens(&stops), &gp, &mut |_| {})?;
        free_tokens = g.stats.generated_tokens;
        free.push(rate(g.stats.generated_tokens, g.stats.decode_time));
    }
    let mut constrained = Vec::new();
    let mut grammar_ms = Vec::new();
    let mut last = (0, ConstraintStats::default(), String::new());
    let twenty = bench_tools(20);
    for _ in 0..params.runs {
        let t = Instant::now();
        let big = decision_schema(&twenty, &ToolChoice::Auto, &opts)?;
        engine.constraint(&Grammar::JsonSchema(big))?;
        grammar_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let mut c = engine.constraint(&Grammar::JsonSchema(schema.clone()))?;
        let g = generate(
            model,
            &tok,
            Request::new(&prompt).stop_tokens(&stops).constraint(Some(&mut c)),
            &gp,
            &mut |_| {},
        )?;
        constrained.push(rate(g.stats.generated_tokens, g.stats.decode_time));
        last = (g.stats.generated_tokens, c.stats().clone(), g.text);
    }
    let (constrained_tokens, stats, sample_output) = last;
    let (mean, p50, p99) = stats.mask_summary();
    let us = |d: Duration| round2(d.as_secs_f64() * 1e6);
    let free_med = median(&free);
    let con_med = median(&constrained);
    Ok(ConstrainedReport {
        backend: "reagent",
        model: model.info().path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        threads,
        engine_build_s: round2(engine_build_s),
        grammar_20_tools_ms: round2(median(&grammar_ms)),
        free_tokens,
        free_decode_tok_s_median: round2(free_med),
        constrained_tokens,
        constrained_decode_tok_s_median: round2(con_med),
        constrained_decode_tok_s: constrained.into_iter().map(round2).collect(),
        ratio: round2(if free_med > 0.0 { con_med / free_med } else { 0.0 }),
        forced_tokens: stats.forced_tokens,
        forced_share: round2(stats.forced_share()),
        mask_mean_us: us(mean),
        mask_p50_us: us(p50),
        mask_p99_us: us(p99),
        sample_output,
    })
}

/// One prefix length of [`run_prompt_cache`]: computing it against loading it from the prompt cache.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PromptCacheRow {
    pub tokens: usize,
    /// Median seconds to prefill the prefix on an empty cache.
    pub compute_s: f64,
    /// Median seconds to find, read, check and load the saved prefix (the file in the page cache).
    pub load_s: f64,
    pub file_mb: f64,
}

/// Prefill against the prompt cache's load, for prefixes of 64 tokens up to `params.prompt_tokens`
/// (doubling), `params.runs` times each, in a temporary folder.
pub fn run_prompt_cache(model: &mut Model, params: &BenchParams) -> Result<Vec<PromptCacheRow>> {
    use crate::model::prompt_cache::PromptCache;
    let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let cache = PromptCache::for_model(dir.path(), model.info());
    let tok = model.tokenizer().clone();
    let mut text = String::new();
    let mut ids = Vec::new();
    while ids.len() < params.prompt_tokens {
        text.push_str(DECODE_PROMPT);
        ids = tok.encode(&text, false)?;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut rows = Vec::new();
    let mut len = 64;
    while len <= params.prompt_tokens.min(model.context_length()) {
        let prompt = &ids[..len];
        let mut compute = Vec::new();
        for _ in 0..params.runs.max(1) {
            model.truncate(0);
            let t = std::time::Instant::now();
            prefill(model, prompt, 0)?;
            compute.push(t.elapsed().as_secs_f64());
        }
        let prefix =
            model.export_prefix(len).ok_or_else(|| Error::param("prompt cache", "the KV cache is not on the host"))?;
        let path = cache.store(prompt, &prefix)?;
        let mut load = Vec::new();
        for _ in 0..params.runs.max(1) {
            model.truncate(0);
            let t = std::time::Instant::now();
            let hit = cache
                .lookup(prompt, 0)
                .ok_or_else(|| Error::param("prompt cache", "the saved prefix was not found"))?;
            model.import_prefix(&cache.load(&hit)?)?;
            load.push(t.elapsed().as_secs_f64());
        }
        let file_mb = std::fs::metadata(&path).map_or(0.0, |m| m.len() as f64 / 1e6);
        rows.push(PromptCacheRow { tokens: len, compute_s: median(compute), load_s: median(load), file_mb });
        len *= 2;
    }
    Ok(rows)
}
