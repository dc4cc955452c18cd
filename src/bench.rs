//! Throughput measurement for `reagent bench`, with the same definitions as the peers' benchmark
//! (`peer_bench.py`) so that ratios are meaningful:
//! - prefill: a ~N-token prompt ("Run r. " + filler text) on a cold cache, tokens / wall time;
//! - decode: greedy decode of exactly M tokens with EOS ignored, (M-1) / time from first to last token.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::decode::generate::{generate, prefill, rate, GenerateParams, Generation, Request, SPECULATE};
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
    // Plain decoding, as the peers measure it (drafts: `run_speculation`).
    let gp = GenerateParams::default()
        .max_tokens(params.gen_tokens)
        .sampling(Sampling::Greedy)
        .ignore_eos(true)
        .speculate(0);
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
        prefill_kernel: info.prefill_path(),
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

/// A file the copy-heavy speculation workloads read: lines an answer quotes.
const SPEC_FILE: &str = "2026-11-02 08:14:03 INFO  server started on port 8080 with 4 workers\n\
2026-11-02 08:14:05 INFO  connected to database orders at db.internal:5432\n\
2026-11-02 09:30:41 WARN  slow query on table customers took 2.4 seconds\n\
2026-11-02 10:02:17 ERROR payment gateway timed out after 30 seconds for order 55121\n\
2026-11-02 10:02:18 INFO  retrying payment for order 55121 (attempt 2 of 3)\n\
2026-11-02 11:45:09 ERROR disk usage on /var/lib/orders reached 91 percent\n\
2026-11-02 12:00:00 INFO  nightly report scheduled for 23:00 UTC\n\
2026-11-02 13:27:52 ERROR certificate for api.orders.example expires in 6 days\n\
2026-11-02 14:10:33 INFO  cache hit rate 87 percent over the last hour\n";

/// One workload of [`run_speculation`]: the same greedy generation with and without drafts.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SpeculationRow {
    pub workload: &'static str,
    /// The prompt as the model saw it (for peers to run the same text).
    pub prompt: String,
    pub tokens: usize,
    /// Median decode tokens per second without drafts, and with them.
    pub plain_tok_s: f64,
    pub drafted_tok_s: f64,
    pub speedup: f64,
    /// Tokens drafted and run ahead of the sampler (in the last drafted run).
    pub drafted: usize,
    /// Accepted drafts over drafted tokens.
    pub acceptance: f64,
    /// Generated tokens per forward pass of the decode (1 without drafts).
    pub tokens_per_pass: f64,
    /// Whether both gave the same tokens.
    pub identical: bool,
}

/// Speculative decoding against plain decoding on three workloads: an answer that quotes lines of a
/// file it was given, a ReAct decision after reading that file (under the decision grammar), and free
/// text. Runs alternate between the two, `params.runs` each; at most `params.gen_tokens` tokens.
pub fn run_speculation(model: &mut Model, params: &BenchParams) -> Result<Vec<SpeculationRow>> {
    use crate::agent::decision::{decision_schema, DecisionOptions, ToolChoice};
    use crate::decode::constraint::{Grammar, GrammarEngine};
    use crate::text::chat::ChatMessage;

    if params.runs == 0 || params.gen_tokens < 2 {
        return Err(Error::param("bench", "it needs runs >= 1 and gen tokens >= 2"));
    }
    let tok = model.tokenizer().clone();
    let stops = model.stop_tokens().to_vec();
    let template = model.chat_template();
    let quote = template.render(
        &[ChatMessage::user(format!(
            "Here is the file server.log:\n\n{SPEC_FILE}\nQuote every line that contains ERROR, exactly as it is \
             written, one per line."
        ))],
        true,
        None,
    )?;
    let decision = template.render(
        &[
            ChatMessage::system(DECISION_SYSTEM.replace("\"calculator\" or \"search\"", "\"read_file\"")),
            ChatMessage::user("Which errors does server.log report? Decide the next step."),
            ChatMessage::assistant(
                r#"{"thought":"I need the log.","type":"call_tool","tool":"read_file","args":{"path":"server.log"}}"#,
            ),
            ChatMessage::user(format!(
                "Observation: {SPEC_FILE}\nDecide the next step: answer with the error lines as they are written."
            )),
        ],
        true,
        None,
    )?;
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), &stops)?;
    let read_file = crate::tools::ToolSpec::new(
        "read_file",
        "Reads a file.",
        serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    )?;
    let schema = decision_schema(&[read_file], &ToolChoice::Auto, &DecisionOptions::default())?;
    let grammar = Grammar::JsonSchema(schema);
    let bos = if tok.add_bos() {
        tok.bos().and_then(|b| tok.token_text(b)).unwrap_or_default().to_string()
    } else {
        String::new()
    };
    let workloads: [(&'static str, String, Option<&Grammar>, bool); 3] = [
        ("quote lines", quote, None, false),
        ("decision after a read", decision, Some(&grammar), false),
        ("free text", format!("{bos}{DECODE_PROMPT}"), None, true),
    ];
    let mut rows = Vec::new();
    for (workload, prompt, grammar, free) in workloads {
        let ids = tok.encode(&prompt, true)?;
        let mut rates = [Vec::new(), Vec::new()];
        let mut outs: [Option<Generation>; 2] = [None, None];
        for _ in 0..params.runs {
            for (i, k) in [0, SPECULATE].into_iter().enumerate() {
                let gp = GenerateParams::default()
                    .max_tokens(params.gen_tokens)
                    .sampling(Sampling::Greedy)
                    .ignore_eos(free)
                    .speculate(k);
                let mut c = grammar.map(|g| engine.constraint(g)).transpose()?;
                model.truncate(0);
                let req = Request::new(&ids).stop_tokens(&stops).constraint(c.as_mut());
                let g = generate(model, &tok, req, &gp, &mut |_| {})?;
                rates[i].push(g.stats.decode_tok_s());
                outs[i] = Some(g);
            }
        }
        let [Some(plain), Some(drafted)] = outs else { unreachable!("runs >= 1") };
        let s = drafted.stats.speculation;
        let (plain_tok_s, drafted_tok_s) = (median(&rates[0]), median(&rates[1]));
        rows.push(SpeculationRow {
            workload,
            prompt,
            tokens: drafted.tokens.len(),
            plain_tok_s: round2(plain_tok_s),
            drafted_tok_s: round2(drafted_tok_s),
            speedup: round2(if plain_tok_s > 0.0 { drafted_tok_s / plain_tok_s } else { 0.0 }),
            drafted: s.drafted,
            acceptance: round2(s.acceptance()),
            tokens_per_pass: round2(drafted.tokens.len().saturating_sub(1) as f64 / s.passes.max(1) as f64),
            identical: plain.tokens == drafted.tokens,
        });
    }
    Ok(rows)
}
