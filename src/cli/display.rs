//! What the commands print: the readable event display of a run, benchmark tables, the eval summary,
//! and the `--confirm` prompt.

use anyhow::Result;

use reagent::bench::{BenchReport, ConstrainedReport};
use reagent::eval::Summary;

/// The `reagent bench` table.
pub(super) fn bench(r: &BenchReport) -> Result<()> {
    out!("model        {} ({} threads)", r.model, r.threads);
    out!("kernels      {} (decode), {} (prefill)", r.kernels, r.prefill_kernel);
    out!("load         {:.2} s{}", r.load_s, if r.huge_pages { ", weights on huge pages" } else { "" });
    out!("prefill      {:.1} tok/s  ({} tokens, runs {:?})", r.pp_tok_s_median, r.pp_tokens, r.pp_tok_s);
    out!("decode       {:.1} tok/s  ({} tokens, runs {:?})", r.decode_tok_s_median, r.decode_tokens, r.decode_tok_s);
    out!("weights      {:.0} MB read a token: {:.1} GB/s while decoding", r.decode_weights_mb, r.decode_gb_s);
    if let Some(rss) = r.peak_rss_mb {
        out!("peak RSS     {rss:.0} MiB");
    }
    Ok(())
}

/// The `reagent bench --constrained` table.
pub(super) fn constrained_bench(r: &ConstrainedReport) -> Result<()> {
    out!("model             {} ({} threads)", r.model, r.threads);
    out!("unconstrained     {:.1} tok/s ({} tokens)", r.free_decode_tok_s_median, r.free_tokens);
    out!(
        "constrained       {:.1} tok/s ({} tokens, {} forced = {:.0}%), ratio {:.2}",
        r.constrained_decode_tok_s_median,
        r.constrained_tokens,
        r.forced_tokens,
        r.forced_share * 100.0,
        r.ratio
    );
    out!("mask              mean {:.0} µs, p50 {:.0} µs, p99 {:.0} µs", r.mask_mean_us, r.mask_p50_us, r.mask_p99_us);
    out!(
        "grammar setup     engine {:.2} s once per model; 20-tool decision grammar {:.1} ms",
        r.engine_build_s,
        r.grammar_20_tools_ms
    );
    out!("output            {}", r.sample_output);
    Ok(())
}

/// `generate`'s statistics line on stderr, and the grammar's when the output was constrained.
pub(super) fn generation_stats(out: &reagent::Generation, constraint: Option<&reagent::Constraint>) -> Result<()> {
    let s = &out.stats;
    eprintln!(
        "[{} prompt tokens in {:.2} s ({:.1} tok/s); {} generated in {:.2} s ({:.1} tok/s); stop: {}]",
        s.prompt_tokens,
        s.prefill_time.as_secs_f64(),
        s.prefill_tok_s(),
        s.generated_tokens,
        s.decode_time.as_secs_f64(),
        s.decode_tok_s(),
        serde_json::to_string(&out.stop)?
    );
    if let Some(c) = constraint {
        let st = c.stats();
        let (mean, p50, p99) = st.mask_summary();
        eprintln!(
            "[grammar: {} forced tokens ({:.0}%), {} sampled; mask mean {:?}, p50 {:?}, p99 {:?}; complete: {}]",
            st.forced_tokens,
            st.forced_share() * 100.0,
            st.sampled_tokens,
            mean,
            p50,
            p99,
            matches!(out.stop, reagent::FinishReason::GrammarComplete) || c.is_finished()
        );
    }
    Ok(())
}

/// The eval summary on stderr: totals, then one line per category.
pub(super) fn eval_summary(s: &Summary) {
    eprintln!(
        "{} tasks: {} valid on the first try ({:.0}%), {} retries; {} in {:.2} s/task, {:.1} tok/s",
        s.tasks,
        s.valid_first_try,
        100.0 * s.valid_first_try as f64 / s.tasks.max(1) as f64,
        s.retries,
        match s.accuracy {
            Some(acc) => format!("exact match {}/{} ({:.0}%)", s.correct, s.scored, acc * 100.0),
            None => "no expected answers".into(),
        },
        s.mean_seconds,
        s.tok_s
    );
    for (name, c) in &s.categories {
        let acc = c
            .accuracy
            .map_or(String::new(), |x| format!(", exact match {}/{} ({:.0}%)", c.correct, c.scored, x * 100.0));
        eprintln!("  {name}: {} tasks, {} with calls{acc}", c.tasks, c.with_calls);
    }
}

/// Asks on the terminal before each call.
pub(super) struct Confirm;

impl reagent::tools::Interceptor for Confirm {
    fn before(&mut self, call: &mut reagent::ToolCall) -> reagent::tools::InterceptorAction {
        eprint!("run {} {}? [y/N] ", call.tool, call.args);
        let mut line = String::new();
        let yes = std::io::stdin().read_line(&mut line).is_ok() && line.trim().eq_ignore_ascii_case("y");
        if yes {
            reagent::tools::InterceptorAction::Continue
        } else {
            reagent::tools::InterceptorAction::Block("the user declined this call".into())
        }
    }
}

/// The readable display of a run's events (colour on a terminal).
pub(super) fn show_event(e: &reagent::agent::AgentEvent, colour: bool) {
    use reagent::agent::AgentEvent::*;
    let paint = |code: &str, s: String| if colour { format!("\x1b[{code}m{s}\x1b[0m") } else { s };
    let line = match e {
        ArgsRelaxed { tool, reason } => paint(
            "33",
            format!("warning: tool `{tool}`: its argument schema does not compile into the grammar ({reason}); its arguments are checked after decoding"),
        ),
        RunStarted { tools, driver, .. } => paint("2", format!("[{driver} decisions; tools: {}]", tools.join(", "))),
        StepStarted { .. } => return,
        DecisionExtracted { step, decision, stats, thinking, .. } => {
            // Native decisions have no thought: the line then only numbers the step.
            let mut s = match decision.thought() {
                "" => paint("36", format!("{step}.")),
                t => paint("36", format!("{step}. thought: {t}")),
            };
            if let Some(t) = thinking {
                let short: String = t.chars().take(300).collect();
                let more = if short.len() < t.len() { " …" } else { "" };
                s = format!("{}\n{s}", paint("2", format!("{step}. thinking ({} tokens): {short}{more}", stats.thinking_tokens)));
            }
            let loaded = match stats.loaded_tokens {
                0 => String::new(),
                n => format!(", {n} loaded"),
            };
            s.push_str(&paint(
                "2",
                format!(
                    "  [{} tokens, {} forced; prompt {} ({} reused{loaded}); {:.1} s]",
                    stats.generated_tokens,
                    stats.forced_tokens,
                    stats.prompt_tokens,
                    stats.reused_tokens,
                    stats.seconds
                ),
            ));
            s
        }
        ExtractionFailed { step, attempt, error, .. } => {
            paint("33", format!("{step}. attempt {attempt}: no decision: {error}"))
        }
        ValidationFailed { step, attempt, error, .. } => {
            paint("33", format!("{step}. attempt {attempt}: rejected: {error}"))
        }
        ToolCallStarted { call, .. } => paint("35", format!("   → {} {}", call.tool, call.args)),
        ToolCallCompleted { outcome, seconds, .. } => {
            let obs = outcome.observation();
            let short: String = obs.chars().take(400).collect();
            let more = if short.len() < obs.len() { " …" } else { "" };
            paint("2", format!("   ← {short}{more} ({seconds:.2} s)"))
        }
        ToolCallRetried { call, attempt, error, wait_seconds, .. } => {
            paint("33", format!("   ↻ {} again (retry {attempt}, after {wait_seconds:.1} s): {error}", call.tool))
        }
        ToolCallBlocked { call, reason, .. } => paint("33", format!("   ✗ {} blocked: {reason}", call.tool)),
        CallsDropped { calls, grounding, threshold, measure, .. } => {
            let names: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
            let why = match measure {
                reagent::agent::DropMeasure::Grounding => {
                    format!("{}% of its values are the user's words", (grounding * 100.0).round())
                }
                _ => format!("the request supports it by {grounding:.2} nats (under {threshold})"),
            };
            paint("33", format!("   ✗ {} dropped: {why}", names.join(", ")))
        }
        CallProposed { call, kept, .. } => {
            let verdict = if *kept { "kept" } else { "left out: not a new item of the request" };
            paint("2", format!("   + proposed {} {}: {verdict}", call.tool, call.args))
        }
        CallRequired { reason, .. } => paint("2", format!("[a tool call is required: {reason}]")),
        RunResumed { steps } => paint("2", format!("[resumed: {steps} step(s) replayed from the trace]")),
        FinalAnswer { answer, .. } => paint("1;32", format!("answer: {answer}")),
        RunFailed { reason } => paint("31", format!("stopped: {reason}")),
        // An event this display does not know yet (the enum is non-exhaustive): it is in `--json`.
        _ => return,
    };
    eprintln!("{line}");
}

/// An answer shown as it is generated ([`reagent::agent::AgentBuilder::answer_text`]), on stderr (`run`'s
/// display, after `answer: `) or stdout (`chat` on a terminal). A handle for the agent's text callback and
/// one for whoever sees the events and the final answer.
#[derive(Clone)]
pub(super) struct LiveAnswer {
    /// The text shown, and whether its line is still open.
    shown: std::sync::Arc<std::sync::Mutex<(String, bool)>>,
    to_stdout: bool,
    colour: bool,
}

impl LiveAnswer {
    pub(super) fn new(to_stdout: bool, colour: bool) -> Self {
        Self { shown: Default::default(), to_stdout, colour }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, (String, bool)> {
        self.shown.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn end_line(&self, open: &mut bool) {
        if std::mem::take(open) {
            match self.to_stdout {
                true => println!(),
                false => eprintln!(),
            }
        }
    }

    /// Shows a piece of the answer.
    pub(super) fn piece(&self, text: &str) {
        use std::io::Write;
        let mut state = self.state();
        let start = state.0.is_empty();
        state.0.push_str(text);
        state.1 = true;
        if self.to_stdout {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{text}").and_then(|_| out.flush());
        } else {
            let prefix = match (start, self.colour) {
                (false, _) => "",
                (true, true) => "\x1b[1;32manswer:\x1b[0m ",
                (true, false) => "answer: ",
            };
            eprint!("{prefix}{text}");
        }
    }

    /// Ends the line of what was shown, before another event's line.
    pub(super) fn pause(&self) {
        let mut state = self.state();
        let mut open = state.1;
        self.end_line(&mut open);
        state.1 = open;
    }

    /// Ends what was shown once the final answer is known: true when it was that answer (nothing more to
    /// show); false when nothing was shown or another answer stands (a reply not used), which the caller
    /// then shows whole.
    pub(super) fn finish(&self, answer: &str) -> bool {
        let mut state = self.state();
        let (shown, mut open) = std::mem::take(&mut *state);
        self.end_line(&mut open);
        !shown.is_empty() && shown.trim() == answer
    }
}
