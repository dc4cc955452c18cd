//! The native decision format: the model's own tool-calling syntax instead of reagent's ReAct object.
//!
//! Models trained for function calling have a format of their own, and a chat template that renders the
//! tool list the way they saw it in training. Qwen 2.5's template puts the tools in a `<tools>` block of
//! the system turn, and the model answers with one or more
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! blocks, separated by a newline, or with plain text; Llama 3.x answers with a bare
//! `{"name": …, "parameters": …}` object, one a turn. [`CallSyntax`] reads a model's syntax from its
//! template. In this format a decision is constrained by a Lark grammar ([`native_grammar`]): either
//! calls, each naming a registered tool with arguments that satisfy its schema (an inline `%json` schema
//! per call), or an answer. Where the call markers are tokens of their own, the choice between calling
//! and answering is made at one token, where a [`BranchBias`] sets the threshold (see [`NativeTokens`]).
//! [`parse_native`] reads the output back into the same [`Decision`] the ReAct format produces.

use serde_json::{json, Value};

use super::decision::{hoisted_args, Decision, DecisionOptions, ToolChoice};
use crate::decode::constraint::{Allowed, BranchBias, BranchPoint};
use crate::error::{Error, Result};
use crate::text::tokenizer::{TokenKind, Tokenizer};
use crate::tools::{ToolCall, ToolSpec};

mod syntax;

pub use syntax::{CallSyntax, CALL_CLOSE, CALL_OPEN};

/// The opening and closing of a call written as a fenced JSON block, the form Qwen 2.5 Coder models
/// often use instead of the markers (see [`CallSyntax::fenced`]).
pub const FENCE_OPEN: &str = "```json\n";
pub const FENCE_CLOSE: &str = "\n```";

/// The tokens where a native decision branches.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NativeTokens {
    /// Tokens that can start a call: the open marker (or the tokens that begin the call's text, where it
    /// has no marker) and the tokens that are prefixes of [`FENCE_OPEN`].
    pub call_starts: Vec<u32>,
    /// Tokens that can end a call: the close marker (where it has one) and the tokens that are suffixes of
    /// [`FENCE_CLOSE`] ending in the fence.
    pub call_ends: Vec<u32>,
    /// Tokens that can follow a JSON value (see [`ValueEnds`]).
    pub ends: ValueEnds,
}

/// The tokens that can follow a JSON value, by what comes after it: a `}` closes an object, a `]` an
/// array, a `,` adds a key or an item. Each is `[bare, quoted]`: as is (`}`, `}}`, `],`) or after a
/// string's closing quote in the same token (`"}`, `",`): a string often ends in one token with what
/// follows it, and inside a string a bare comma goes on with the string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ValueEnds {
    pub close_object: [Vec<u32>; 2],
    pub close_array: [Vec<u32>; 2],
    pub comma: [Vec<u32>; 2],
    /// The lone closing quote (allowed only inside a string, where a value can end).
    pub quote: Vec<u32>,
}

impl ValueEnds {
    fn add(&mut self, id: u32, bytes: &[u8]) {
        if bytes == b"\"" {
            self.quote.push(id);
        }
        let (quoted, rest) = match bytes.strip_prefix(b"\"") {
            Some(rest) => (1, rest),
            None => (0, bytes),
        };
        match rest.first() {
            Some(b'}') => self.close_object[quoted].push(id),
            Some(b']') => self.close_array[quoted].push(id),
            Some(b',') => self.comma[quoted].push(id),
            _ => {}
        }
    }

    /// Every token that ends a string: the quote alone or with what follows it.
    fn string_ends(&self) -> Vec<u32> {
        [&self.quote, &self.close_object[1], &self.close_array[1], &self.comma[1]]
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The branch biases where a value can end, in the order the choices nest: inside a string, end it
    /// or go on at a comma (`end_list`: a list written as one string, "rock, jazz"); then, in the same
    /// token or the next, close the object (`close`: leave further optional arguments out) or the array
    /// (`end_list`), or add to it. Zero biases are left out.
    pub fn branches(&self, close: f32, end_list: f32) -> Vec<BranchBias> {
        let (in_string, outside) = (Allowed::AnyOf(self.quote.clone()), Allowed::NoneOf(self.quote.clone()));
        let [object, array, comma] = [&self.close_object, &self.close_array, &self.comma];
        let sides = [
            ("end-string", self.string_ends(), &comma[0], end_list, in_string.clone()),
            ("close", object[1].clone(), &comma[1], close, in_string.clone()),
            ("end-list", array[1].clone(), &comma[1], end_list, in_string),
            ("close", object[0].clone(), &comma[0], close, outside.clone()),
            ("end-list", array[0].clone(), &comma[0], end_list, outside),
        ];
        sides
            .into_iter()
            .filter(|s| s.3 != 0.0)
            .map(|(label, tokens, against, bias, when)| BranchBias {
                label,
                at: BranchPoint::Anywhere,
                tokens,
                against: Some(against.clone()),
                bias,
                when,
            })
            .collect()
    }
}

impl NativeTokens {
    /// Scans the vocabulary for the branch tokens of `syntax`.
    pub fn of(tok: &Tokenizer, syntax: &CallSyntax) -> Self {
        let marker = |id: &u32| tok.is_special(*id) || tok.token_kind(*id) == Some(TokenKind::UserDefined);
        let open = tok.encode(&syntax.open, true).unwrap_or_default();
        let close = tok.encode(&syntax.close, true).unwrap_or_default();
        let (mut call_starts, mut call_ends) = (Vec::new(), Vec::new());
        call_starts.extend(open.first().filter(|id| marker(id)));
        call_ends.extend(close.last().filter(|id| marker(id)));
        // Where the call begins with text (Llama 3.x: the object itself), the tokens that begin that text.
        let first_key = if syntax.name_first { &syntax.name_key } else { &syntax.args_key };
        let opening = match open.first() {
            Some(id) if marker(id) => String::new(),
            _ => format!("{}{{\"{first_key}\"", syntax.open),
        };
        let mut ends = ValueEnds::default();
        for id in 0..tok.vocab_size() as u32 {
            if tok.is_special(id) {
                continue;
            }
            let b = tok.token_bytes(id);
            let fence = syntax.fenced() && !b.is_empty() && FENCE_OPEN.as_bytes().starts_with(b);
            if fence || (!b.is_empty() && opening.as_bytes().starts_with(b)) {
                call_starts.push(id);
            }
            if syntax.fenced() && b.ends_with(b"```") && FENCE_CLOSE.as_bytes().ends_with(b) {
                call_ends.push(id);
            }
            ends.add(id, b);
        }
        Self { call_starts, call_ends, ends }
    }
}

/// The `tools` value chat templates take (the Hugging Face convention).
pub fn tools_value(tools: &[ToolSpec]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters
                }})
            })
            .collect(),
    )
}

/// The Lark grammar of one native decision under `choice` in `syntax`: one call (or up to `parallel_calls`,
/// where the syntax takes more than one), or a plain answer of at most `max_answer_tokens` tokens that does
/// not start like a call (`<`, a fence, `{`).
pub fn native_grammar(
    tools: &[ToolSpec],
    choice: &ToolChoice,
    opts: &DecisionOptions,
    syntax: &CallSyntax,
) -> Result<String> {
    let callable = callable(tools, choice);
    let answer = matches!(choice, ToolChoice::Auto | ToolChoice::None) || callable.is_empty();
    let mut g = String::new();
    let mut start = Vec::new();
    if !callable.is_empty() {
        start.push("calls");
        let max_calls = syntax.max_calls(opts.parallel_calls.unwrap_or(1));
        // calls: call, then up to max_calls - 1 more, each after the separator (a chain of optional rules:
        // Lark ranges do not apply to rules here).
        g.push_str(&separator_rule(syntax));
        g.push_str("calls: call");
        if max_calls > 1 {
            g.push_str(" more1?");
        }
        g.push('\n');
        for k in 1..max_calls {
            g.push_str(&format!("more{k}: sep call"));
            if k + 1 < max_calls {
                g.push_str(&format!(" more{}?", k + 1));
            }
            g.push('\n');
        }
        g.push_str(&call_rules(&callable, opts, syntax)?);
    }
    if answer {
        start.push("answer");
        g.push_str(&format!("answer[max_tokens={}]: ANSWER\n", opts.max_answer_tokens.max(1)));
        // Not starting like a call (`<`, a fence, `{`, the call's own first character): the first token
        // tells calls and answers apart.
        let mut first = String::from("<`{\\s");
        if let Some(c) = syntax.open.chars().next().filter(|c| !"<`{".contains(*c) && !c.is_whitespace()) {
            first.push_str(&regex_syntax_escape(c));
        }
        g.push_str(&format!("ANSWER: /[^{first}](?s:.)*/\n"));
    }
    Ok(format!("start: {}\n{g}", start.join(" | ")))
}

/// `c` for a regex character class.
fn regex_syntax_escape(c: char) -> String {
    if c.is_ascii_punctuation() {
        format!("\\{c}")
    } else {
        c.to_string()
    }
}

/// The grammar that goes on from a decision of `native_grammar` after its first `made` calls: stop, or
/// the separator and another call, as many as the decision had left. `None` where it had none left (or
/// `grammar` is not one of [`native_grammar`]'s). A decision made in two requests, the second continuing
/// the first's text, is then one the grammar allows: the server's stop after a call can take the
/// more-calls bias (a `logit_bias` on the stop tokens, which are allowed nowhere else in this grammar).
pub fn native_continuation_grammar(grammar: &str, made: usize) -> Option<String> {
    let (_, rules) = grammar.split_once('\n').filter(|(start, _)| start.starts_with("start:"))?;
    let next = format!("more{made}");
    let defined = made > 0 && rules.lines().any(|l| l.strip_prefix(&next).is_some_and(|r| r.starts_with(':')));
    defined.then(|| format!("start: {next}?\n{rules}"))
}

/// The grammar of `native_grammar`'s decision with at most its first call: the first request of a
/// decision made one call a request ([`native_continuation_grammar`]). `None` where the decision takes
/// one call only.
pub fn native_first_call_grammar(grammar: &str) -> Option<String> {
    let more = "\ncalls: call more1?\n";
    grammar.contains(more).then(|| grammar.replacen(more, "\ncalls: call\n", 1))
}

/// The rule between two calls: one or two newlines where the syntax separates calls by a newline (models
/// write either), else the separator's text.
fn separator_rule(syntax: &CallSyntax) -> String {
    match syntax.separator.as_deref() {
        Some("\n") => "sep: /\\n\\n?/\n".into(),
        _ => format!("sep: {}\n", syntax.lark()[2]),
    }
}

/// The grammar of one more call after a native decision's calls (the separator, then one call to a tool
/// `choice` allows), for proposing a call the model did not make (see
/// [`is_new_requested_item`](super::grounding::Evidence::is_new_requested_item)).
pub fn native_extension_grammar(
    tools: &[ToolSpec],
    choice: &ToolChoice,
    opts: &DecisionOptions,
    syntax: &CallSyntax,
) -> Result<String> {
    let callable = callable(tools, choice);
    if callable.is_empty() {
        return Err(Error::param("tool choice", "it allows no call to extend a decision with"));
    }
    if syntax.separator.is_none() {
        return Err(Error::param("parallel calls", "the model's call syntax takes one call a turn"));
    }
    Ok(format!("start: sep call\n{}{}", separator_rule(syntax), call_rules(&callable, opts, syntax)?))
}

/// The tools `choice` lets a decision call.
fn callable<'a>(tools: &'a [ToolSpec], choice: &ToolChoice) -> Vec<&'a ToolSpec> {
    match choice {
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
        ToolChoice::None => Vec::new(),
        ToolChoice::Specific(name) => tools.iter().filter(|t| &t.name == name).collect(),
    }
}

/// The rules of one call (`call`, its fenced form and its JSON): an object naming one of `callable` with
/// arguments by that tool's schema, keys as the syntax orders them.
fn call_rules(callable: &[&ToolSpec], opts: &DecisionOptions, syntax: &CallSyntax) -> Result<String> {
    // The separators are those the template uses when it renders the calls of earlier turns (Python's
    // json.dumps, as a rule): the generated text and its re-rendering then tokenize alike.
    let mut defs = serde_json::Map::new();
    let (name_key, args_key) = (&syntax.name_key, &syntax.args_key);
    let alternatives: Vec<Value> = callable
        .iter()
        .map(|t| {
            let name = json!({"const": t.name});
            let args = hoisted_args(t, opts, &mut defs);
            let mut properties = serde_json::Map::new();
            if syntax.name_first {
                properties.insert(name_key.clone(), name);
                properties.insert(args_key.clone(), args);
            } else {
                properties.insert(args_key.clone(), args);
                properties.insert(name_key.clone(), name);
            }
            json!({
                "type": "object",
                "properties": properties,
                "required": [name_key, args_key],
                "additionalProperties": false
            })
        })
        .collect();
    let mut schema = json!({
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
        "anyOf": alternatives
    });
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    let [open, close, _] = syntax.lark();
    let marked: Vec<&str> = [open.as_str(), "call_json", close.as_str()].into_iter().filter(|p| *p != "\"\"").collect();
    let mut g = format!("call: {}", marked.join(" "));
    if syntax.fenced() {
        g.push_str(" | fenced\n");
        g.push_str(&format!("fenced: {:?} call_json {:?}", FENCE_OPEN, FENCE_CLOSE));
    }
    g.push('\n');
    g.push_str(&format!("call_json: %json {}\n", serde_json::to_string(&schema)?));
    Ok(g)
}

/// Reads a native decision in `syntax`: calls (the syntax's, or ```` ```json ```` fences, each an object
/// with the name and the arguments) or, for text that does not start with a call, a final answer.
/// Whitespace between calls is ignored; other text after a call is an error (under the grammar there is
/// none).
pub fn parse_native(text: &str, syntax: &CallSyntax) -> std::result::Result<Decision, super::decision::DecisionError> {
    read_native(text, syntax).map_err(super::decision::DecisionError::Native)
}

fn read_native(text: &str, syntax: &CallSyntax) -> std::result::Result<Decision, String> {
    let open = syntax.open.trim();
    let close = syntax.close.trim();
    let starts_call =
        |r: &str| r.starts_with(FENCE_OPEN) || if open.is_empty() { r.starts_with('{') } else { r.starts_with(open) };
    let mut rest = text.trim_start();
    if !starts_call(rest) {
        return Ok(Decision::FinalAnswer { thought: String::new(), answer: text.trim().to_string() });
    }
    let mut calls = Vec::new();
    while starts_call(rest) {
        let (v, after) = if let Some(after) = rest.strip_prefix(FENCE_OPEN) {
            let end =
                after.find(FENCE_CLOSE).ok_or_else(|| format!("a call opened with {FENCE_OPEN:?} is not closed"))?;
            let v = serde_json::from_str(after[..end].trim()).map_err(|e| format!("a call is not valid JSON: {e}"))?;
            (v, &after[end + FENCE_CLOSE.len()..])
        } else {
            let after = rest[open.len()..].trim_start();
            let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            let v = match values.next() {
                Some(Ok(v)) => v,
                Some(Err(e)) if e.is_eof() => return Err("a call is not closed".into()),
                Some(Err(e)) => return Err(format!("a call is not valid JSON: {e}")),
                None => return Err("a call is not closed".into()),
            };
            let after = after[values.byte_offset()..].trim_start();
            let after = match after.strip_prefix(close) {
                Some(a) => a,
                None => return Err(format!("a call is not closed with {close:?}")),
            };
            (v, after)
        };
        calls.push(read_call(&v, syntax)?);
        rest = after.trim_start();
        if let Some(sep) = syntax.separator.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            rest = rest.strip_prefix(sep).unwrap_or(rest).trim_start();
        }
    }
    if !rest.is_empty() {
        return Err(format!("unexpected text after the calls: {:?}", rest.chars().take(40).collect::<String>()));
    }
    Ok(Decision::from_calls(String::new(), calls))
}

/// One call's object: the syntax's keys (a fenced call may use `arguments` or `parameters`).
fn read_call(v: &Value, syntax: &CallSyntax) -> std::result::Result<ToolCall, String> {
    let key = v.get(&syntax.name_key).or_else(|| v.get("name"));
    let name = key.and_then(Value::as_str).ok_or_else(|| format!("a call has no {:?} string", syntax.name_key))?;
    let args = [syntax.args_key.as_str(), "arguments", "parameters"].into_iter().find_map(|k| v.get(k));
    let args = match args {
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| format!("`{name}`: arguments: {e}"))?,
        Some(a) => a.clone(),
        None => json!({}),
    };
    Ok(ToolCall { tool: name.to_string(), args })
}

/// The complete calls at the start of a reply that was cut off inside a later call; `None` when not even
/// the first call is complete.
pub fn parse_complete_calls(text: &str, syntax: &CallSyntax) -> Option<Decision> {
    let close = match syntax.close.trim() {
        "" => "}",
        c => c,
    };
    let ends = text.match_indices(close).map(|(i, m)| i + m.len());
    let fence_ends = text.match_indices(FENCE_CLOSE).map(|(i, m)| i + m.len());
    let mut cuts: Vec<usize> = ends.chain(fence_ends).collect();
    cuts.sort_unstable();
    cuts.into_iter().rev().find_map(|end| parse_native(&text[..end], syntax).ok().filter(|d| !d.calls().is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_answers_parse() {
        let h = CallSyntax::hermes();
        let one = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        assert_eq!(
            parse_native(one, &h).unwrap(),
            Decision::CallTool { thought: String::new(), tool: "f".into(), args: json!({"x": 1}) }
        );
        let fenced = "```json\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n```";
        assert_eq!(parse_native(fenced, &h).unwrap(), parse_native(one, &h).unwrap());
        let two = format!("{one}\n<tool_call>\n{{\"name\": \"g\", \"arguments\": \"{{}}\"}}\n</tool_call>");
        let d = parse_native(&two, &h).unwrap();
        assert_eq!(d.calls().iter().map(|c| c.tool.as_str()).collect::<Vec<_>>(), ["f", "g"]);
        assert_eq!(d.calls()[1].args, json!({}));
        assert_eq!(parse_native(&h.render(&d.calls()), &h).unwrap(), d, "rendered calls read back the same");
        assert!(
            matches!(parse_native(" It is 4.\n", &h).unwrap(), Decision::FinalAnswer { answer, .. } if answer == "It is 4.")
        );
        let cut = format!("{one}\n<tool_call>\n{{\"name\": \"g\", \"arguments\": {{\"s\": \"aaaa");
        assert_eq!(parse_complete_calls(&cut, &h).unwrap(), parse_native(one, &h).unwrap());
        assert_eq!(parse_complete_calls("<tool_call>\n{\"name\": \"g\"", &h), None);
        for bad in [
            "<tool_call>\n{\"name\": \"f\"",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{not json}</tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call> and more",
        ] {
            assert!(parse_native(bad, &h).is_err(), "{bad}");
        }
    }
}
