//! The model commands: `models`, `tokenize`, `generate` and `bench`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use reagent::catalog::{self, Catalog, FetchOptions};
use reagent::{ChatMessage, GenerateParams, Grammar, GrammarEngine, LanguageModel, Sampling};

use super::args::{BenchArgs, GenerateArgs, ModelsCmd, ServeArgs, TokenizeArgs};
use super::{display, load};

/// `reagent tokenize`: the token ids of a text as a JSON array.
pub(super) fn tokenize(a: TokenizeArgs) -> Result<()> {
    let mut model = load(&a.model)?;
    let ids = model.tokenizer().encode(&a.text, a.special)?;
    if a.logits {
        let logits = reagent::LanguageModel::forward(&mut model, &ids, 0)?;
        out!("{}", serde_json::json!({"ids": ids, "logits": logits}));
    } else {
        out!("{}", serde_json::to_string(&ids)?);
    }
    Ok(())
}

/// `reagent bench`: prefill and decode throughput, or constrained against free decoding.
pub(super) fn bench(a: BenchArgs, threads: usize) -> Result<()> {
    let mut model = load(&a.model)?;
    let params = reagent::bench::BenchParams::new(a.prompt_tokens, a.gen_tokens, a.runs);
    if a.prompt_cache {
        let rows = reagent::bench::run_prompt_cache(&mut model, &params)?;
        match a.json {
            true => out!("{}", serde_json::to_string(&rows)?),
            false => {
                out!("| prefix tokens | compute | load | file |");
                out!("|---|---|---|---|");
                for r in &rows {
                    out!("| {} | {:.3} s | {:.3} s | {:.1} MB |", r.tokens, r.compute_s, r.load_s, r.file_mb);
                }
            }
        }
    } else if a.speculation {
        let rows = reagent::bench::run_speculation(&mut model, &params)?;
        match a.json {
            true => out!("{}", serde_json::to_string(&rows)?),
            false => {
                out!("| workload | tokens | plain tok/s | drafts tok/s | speedup | drafted | accepted | tokens/pass | same output |");
                out!("|---|---|---|---|---|---|---|---|---|");
                for r in &rows {
                    out!(
                        "| {} | {} | {:.1} | {:.1} | {:.2}x | {} | {:.0}% | {:.2} | {} |",
                        r.workload,
                        r.tokens,
                        r.plain_tok_s,
                        r.drafted_tok_s,
                        r.speedup,
                        r.drafted,
                        r.acceptance * 100.0,
                        r.tokens_per_pass,
                        if r.identical { "yes" } else { "NO" }
                    );
                }
            }
        }
    } else if a.constrained {
        let r = reagent::bench::run_constrained(&mut model, &params, threads)?;
        match a.json {
            true => out!("{}", serde_json::to_string(&r)?),
            false => display::constrained_bench(&r)?,
        }
    } else {
        let r = reagent::bench::run(&mut model, &params, threads)?;
        match a.json {
            true => out!("{}", serde_json::to_string(&r)?),
            false => display::bench(&r)?,
        }
    }
    Ok(())
}

/// `reagent serve`: the OpenAI-compatible server until Ctrl-C.
pub(super) fn serve(a: ServeArgs) -> Result<()> {
    use reagent::serve::{Limits, ServeOptions, Server};
    let model = load(&a.model)?;
    let name = match &a.model.model {
        Some(m) if !m.ends_with(".gguf") => m.clone(),
        _ => model.catalog_entry().map(|e| e.name.clone()).unwrap_or_else(|| {
            let p = &model.info().path;
            p.file_stem().map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into_owned())
        }),
    };
    let mut driver = reagent::agent::ModelDriver::constrained(model, reagent::Sampling::Greedy, 0)?;
    if !a.no_prompt_cache && super::prompt_cache_on() {
        // A client's instructions and tools, the same request after request and run after run, load.
        driver = driver.with_prompt_cache(reagent::model::prompt_cache::PromptCache::default_dir());
    }
    if !(a.client_timeout > 0.0 && a.client_timeout <= 86_400.0) {
        bail!("--client-timeout: give a number of seconds above 0, at most a day");
    }
    if a.max_connections == 0 {
        bail!("--max-connections: at least 1");
    }
    let limits = Limits::default()
        .max_body_bytes(a.max_body_mib << 20)
        .max_tools(a.max_tools)
        .client_timeout(std::time::Duration::from_secs_f64(a.client_timeout))
        .max_connections(a.max_connections);
    let profile =
        if a.single_decision { reagent::catalog::Profile::SingleDecision } else { reagent::catalog::Profile::Run };
    let opts = ServeOptions::default()
        .host(a.host)
        .port(a.port)
        .api_key(a.api_key)
        .insecure_no_auth(a.insecure_no_auth)
        .queue(a.queue)
        .limits(limits)
        .profile(profile)
        .model_name(name.clone())
        .parallel_calls(a.parallel_calls)
        .think_budget(a.think_budget)
        .log_requests(!a.quiet);
    let server = Server::start(driver, opts)?;
    eprintln!("serving {name} on http://{}/v1 (Ctrl-C stops)", server.addr());
    super::stop_on_signals().scope(|| server.wait());
    Ok(())
}

/// `reagent models list|fetch|path`.
pub(super) fn models(cmd: ModelsCmd) -> Result<()> {
    let cat = Catalog::builtin();
    let opts = FetchOptions::default();
    match cmd {
        ModelsCmd::List => {
            out!("{:<22} {:>9}  {:<7} {:<8} description", "name", "size", "arch", "present");
            for m in &cat.models {
                let present = catalog::locate(m, &opts).is_some();
                let default = if m.name == cat.default { " (default)" } else { "" };
                out!(
                    "{:<22} {:>6} MB  {:<7} {:<8} {}{default}",
                    m.name,
                    m.bytes / 1_000_000,
                    m.arch,
                    if present { "yes" } else { "no" },
                    m.description
                );
            }
            out!("cache: {}", opts.cache_dir.display());
        }
        ModelsCmd::Fetch { name } => {
            let entry = cat.get(&name).ok_or_else(|| reagent::Error::UnknownModel {
                name: name.clone(),
                known: cat.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            })?;
            let path = catalog::fetch_model(entry, &opts)?;
            out!("{}", path.display());
        }
        ModelsCmd::Path { name, no_fetch } => {
            let path = catalog::resolve(&cat, &name, &opts.download(!no_fetch))?;
            out!("{}", path.display());
        }
    }
    Ok(())
}

/// `reagent generate`: text streamed to stdout, statistics to stderr. Exit 1 when a grammar's output
/// was cut off before it was complete (the token limit, the context): incomplete structured output is
/// never reported as success.
pub(super) fn generate(a: GenerateArgs) -> Result<ExitCode> {
    if a.system.is_some() && !a.chat {
        bail!("--system needs --chat");
    }
    let sampling = Sampling::from_params(a.temperature, a.top_k, a.top_p)?;
    let grammar = grammar(&a)?;
    let mut model = load(&a.model)?;
    let tok = model.tokenizer().clone();
    let prompt = prompt_ids(&a, &model)?;
    let params =
        GenerateParams::default().max_tokens(a.max_tokens).sampling(sampling).seed(a.seed).stop_strings(a.stop.clone());
    let stops = model.stop_tokens().to_vec();
    // Compile the grammar before generating anything, so a bad grammar fails fast and cleanly.
    let mut constraint = match &grammar {
        Some(g) => {
            let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), &stops)?;
            Some(engine.constraint(g).with_context(|| grammar_origin(&a))?)
        }
        None => None,
    };
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let out = reagent::generate(
        &mut model,
        &tok,
        reagent::Request::new(&prompt).stop_tokens(&stops).constraint(constraint.as_mut()),
        &params,
        &mut |t| {
            if write_err.is_none() && !a.ids {
                if let Err(e) = stdout.write_all(t.as_bytes()).and_then(|_| stdout.flush()) {
                    write_err = Some(e);
                }
            }
        },
    )?;
    if let Some(e) = write_err {
        return Err(e).context("writing to stdout");
    }
    if a.ids {
        write!(stdout, "{}", serde_json::to_string(&out.tokens)?)?;
    }
    writeln!(stdout)?;
    display::generation_stats(&out, constraint.as_ref())?;
    let complete = matches!(out.stop, reagent::FinishReason::GrammarComplete)
        || constraint.as_ref().is_none_or(|c| c.is_finished());
    if !complete {
        eprintln!(
            "error: the output is incomplete: generation stopped ({}) before the {} was complete",
            serde_json::to_string(&out.stop)?,
            grammar.as_ref().map_or("grammar", |g| g.kind())
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The grammar `--json-schema`, `--lark` or `--regex` gives, read and parsed before the model loads.
fn grammar(a: &GenerateArgs) -> Result<Option<Grammar>> {
    let read = |p: &PathBuf| reagent::limits::read_input(p, reagent::limits::MAX_INPUT_BYTES);
    Ok(if let Some(p) = &a.json_schema {
        let mut schema: serde_json::Value =
            serde_json::from_str(&read(p)?).with_context(|| format!("{}: not valid JSON", p.display()))?;
        // Whitespace between JSON tokens is fixed unless the schema says otherwise: with it free, a
        // sampled run can spend the whole token limit on spaces and newlines and never end.
        if let Some(o) = schema.as_object_mut() {
            o.entry("x-guidance").or_insert_with(
                || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
        }
        Some(Grammar::JsonSchema(schema))
    } else if let Some(p) = &a.lark {
        Some(Grammar::Lark(read(p)?))
    } else {
        a.regex.clone().map(Grammar::Regex)
    })
}

/// Where the grammar came from, for its errors: the file, or `--regex`.
fn grammar_origin(a: &GenerateArgs) -> String {
    match (&a.json_schema, &a.lark) {
        (Some(p), _) | (None, Some(p)) => p.display().to_string(),
        (None, None) => "--regex".into(),
    }
}

/// The prompt's token ids: the chat template's rendering with `--chat`, else the raw text after BOS.
fn prompt_ids(a: &GenerateArgs, model: &reagent::Model) -> Result<Vec<u32>> {
    let tok = model.tokenizer();
    let ids = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::system(s.clone()));
        }
        msgs.push(ChatMessage::user(a.prompt.clone()));
        let text = model.chat_template().render(&msgs, true, None)?;
        if a.show_prompt {
            eprintln!("{text}");
        }
        tok.encode(&text, true)?
    } else {
        let mut ids: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { Vec::new() };
        ids.extend(tok.encode(&a.prompt, false)?);
        ids
    };
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(ids)
}

/// `reagent cache list|clear`.
pub(super) fn cache(cmd: super::args::CacheCmd) -> Result<()> {
    use reagent::model::prompt_cache::{self, PromptCache};
    let dir = PromptCache::default_dir();
    match cmd {
        super::args::CacheCmd::List => {
            let entries = prompt_cache::list(&dir);
            for e in &entries {
                out!("{}\t{:.1} MB\t{} tokens\t{}", e.path.display(), e.bytes as f64 / 1e6, e.tokens, e.key);
            }
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            eprintln!("{} saved prompts, {:.1} MB, in {}", entries.len(), total as f64 / 1e6, dir.display());
        }
        super::args::CacheCmd::Clear => {
            let n = prompt_cache::clear(&dir)?;
            eprintln!("removed {n} saved prompts from {}", dir.display());
        }
    }
    Ok(())
}
