//! Time to the first streamed token of an answer in the model's own words, after the decision to answer:
//! the agent (catalog settings, built-in tools over `tests/data/agent_fixture`) runs requests whose right
//! move is an answer, and a driver that forwards to the model's times each `answer` from its call (the
//! decision is made) to the first piece of text it streams. Also the whole run's time, for scale (the
//! system prompt's KV kept in memory between runs, as an agent built on a model keeps it).
//!
//! ```sh
//! cargo bench --bench answer_latency              # the default model
//! cargo bench --bench answer_latency -- qwen2.5-coder-1.5b
//! ```
//!
//! Not a test: it prints figures (median and worst over the requests, the first run left out as the
//! warm-up that computes the system prompt and builds the grammars).

use reagent::agent::{Agent, DecisionRequest, Driver, DriverOutput, ModelDriver, RECENT_PREFIX_BYTES};
use reagent::catalog::{self, Catalog, FetchOptions};
use reagent::tools::{builtin_tools, BuiltinOptions};
use reagent::{ChatMessage, Grammar, LoadOptions, Model, Role, Sampling};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const REQUESTS: &[&str] = &[
    "Who wrote Romeo and Juliet?",
    "what's the capital of australia",
    "good morning :)",
    "At what temperature in degrees Celsius does water boil at sea level?",
    "Which planet is closest to the sun?",
    "thanks, that was helpful!",
    "I have 2 cats and 3 dogs, suggest some pet names",
    "What is a package.json file for?",
    "who painted the mona lisa",
];

/// Seconds from each `answer` call to its first piece of text.
type Latencies = Arc<Mutex<Vec<f64>>>;

/// The model's driver, with its own-words answers timed.
struct Timed {
    inner: ModelDriver,
    latencies: Latencies,
}

impl Driver for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn decide(&mut self, req: &DecisionRequest<'_>) -> reagent::Result<DriverOutput> {
        self.inner.decide(req)
    }
    fn extend(&mut self, req: &DecisionRequest<'_>) -> reagent::Result<Option<DriverOutput>> {
        self.inner.extend(req)
    }
    fn answer(
        &mut self,
        messages: &[ChatMessage],
        max_tokens: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> reagent::Result<Option<DriverOutput>> {
        let t0 = Instant::now();
        let mut first = None;
        let mut timed = |t: &str| {
            if first.is_none() && !t.is_empty() {
                first = Some(t0.elapsed().as_secs_f64());
            }
            on_text(t)
        };
        let out = self.inner.answer(messages, max_tokens, &mut timed)?;
        if let Some(s) = first {
            self.latencies.lock().unwrap().push(s);
        }
        Ok(out)
    }
    fn call_margin(
        &mut self,
        req: &DecisionRequest<'_>,
    ) -> reagent::Result<Option<(f32, reagent::agent::events::DecisionStats)>> {
        self.inner.call_margin(req)
    }
    fn score(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        text: &str,
    ) -> reagent::Result<Option<Vec<(String, f32)>>> {
        self.inner.score(messages, tools, text)
    }
    fn rollback(&mut self) {
        self.inner.rollback()
    }
    fn observation_role(&self) -> Role {
        self.inner.observation_role()
    }
    fn measure(&mut self, messages: &[ChatMessage], tools: Option<&Value>) -> reagent::Result<Option<(usize, usize)>> {
        self.inner.measure(messages, tools)
    }
    fn call_syntax(&self) -> Option<reagent::agent::native::CallSyntax> {
        self.inner.call_syntax()
    }
    fn supports_native(&self) -> bool {
        self.inner.supports_native()
    }
    fn supports_thinking(&self) -> bool {
        self.inner.supports_thinking()
    }
    fn prompt_bound(&mut self, bytes: usize) -> Option<(usize, usize)> {
        self.inner.prompt_bound(bytes)
    }
    fn forget(&mut self) {
        self.inner.forget()
    }
    fn reseed(&mut self) {
        self.inner.reseed()
    }
    fn check_grammar(&self, grammar: &Grammar) -> reagent::Result<()> {
        self.inner.check_grammar(grammar)
    }
    fn catalog_entry(&self) -> Option<reagent::catalog::CatalogEntry> {
        self.inner.catalog_entry()
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() -> reagent::Result<()> {
    // `cargo bench` passes `--bench`; the first other argument names the model.
    let name = std::env::args().skip(1).find(|a| !a.starts_with("--")).unwrap_or("qwen2.5-coder-0.5b".into());
    let located = Catalog::builtin().get(&name).and_then(|e| catalog::locate(e, &FetchOptions::default()));
    let path = match located {
        Some(p) => p,
        None => {
            eprintln!("{name} is not in the local cache; run `reagent models fetch {name}` to bench it");
            return Ok(());
        }
    };
    let model = Model::load(&path, &LoadOptions::default())?;
    let latencies: Latencies = Arc::default();
    // As `Agent::builder().model` does: the system prompt's KV kept in memory while a reply in the
    // model's own words uses the cache, so each run does not compute it again.
    let inner = ModelDriver::constrained(model, Sampling::Greedy, 0)?.with_recent_prefixes(RECENT_PREFIX_BYTES);
    let driver = Timed { inner, latencies: latencies.clone() };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agent_fixture");
    let tools = builtin_tools(&BuiltinOptions::default().root(root))?;
    let mut agent = Agent::builder().driver(driver).tools(tools).build()?;
    let mut runs = Vec::new();
    for (i, request) in REQUESTS.iter().enumerate() {
        let before = latencies.lock().unwrap().len();
        let t0 = Instant::now();
        let transcript = agent.run(request)?;
        let secs = t0.elapsed().as_secs_f64();
        let ttft = latencies.lock().unwrap().get(before).copied();
        let answer = transcript.final_answer.as_deref().unwrap_or("(no answer)");
        let shown = answer.lines().next().unwrap_or_default().chars().take(60).collect::<String>();
        match ttft {
            Some(t) => println!("{request:<70} first token {:>6.0} ms  run {secs:5.2} s  {shown}", t * 1e3),
            None => println!("{request:<70} (no own-words answer)  run {secs:5.2} s  {shown}"),
        }
        if i > 0 {
            runs.push((ttft, secs));
        }
    }
    let mut ttfts: Vec<f64> = runs.iter().filter_map(|r| r.0).collect();
    let mut secs: Vec<f64> = runs.iter().map(|r| r.1).collect();
    ttfts.sort_by(f64::total_cmp);
    secs.sort_by(f64::total_cmp);
    if ttfts.is_empty() {
        println!("{name}: no answer in the model's own words after the warm-up run");
        return Ok(());
    }
    println!(
        "{name}: first answer token after the decision to answer: median {:.0} ms, worst {:.0} ms ({} of {} \
         runs after the warm-up); whole run median {:.2} s",
        percentile(&ttfts, 0.5) * 1e3,
        ttfts.last().unwrap() * 1e3,
        ttfts.len(),
        runs.len(),
        percentile(&secs, 0.5),
    );
    Ok(())
}
