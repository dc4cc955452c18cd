//! Agent runs on the newer families' catalog files (Qwen 3, Llama 3.2, SmolLM 3, Phi-4-mini). This machine cannot reach
//! the model hub, so they are ignored here, saying so; where the hub is reachable, `cargo test --release
//! --test families_hub -- --ignored` fetches the files and runs them. The architectures themselves are
//! checked against llama.cpp on random-weight files in CI (benches/families/check.py).

mod common;

use reagent::agent::{Agent, AgentConfig, Driver, ModelDriver, StopReason, Transcript};
use reagent::tools::{builtin_tools, BuiltinOptions};
use reagent::{LoadOptions, Model, Sampling};

/// `reagent run`'s settings for `name` (the catalog's), with `think_budget` tokens of thinking.
fn run(name: &str, task: &str, think_budget: usize) -> Transcript {
    let path = common::real_model_path(name);
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let entry = reagent::catalog::entry_of_file(&path, std::fs::metadata(&path).unwrap().len());
    let dir = tempfile::tempdir().unwrap();
    let mut tools = builtin_tools(&BuiltinOptions::default().root(dir.path().into())).unwrap();
    tools.retain(|t| t.spec().name == "calculator");
    let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    let mut config =
        AgentConfig::for_model(entry.as_ref(), reagent::catalog::Profile::Run, driver.supports_native()).unwrap();
    config.think_budget = think_budget;
    let mut agent = Agent::builder().driver(driver).tools(tools).config(config).build().unwrap();
    agent.run(task).unwrap()
}

fn answers_1603(t: &Transcript) {
    assert_eq!(t.stop_reason, StopReason::FinalAnswer, "{t:#?}");
    assert!(t.final_answer.as_deref().unwrap_or("").contains("1603"), "{:?}", t.final_answer);
}

#[test]
#[ignore = "needs qwen3-0.6b from the model hub, which this machine cannot reach"]
fn qwen3_0_6b_thinks_then_computes_with_the_calculator() {
    let t = run("qwen3-0.6b", "What is 37 * 43 + 12?", 256);
    assert!(t.steps.iter().any(|s| s.thinking.is_some()));
    answers_1603(&t);
}

#[test]
#[ignore = "needs qwen3-1.7b from the model hub, which this machine cannot reach"]
fn qwen3_1_7b_computes_with_the_calculator_without_thinking() {
    answers_1603(&run("qwen3-1.7b", "What is 37 * 43 + 12?", 0));
}

#[test]
#[ignore = "needs llama3.2-1b from the model hub, which this machine cannot reach"]
fn llama3_2_1b_computes_with_the_calculator() {
    answers_1603(&run("llama3.2-1b", "What is 37 * 43 + 12?", 0));
}

#[test]
#[ignore = "needs llama3.2-3b from the model hub, which this machine cannot reach"]
fn llama3_2_3b_computes_with_the_calculator() {
    answers_1603(&run("llama3.2-3b", "What is 37 * 43 + 12?", 0));
}

#[test]
#[ignore = "needs smollm3-3b from the model hub, which this machine cannot reach"]
fn smollm3_3b_thinks_then_computes_with_the_calculator() {
    let t = run("smollm3-3b", "What is 37 * 43 + 12?", 256);
    assert!(t.steps.iter().any(|s| s.thinking.is_some()));
    answers_1603(&t);
}

#[test]
#[ignore = "needs phi4-mini from the model hub, which this machine cannot reach"]
fn phi4_mini_computes_with_the_calculator() {
    answers_1603(&run("phi4-mini", "What is 37 * 43 + 12?", 0));
}
