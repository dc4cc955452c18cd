//! Agent runs on the default model, `qwen2.5-coder-0.5b` (491 MB): ignored unless the tests are built with
//! `REAGENT_TEST_MODELS` naming it (`all` in `.ci/run`). Greedy decoding, so the runs are reproducible.

mod common;

use reagent::agent::{Agent, AgentConfig, BranchBiases, DecisionFormat, ModelDriver, StopReason, Transcript};
use reagent::tools::{builtin_tools, BuiltinOptions};
use reagent::{LoadOptions, Model, Sampling};

fn run(task: &str, root: &std::path::Path, only: &[&str]) -> Transcript {
    run_with(task, root, only, AgentConfig::default().first_call(reagent::agent::FirstCall::Always))
}

/// The native format with the catalog's biases for this model and a first decision that calls, as
/// `reagent run` uses it.
fn run_native(task: &str, root: &std::path::Path, only: &[&str]) -> Transcript {
    let biases = BranchBiases::default().call(-1.5).more_calls(13.0).close(3.0).end_list(3.0);
    let config = AgentConfig::default()
        .format(DecisionFormat::Native)
        .branch_biases(biases)
        .first_call(reagent::agent::FirstCall::Always);
    run_with(task, root, only, config)
}

fn run_with(task: &str, root: &std::path::Path, only: &[&str], config: AgentConfig) -> Transcript {
    let path = common::require_model("qwen2.5-coder-0.5b");
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let mut tools = builtin_tools(&BuiltinOptions::default().root(root.into())).unwrap();
    tools.retain(|t| only.is_empty() || only.contains(&t.spec().name.as_str()));
    let mut agent = Agent::builder()
        .driver(ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap())
        .tools(tools)
        .config(config)
        .build()
        .unwrap();
    agent.run(task).unwrap()
}

fn called(t: &Transcript, tool: &str) -> bool {
    t.steps.iter().flat_map(|s| &s.calls).any(|c| c.call.tool == tool && c.outcome.is_ok())
}

#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn arithmetic_goes_through_the_calculator() {
    let dir = tempfile::tempdir().unwrap();
    let t = run("What is 37 * 43 + 12?", dir.path(), &["calculator"]);
    assert!(called(&t, "calculator"), "{t:#?}");
    assert_eq!(t.stop_reason, StopReason::FinalAnswer);
    assert!(t.final_answer.as_deref().unwrap().contains("1603"), "{:?} {t:#?}", t.final_answer);
}

#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn a_file_question_is_answered_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("project.txt"), "Project Falcon\nowner: Maria Lopez\nbudget: 42000 EUR\n").unwrap();
    let t = run("Who is the owner of the project described in project.txt?", dir.path(), &[]);
    assert!(called(&t, "read_file"), "{t:#?}");
    assert!(t.final_answer.as_deref().unwrap().contains("Maria Lopez"), "{:?}", t.final_answer);
    assert!(t.steps.iter().skip(1).all(|s| s.stats.reused_tokens > 0));
}

#[test]
#[ignore = "known defect (issue 12, item 3, as below): native decisions of this model call the calculator again \
            after its result, and the answer forced after the refused repeat is `null`; it answered 1603 until \
            decode batches took the single-step arithmetic (69ecf37), a last-bits change. `reagent run` uses \
            ReAct for this model, which answers 1603 (CI's smoke check)"]
fn native_decisions_use_the_calculator_and_answer_from_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let t = run_native("What is 37 * 43 + 12?", dir.path(), &["calculator"]);
    assert!(called(&t, "calculator"), "{t:#?}");
    assert_eq!(t.stop_reason, StopReason::FinalAnswer);
    assert!(t.final_answer.as_deref().unwrap().contains("1603"), "{:?} {t:#?}", t.final_answer);
}

#[test]
#[ignore = "known defect (issue 12, item 3): native decisions of this model read the file, then keep calling \
            tools instead of answering; `reagent run` uses ReAct for it until the multi-step suite says otherwise"]
fn native_decisions_read_the_file_before_answering() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("project.txt"), "Project Falcon\nowner: Maria Lopez\nbudget: 42000 EUR\n").unwrap();
    let t = run_native("Who is the owner of the project described in project.txt?", dir.path(), &[]);
    assert!(called(&t, "read_file"), "{t:#?}");
    assert!(t.final_answer.as_deref().unwrap().contains("Maria Lopez"), "{:?}", t.final_answer);
}

/// Qwen 2.5's own template gives its Hermes syntax, read from how it renders calls; a turn of calls for
/// the template to render comes out as the same tokens as the calls written out as the turn's text (what
/// reagent kept before it read syntaxes from templates), so prompts of this model are unchanged.
#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn qwens_template_gives_its_call_syntax() {
    use reagent::agent::native::{tools_value, CallSyntax};
    use reagent::{ChatMessage, ToolCall, ToolSpec};
    let model = Model::load(common::require_model("qwen2.5-coder-0.5b"), &LoadOptions::default()).unwrap();
    let (template, tok) = (model.chat_template(), model.tokenizer());
    let syntax = CallSyntax::of(template, tok).expect("Qwen's template renders calls");
    assert_eq!((syntax.open.as_str(), syntax.close.as_str()), ("<tool_call>\n", "\n</tool_call>"));
    assert_eq!(syntax.separator.as_deref(), Some("\n"));
    assert_eq!((syntax.name_key.as_str(), syntax.args_key.as_str()), ("name", "arguments"));
    assert!(syntax.rendered && syntax.fenced());
    let spec = ToolSpec::new("add", "Adds.", serde_json::json!({"type": "object"})).unwrap();
    let tools = tools_value(&[spec]);
    let calls = vec![
        ToolCall::new("add", serde_json::json!({"a": 2, "b": "<|im_end|>"})),
        ToolCall::new("add", serde_json::json!({"a": 4})),
    ];
    let conversation = |turn: ChatMessage| vec![ChatMessage::user("Add."), turn, ChatMessage::user("Thanks.")];
    let rendered = template.render_tokens(tok, &conversation(syntax.turn(calls.clone())), true, Some(&tools)).unwrap();
    let written = ChatMessage::assistant(syntax.render(&calls));
    assert_eq!(rendered, template.render_tokens(tok, &conversation(written), true, Some(&tools)).unwrap());
    let end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(
        rendered.iter().filter(|&&t| t == end).count(),
        4,
        "four turns end; an argument's text is never a control token"
    );
}
