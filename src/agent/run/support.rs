//! A call's support from the request, in the model's own scores: how much more likely the request made
//! the call than an empty request does ([`AgentConfig::min_support`](crate::agent::AgentConfig)).
//!
//! The decision's text (its thought emptied) is scored twice, token by token, unconstrained: after the
//! conversation as it is, and after the same conversation with the last user message emptied. A token's support is the
//! difference of its two log-probabilities (its pointwise mutual information with the request). A value
//! the request gave or implies ("Paris", "MSFT" for "the company behind Windows") gains several nats
//! from it; a value made up because none was given ("AAPL" for "the stock I bought", `notes.txt` for any
//! question about files) is about as likely without the request. A value's support is the sum over its
//! tokens (the log-ratio of the whole value's probabilities: `src/catalog.rs` for "the capital of
//! France" gains at `src` what it loses at `catalog.rs`); a call's is that of its least supported value,
//! or, for a call without values, that of its tool's name. An optional argument given its schema's
//! `default` is not scored: it states nothing the call would not do without it, and a model fills such
//! arguments in whatever the request says (`"private": false`, `"genre": "dontcare"`), so scoring them
//! dropped calls whose stated values the request gave (When2Call's development half:
//! `benches/agent/w2c_replay.py`). `REAGENT_DEBUG_SUPPORT=1` prints each token's
//! support to stderr, for calibrating a model.

use crate::agent::decision::Decision;
use crate::agent::{AgentConfig, DropMeasure, ValueScore};
use crate::text::chat::{ChatMessage, Role};
use crate::tools::ToolCall;

use super::super::Agent;
use crate::error::Result;

/// What drops a first call, if anything: its word grounding under `abstain_below` (unless the request
/// names its tool), else its support under `min_support`, else its tool name's support under
/// `min_tool_support`; with the measure and the threshold.
pub(super) fn dropped_by(
    config: &AgentConfig,
    grounding: Option<f32>,
    named: bool,
    support: Option<f32>,
    tool_support: Option<f32>,
) -> Option<(f32, f32, DropMeasure)> {
    let below = |measure: Option<f32>, threshold: Option<f32>| match (measure, threshold) {
        (Some(m), Some(t)) if m < t => Some((m, t)),
        _ => None,
    };
    below(grounding, config.abstain_below.filter(|_| !named))
        .map(|(m, t)| (m, t, DropMeasure::Grounding))
        .or_else(|| below(support, config.min_support).map(|(m, t)| (m, t, DropMeasure::Support)))
        .or_else(|| below(tool_support, config.min_tool_support).map(|(m, t)| (m, t, DropMeasure::ToolSupport)))
}

/// A first call's scores: each stated value's and its tool name's ([`call_scores`]).
#[derive(Debug, Default)]
pub(super) struct CallScores {
    pub(super) values: Vec<ValueScore>,
    pub(super) tool: Option<ValueScore>,
}

/// The conversation without the request: the last user message emptied.
pub(super) fn without_request(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut neutral = messages.to_vec();
    if let Some(m) = neutral.iter_mut().rev().find(|m| m.role == Role::User) {
        m.content.clear();
    }
    neutral
}

/// `call`'s support in `text` (the decision that made it), from each token's text and its
/// log-probabilities with and without the request; `None` when the call is not found in the text.
#[cfg(test)]
pub(crate) fn support(tokens: &[(String, f32, f32)], text: &str, call: &ToolCall) -> Option<f32> {
    support_of(&value_scores(tokens, text, call, None))
}

/// A call's support from its values' scores: that of its least supported value.
pub(crate) fn support_of(values: &[ValueScore]) -> Option<f32> {
    values.iter().map(|v| v.with - v.without).reduce(f32::min)
}

/// Each value of `call` in `text` scored from the tokens' log-probabilities with and without the
/// request, but those of optional arguments given their default in `parameters` (the tool's schema):
/// the tool's name for a call without other values; none when the call is not found in the text.
#[cfg(test)]
pub(crate) fn value_scores(
    tokens: &[(String, f32, f32)],
    text: &str,
    call: &ToolCall,
    parameters: Option<&serde_json::Value>,
) -> Vec<ValueScore> {
    call_scores(tokens, text, call, parameters).values
}

/// `call`'s scores in `text` from the tokens' log-probabilities with and without the request: each
/// stated value's (those of optional arguments given their default in `parameters`, the tool's schema,
/// left out; the tool's name for a call without other values) and its tool name's; none when the call is
/// not found in the text.
pub(crate) fn call_scores(
    tokens: &[(String, f32, f32)],
    text: &str,
    call: &ToolCall,
    parameters: Option<&serde_json::Value>,
) -> CallScores {
    let (Some(spans), Some(name)) = (Spans::new(tokens, text), tool_name_at(text, call)) else {
        return CallScores::default();
    };
    let at = name + call.tool.len();
    let tool = spans.score(&call.tool, name, at);
    let mut values = Vec::new();
    match &call.args {
        serde_json::Value::Object(args) => {
            let stated = args.iter().filter(|(k, v)| !is_default(parameters, k, v));
            stated.for_each(|(_, v)| leaves(v, &mut values));
        }
        other => leaves(other, &mut values),
    }
    if values.is_empty() {
        return CallScores { values: tool.clone().into_iter().collect(), tool };
    }
    let mut scores = Vec::new();
    for v in values {
        // A string is found with its quotes (not inside a longer one), its support read inside them.
        let inner = match serde_json::from_str::<String>(&v) {
            Ok(_) => 1..v.len() - 1,
            Err(_) => 0..v.len(),
        };
        let Some(i) = value_at(text, at, &v) else { continue };
        scores.extend(spans.score(&v, i + inner.start, i + inner.end));
    }
    CallScores { values: scores, tool }
}

/// Where `call`'s tool name starts in `text` (inside its quotes).
fn tool_name_at(text: &str, call: &ToolCall) -> Option<usize> {
    text.find(&format!("\"{}\"", call.tool)).map(|i| i + 1)
}

/// Scored tokens with where each starts in the text they spell.
struct Spans<'a> {
    tokens: &'a [(String, f32, f32)],
    starts: Vec<usize>,
}

impl<'a> Spans<'a> {
    /// `None` where the tokens do not spell `text` (a tokenizer that does not round-trip): nothing is said.
    fn new(tokens: &'a [(String, f32, f32)], text: &str) -> Option<Self> {
        let mut starts = Vec::with_capacity(tokens.len());
        let mut joined = String::new();
        for (piece, ..) in tokens {
            starts.push(joined.len());
            joined.push_str(piece);
        }
        (joined == text).then_some(Spans { tokens, starts })
    }

    /// The summed scores of the tokens overlapping `from..to`; `None` where there are none.
    fn score(&self, value: &str, from: usize, to: usize) -> Option<ValueScore> {
        let mut over =
            self.tokens.iter().zip(&self.starts).filter(|((p, ..), &s)| s < to && s + p.len() > from).peekable();
        over.peek()?;
        let (with, without) = over.fold((0.0, 0.0), |(a, b), ((_, w, wo), _)| (a + w, b + wo));
        Some(ValueScore { value: value.to_string(), with, without })
    }
}

/// A ReAct decision's text with its thought emptied, where it has one. A call is scored without its
/// thought: a thought restating the request carries the request to the values, which then look as
/// likely without it (seen on the 1.5B: calls from the request and made-up ones alike near 0 nats).
fn without_thought(text: &str) -> Option<String> {
    let mut v: serde_json::Value = serde_json::from_str(text).ok()?;
    let thought = v.get_mut("thought")?;
    if thought.as_str().is_none_or(str::is_empty) {
        return None;
    }
    *thought = serde_json::Value::String(String::new());
    serde_json::to_string(&v).ok()
}

/// Where `value` (JSON text) first stands as a value in `text` after byte `from`: after `:`, `,` or `[`
/// and before `,`, `}` or `]` (spaces aside), so that `1` is not found inside `123` or `"a 1"`.
fn value_at(text: &str, from: usize, value: &str) -> Option<usize> {
    text[from..].match_indices(value).map(|(i, _)| i + from).find(|&i| {
        let before = text[..i].trim_end().chars().next_back();
        let after = text[i + value.len()..].trim_start().chars().next();
        matches!(before, Some(':' | ',' | '[')) && matches!(after, Some(',' | '}' | ']'))
    })
}

/// Whether `key` is an optional argument in `parameters` whose schema's `default` is `value`.
fn is_default(parameters: Option<&serde_json::Value>, key: &str, value: &serde_json::Value) -> bool {
    let Some(p) = parameters else { return false };
    let required = p.get("required").and_then(|r| r.as_array()).is_some_and(|r| r.iter().any(|n| n == key));
    let default = p.get("properties").and_then(|ps| ps.get(key)?.get("default"));
    // Numbers by value: a default of `0.0` is given as `0` too.
    let same = match (default, value) {
        (Some(d), v) if d.is_number() && v.is_number() => d.as_f64() == v.as_f64(),
        (Some(d), v) => d == v,
        (None, _) => false,
    };
    !required && same
}

/// The non-empty leaf values of `v` as JSON text (strings with their quotes).
fn leaves(v: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(o) => o.values().for_each(|x| leaves(x, out)),
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        Value::String(s) if s.is_empty() => {}
        Value::String(_) => out.push(v.to_string()),
        Value::Null => {}
        other => out.push(other.to_string()),
    }
}

impl Agent {
    /// The scores of `decision`'s first call's values and tool name with and without the request (see
    /// the module), or none where the driver cannot score or the call is not found in `text`.
    pub(super) fn first_call_scores(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        decision: &Decision,
        text: &str,
    ) -> Result<CallScores> {
        let Some(call) = decision.calls().into_iter().next() else { return Ok(CallScores::default()) };
        let thoughtless = without_thought(text);
        let text = thoughtless.as_deref().unwrap_or(text);
        let Some(with) = self.driver.score(messages, tools, text)? else { return Ok(CallScores::default()) };
        let Some(without) = self.driver.score(&without_request(messages), tools, text)? else {
            return Ok(CallScores::default());
        };
        let tokens: Vec<(String, f32, f32)> = with.into_iter().zip(without).map(|((p, a), (_, b))| (p, a, b)).collect();
        if std::env::var_os("REAGENT_DEBUG_SUPPORT").is_some() {
            let shown: Vec<String> = tokens.iter().map(|(p, a, b)| format!("{p:?}:{:+.1}", a - b)).collect();
            eprintln!("[support] {}", shown.join(" "));
        }
        let tool = self.executor.tools().get(&call.tool);
        Ok(call_scores(&tokens, text, &call, tool.map(|t| &t.spec().parameters)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Tokens of `text` split at `|`, each with its support as the difference of its two scores.
    fn tokens(text: &str, support: &[f32]) -> (Vec<(String, f32, f32)>, String) {
        let pieces: Vec<&str> = text.split('|').collect();
        assert_eq!(pieces.len(), support.len());
        let t = pieces.iter().zip(support).map(|(p, &s)| (p.to_string(), s - 3.0, -3.0)).collect();
        (t, pieces.concat())
    }

    #[test]
    fn a_call_is_as_supported_as_its_least_supported_value() {
        let (t, text) = tokens(
            r#"{"tool": "|get|_weather|", "args": {"city": "|Par|is|", "days": |3|}}"#,
            &[0.0, 2.0, 0.0, 0.0, 6.5, -0.25, 0.0, 0.5, 0.0],
        );
        let call = ToolCall::new("get_weather", json!({"city": "Paris", "days": 3}));
        // Paris: the sum of its tokens, 6.25; 3: 0.5.
        assert_eq!(support(&t, &text, &call), Some(0.5));
        let call = ToolCall::new("get_weather", json!({"city": "Paris"}));
        assert_eq!(support(&t, &text, &call), Some(6.25));
        // Each value's scores are kept, for other measures offline: both sums over its tokens.
        let call = ToolCall::new("get_weather", json!({"city": "Paris", "days": 3}));
        let scores = value_scores(&t, &text, &call, None);
        let pairs: Vec<(&str, f32, f32)> = scores.iter().map(|v| (v.value.as_str(), v.with, v.without)).collect();
        assert_eq!(pairs, vec![("\"Paris\"", 0.25, -6.0), ("3", -2.5, -3.0)]);
        // A number is found where it stands as a value, not inside another one.
        let (t, text) =
            tokens(r#"{"tool": "|f|", "args": {"a": "|x 3|", "b": |3|}}"#, &[0.0, 0.0, 0.0, 5.0, 0.0, -1.0, 0.0]);
        assert_eq!(support(&t, &text, &ToolCall::new("f", json!({"a": "x 3", "b": 3}))), Some(-1.0));
    }

    #[test]
    fn an_optional_argument_given_its_default_is_not_scored() {
        let (t, text) = tokens(
            r#"{"tool": "|ride|", "args": {"from": "|Elm| Main| St|", "shared": |false|, "seats": |1|}}"#,
            &[0.0, 1.0, 0.0, 9.0, 8.0, 7.0, 0.0, 0.25, 0.0, -0.5, 0.0],
        );
        let call = ToolCall::new("ride", json!({"from": "Elm Main St", "shared": false, "seats": 1}));
        let schema = json!({"type": "object", "required": ["from"], "properties": {
            "from": {"type": "string"},
            "shared": {"type": "boolean", "default": false},
            "seats": {"type": "integer", "default": 2.0},
        }});
        // `shared` is its default: left out. `seats` is not (1, not 2): the made-up value decides.
        let scored = value_scores(&t, &text, &call, Some(&schema));
        assert_eq!(scored.iter().map(|v| v.value.as_str()).collect::<Vec<_>>(), ["\"Elm Main St\"", "1"]);
        assert_eq!(support_of(&scored), Some(-0.5));
        // Without a schema every value counts.
        assert_eq!(support(&t, &text, &call), Some(-0.5));
        let call = ToolCall::new("ride", json!({"from": "Elm Main St", "shared": false}));
        assert_eq!(support_of(&value_scores(&t, &text, &call, Some(&schema))), Some(24.0));
        assert_eq!(support(&t, &text, &call), Some(0.25));
        // A number is its default however it is written.
        assert!(is_default(Some(&schema), "seats", &json!(2)) && !is_default(Some(&schema), "seats", &json!(1)));
        // A required argument is scored whatever its default.
        let schema = json!({"required": ["from", "shared"], "properties": {"shared": {"default": false}}});
        assert_eq!(support_of(&value_scores(&t, &text, &call, Some(&schema))), Some(0.25));
    }

    #[test]
    fn a_call_is_scored_without_its_thought() {
        let text = r#"{"thought":"The user wants 12 times 4.","type":"call_tool","tool":"calculator","args":{"expression":"12 * 4"}}"#;
        assert_eq!(
            without_thought(text).as_deref(),
            Some(r#"{"thought":"","type":"call_tool","tool":"calculator","args":{"expression":"12 * 4"}}"#)
        );
        // Nothing to empty: the text as it is.
        assert_eq!(without_thought(r#"{"thought":"","type":"final_answer","answer":"x"}"#), None);
        assert_eq!(without_thought("<tool_call>{}</tool_call>"), None);
    }

    #[test]
    fn a_call_without_values_is_as_supported_as_its_tools_name() {
        let (t, text) = tokens(r#"{"tool": "|current|_time|", "args": {}}"#, &[0.0, 1.25, 0.25, 0.0]);
        assert_eq!(support(&t, &text, &ToolCall::new("current_time", json!({}))), Some(1.5));
    }

    #[test]
    fn a_calls_tool_name_is_scored_apart_from_its_values() {
        let (t, text) = tokens(
            r#"{"tool": "|search|_files|", "args": {"text": "|play| some| jazz|"}}"#,
            &[0.0, -2.5, -0.25, 0.0, 9.0, 6.0, 6.0, 0.0],
        );
        let call = ToolCall::new("search_files", json!({"text": "play some jazz"}));
        // The values copied from the request are well supported; the tool is not.
        assert_eq!(support(&t, &text, &call), Some(21.0));
        let tool = call_scores(&t, &text, &call, None).tool.unwrap();
        assert_eq!((tool.value.as_str(), tool.with - tool.without), ("search_files", -2.75));
        // Not found in the text, or tokens that do not spell it: nothing is said.
        assert!(call_scores(&t, &text, &ToolCall::new("read_file", json!({})), None).tool.is_none());
        assert!(call_scores(&t[1..], &text, &call, None).tool.is_none());
    }

    #[test]
    fn tokens_that_are_not_the_text_say_nothing() {
        let (t, _) = tokens(r#"{"tool": "|current|_time|"}"#, &[0.0, 1.0, 0.0, 0.0]);
        assert_eq!(support(&t, "other", &ToolCall::new("current_time", json!({}))), None);
        let (t, text) = tokens(r#"{"tool": "|x|"}"#, &[0.0, 1.0, 0.0]);
        assert_eq!(support(&t, &text, &ToolCall::new("current_time", json!({}))), None);
    }

    #[test]
    fn the_request_is_emptied_and_nothing_else() {
        let m = vec![ChatMessage::system("s"), ChatMessage::user("first"), ChatMessage::user("weather in Paris")];
        let n = without_request(&m);
        assert_eq!((n[0].content.as_str(), n[1].content.as_str(), n[2].content.as_str()), ("s", "first", ""));
    }
}
