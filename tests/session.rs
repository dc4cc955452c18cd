//! Conversations ([`Session`]): earlier turns, their calls and observations in view of the next turn, undo
//! and reset, saving and continuing without calling again, and the KV cache kept across turns.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use reagent::agent::{Agent, AgentConfig, ModelDriver, ScriptedDriver, Session, StopReason};
use reagent::tools::{FnTool, ToolError};
use reagent::{ChatMessage, Role, Sampling, ToolChoice, ToolSpec};
use serde_json::{json, Value};

fn call(tool: &str, args: Value) -> String {
    json!({"thought": "", "type": "call_tool", "tool": tool, "args": args}).to_string()
}

fn answer(a: &str) -> String {
    json!({"thought": "", "type": "final_answer", "answer": a}).to_string()
}

/// A tool that counts its calls and returns `sum: 4`.
fn counting(calls: Arc<AtomicUsize>) -> impl reagent::Tool {
    let spec = ToolSpec::new("sum", "adds", json!({"type": "object", "properties": {}})).unwrap();
    FnTool::new(spec, move |_| -> Result<Value, ToolError> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(json!("sum: 4"))
    })
}

fn scripted(script: Vec<String>, calls: Arc<AtomicUsize>) -> (Agent, Arc<std::sync::Mutex<Vec<Vec<ChatMessage>>>>) {
    let driver = ScriptedDriver::new(script);
    let log = driver.log();
    let agent = Agent::builder().driver(driver).tool(counting(calls)).build().unwrap();
    (agent, log)
}

#[test]
fn a_turn_sees_the_earlier_turns_calls_and_observations() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (agent, log) = scripted(vec![call("sum", json!({})), answer("four"), answer("eight")], calls.clone());
    let mut s = Session::new(agent);
    assert_eq!(s.send("add them").unwrap().final_answer.as_deref(), Some("four"));
    assert_eq!(s.send("and doubled?").unwrap().final_answer.as_deref(), Some("eight"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let seen = log.lock().unwrap();
    let last = seen.last().unwrap();
    let texts: Vec<&str> = last.iter().map(|m| m.content.as_str()).collect();
    // In order after the system prompt: the first request, its call, the observation, its answer, the new
    // request.
    let expected = ["add them", "\"call_tool\"", "sum: 4", "four", "and doubled?"];
    assert_eq!(texts.len(), 1 + expected.len(), "{texts:?}");
    for (text, needle) in texts[1..].iter().zip(expected) {
        assert!(text.contains(needle), "{needle} in {texts:?}");
    }
    assert_eq!(last.iter().filter(|m| m.role == Role::System).count(), 1, "one system prompt, the agent's");
    assert_eq!(s.turns().len(), 2);
    assert_eq!(s.turns()[1].messages.first().map(|m| m.content.as_str()), Some("and doubled?"));
    assert_eq!(s.turns()[0].answer.as_deref(), Some("four"));
}

#[test]
fn undo_and_reset_drop_turns_from_what_the_next_turn_sees() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (agent, log) = scripted(vec![answer("a"), answer("b"), answer("c"), answer("d")], calls);
    let mut s = Session::new(agent);
    s.send("first").unwrap();
    s.send("second").unwrap();
    assert_eq!(s.undo().map(|t| t.user), Some("second".to_string()));
    s.send("third").unwrap();
    {
        let seen = log.lock().unwrap();
        let texts: Vec<&str> = seen[2].iter().map(|m| m.content.as_str()).collect();
        assert!(texts.iter().any(|t| t.contains("first")) && !texts.iter().any(|t| t.contains("second")), "{texts:?}");
    }
    s.reset();
    assert!(s.turns().is_empty() && s.conversation().is_empty());
    s.send("fourth").unwrap();
    let seen = log.lock().unwrap();
    assert!(!seen[3].iter().any(|m| m.content.contains("first") || m.content.contains("third")));
}

#[test]
fn a_saved_conversation_continues_without_calling_again() {
    let path = common::scratch().join("saved-session.jsonl");
    let calls = Arc::new(AtomicUsize::new(0));
    let (agent, _) = scripted(vec![call("sum", json!({})), answer("four")], calls.clone());
    let mut s = Session::new(agent);
    s.send("add them").unwrap();
    s.save(&path).unwrap();
    let (agent, log) = scripted(vec![answer("eight")], calls.clone());
    let mut resumed = Session::load(agent, &path).unwrap();
    assert_eq!(resumed.turns(), s.turns());
    assert_eq!(resumed.send("and doubled?").unwrap().final_answer.as_deref(), Some("eight"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the saved call is not made again");
    let seen = log.lock().unwrap();
    assert!(seen[0].iter().any(|m| m.content.contains("sum: 4")), "the saved observation is in view");
}

#[test]
fn session_files_that_are_not_whole_are_refused_naming_the_problem() {
    let dir = common::scratch().join("bad-sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let turn = json!({"user": "hi", "messages": [{"role": "user", "content": "hi"}], "answer": "yo"}).to_string();
    let cases = [
        ("garbage", "not json\n".to_string(), "not a session"),
        ("version", format!("{{\"reagent_session\":99,\"turns\":1}}\n{turn}\n"), "format 99"),
        ("cut", "{\"reagent_session\":1,\"turns\":2}\n".to_string() + &turn + "\n", "1 turns where the header says 2"),
        (
            "order",
            "{\"reagent_session\":1,\"turns\":1}\n".to_string()
                + &json!({"user": "hi", "messages": [{"role": "assistant", "content": "x"}], "answer": null})
                    .to_string(),
            "does not start with its user message",
        ),
        ("torn", "{\"reagent_session\":1,\"turns\":1}\n{\"user\": \"hi\", \"mess".to_string(), "line 2: not a turn"),
    ];
    for (name, text, expected) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let (agent, _) = scripted(vec![], Arc::default());
        let err = Session::load(agent, &path).err().unwrap_or_else(|| panic!("{name} was loaded")).to_string();
        assert!(err.contains(expected) && err.contains(name), "{name}: {err}");
    }
}

#[test]
fn an_interrupted_turn_is_not_kept() {
    let (agent, _) = scripted(vec![answer("a"), answer("b")], Arc::default());
    let cancel = agent.cancel_handle();
    let mut s = Session::new(agent);
    s.send("kept").unwrap();
    cancel.cancel();
    assert_eq!(s.send("stopped").unwrap().stop_reason, StopReason::Interrupted);
    cancel.reset();
    assert_eq!(s.turns().len(), 1);
}

#[test]
fn a_second_turn_computes_only_what_is_new() {
    let path = common::tiny_long_path(reagent::model::Arch::Qwen2);
    let model = reagent::Model::load(&path, &reagent::LoadOptions::default()).unwrap();
    let config = AgentConfig::default()
        .tool_choice(ToolChoice::None)
        .answer_in_own_words(false)
        .decision(reagent::DecisionOptions::default().max_thought_chars(8).max_string_chars(8))
        .max_decision_tokens(200);
    let agent = Agent::builder()
        .driver(ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap())
        .tool(counting(Arc::default()))
        .config(config)
        .build()
        .unwrap();
    let mut s = Session::new(agent);
    let first = s.send("hello").unwrap();
    let second = s.send("again").unwrap();
    assert!(!first.steps.is_empty() && !second.steps.is_empty(), "{first:?}\n{second:?}");
    let (p1, s2) = (&first.steps[0].stats, &second.steps[0].stats);
    // The whole first prompt is in the cache when the second turn starts (the first's answer may be kept
    // in another spelling than it was decoded in, so at least that much, and not all of the new prompt).
    assert!(s2.reused_tokens >= p1.prompt_tokens, "{s2:?} after {p1:?}");
    assert!(s2.reused_tokens < s2.prompt_tokens);
}

#[test]
fn a_conversation_past_the_context_drops_its_oldest_turns() {
    // Measure the system prompt with an unbounded driver, then allow it and about two turns more.
    let (mut agent, log) = scripted(vec![answer("x")], Arc::default());
    agent.run("probe").unwrap();
    let system = log.lock().unwrap()[0][0].content.len();
    let decision_room = 16;
    let context = system + decision_room + 2 * 150;
    let driver = ScriptedDriver::new((0..5).map(|i| answer(&format!("answer {i}"))));
    let log = driver.log();
    let config = AgentConfig::default().max_decision_tokens(decision_room);
    let agent = Agent::builder()
        .driver(driver.with_context(context))
        .tool(counting(Arc::default()))
        .config(config)
        .build()
        .unwrap();
    let mut s = Session::new(agent);
    let turn = |i: usize| format!("turn {i} {}", "x".repeat(100));
    for i in 0..4 {
        let t = s.send(&turn(i)).unwrap();
        assert_eq!(t.final_answer, Some(format!("answer {i}")), "{t:?}");
    }
    assert!(s.dropped_turns() >= 2, "{}", s.dropped_turns());
    assert_eq!(s.turns().len() + s.dropped_turns(), 4);
    let seen = log.lock().unwrap();
    let last: Vec<&str> = seen.last().unwrap().iter().map(|m| m.content.as_str()).collect();
    assert!(!last.iter().any(|t| t.starts_with("turn 0")) && last.iter().any(|t| t.starts_with("turn 3")), "{last:?}");
    // A turn that cannot fit even alone is refused, not looped on, and the conversation stays.
    let kept = s.turns().to_vec();
    let t = s.send(&"y".repeat(context)).unwrap();
    assert!(matches!(t.stop_reason, StopReason::ContextOverflow { .. }), "{t:?}");
    assert_eq!(s.turns(), kept);
}
