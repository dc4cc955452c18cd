//! A model's own call syntax, read from its chat template.
//!
//! The template is the specification: it renders earlier turns' calls the way the model saw them in
//! training, so [`CallSyntax::of`] renders a probe conversation twice, once with an assistant turn of
//! text and once with the same turn making a call, and reads the syntax off the difference: the text
//! around the call's JSON object (`<tool_call>\n` … `\n</tool_call>` for Qwen, nothing for Llama 3.x,
//! `<|tool_call|>` … `<|/tool_call|>` for llama.cpp's Phi-4-mini template), the object's keys and their
//! order (`name`, then `arguments` or `parameters`), and what separates two calls of one turn (or that
//! the template refuses a second). A template that says how to call without rendering calls (SmolLM 3's
//! instructions) gets the `<tool_call>` form it describes, written into the turn's text.

use serde_json::{json, Value};

use crate::text::chat::{python_json, ChatMessage, ChatTemplate, Piece};
use crate::text::tokenizer::{TokenKind, Tokenizer};
use crate::tools::{ToolCall, ToolSpec};

/// Qwen 2.5's markers, which [`CallSyntax::hermes`] uses.
pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

/// How a model writes its calls.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallSyntax {
    /// The text before each call's JSON object (`<tool_call>\n`; empty for Llama 3.x).
    pub open: String,
    /// The text after it (`\n</tool_call>`).
    pub close: String,
    /// Between two calls of one turn (`\n`); `None` where the template takes one call a turn.
    pub separator: Option<String>,
    /// The key of the tool's name (`name`) and of its arguments (`arguments`, `parameters`).
    pub name_key: String,
    pub args_key: String,
    /// Whether the name comes before the arguments in the object.
    pub name_first: bool,
    /// Whether the template renders calls (from a turn's `tool_calls`); else the calls are written into
    /// the turn's text, as the template's instructions describe them.
    pub rendered: bool,
    /// Whether a marker is a control token (`<|tool_call|>`), which a turn's text cannot hold (message
    /// text is tokenized without control tokens): such calls are kept for the template to render.
    pub control_markers: bool,
    /// `open`, `close` and `separator` as Lark sequences: the tokenizer's special tokens by id, the rest
    /// as quoted text (empty for an empty text).
    lark: [String; 3],
}

/// The probe's tool and the values of its calls.
const PROBE_TOOL: &str = "get_weather";
const PROBE_TEXT: &str = "Sunny, 21 degrees.";

impl CallSyntax {
    /// Qwen 2.5's syntax (Hermes): `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`, calls
    /// separated by a newline, rendered by the template.
    pub fn hermes() -> Self {
        Self {
            open: format!("{CALL_OPEN}\n"),
            close: format!("\n{CALL_CLOSE}"),
            separator: Some("\n".into()),
            name_key: "name".into(),
            args_key: "arguments".into(),
            name_first: true,
            rendered: true,
            control_markers: false,
            lark: [format!("{CALL_OPEN} \"\\n\""), format!("\"\\n\" {CALL_CLOSE}"), "\"\\n\"".into()],
        }
    }

    /// The syntax `template` renders calls in (see the module docs), else the `<tool_call>` form its text
    /// describes when the tokenizer has those markers as tokens of their own; `None` when the template
    /// neither renders nor describes calls.
    pub fn of(template: &ChatTemplate, tok: &Tokenizer) -> Option<Self> {
        // Native decisions leave the tool list to the template: one that does not render the tools given
        // (SmolLM 3's takes `xml_tools`; passed too) has no native format.
        let tools = super::tools_value(&[probe_spec()]);
        let opening = template.render(&[ChatMessage::user("Hello.")], true, Some(&tools)).ok()?;
        if !opening.contains(PROBE_TOOL) {
            return None;
        }
        let mut syntax = match Self::probe(template, &tools) {
            Some(s) => s,
            None => Self::described(template, tok)?,
        };
        let texts = [syntax.open.as_str(), syntax.close.as_str(), syntax.separator.as_deref().unwrap_or("")];
        let mut ids = Vec::new();
        for t in texts {
            ids.extend(tok.encode(t, true).ok()?);
        }
        // A marker that ends the turn would stop the generation inside the call.
        let stops = crate::text::chat::stop_tokens(tok, None);
        if ids.iter().any(|id| stops.contains(id)) {
            return None;
        }
        syntax.control_markers = ids.iter().any(|&id| tok.is_special(id));
        syntax.lark = [
            lark_sequence(&syntax.open, tok),
            lark_sequence(&syntax.close, tok),
            lark_sequence(syntax.separator.as_deref().unwrap_or(""), tok),
        ];
        Some(syntax)
    }

    /// The syntax of the calls the template renders, read from two renderings of a probe conversation.
    fn probe(template: &ChatTemplate, tools: &serde_json::Value) -> Option<Self> {
        let call = |city: &str| ToolCall::new(PROBE_TOOL, json!({"city": city, "days": 3}));
        let ask = ChatMessage::user("What is the weather in Oslo and in Bergen?");
        let after = ChatMessage::user("Thanks.");
        let conversation = |turn: ChatMessage| [ask.clone(), turn, after.clone()];
        let render = |turn: ChatMessage| template.render(&conversation(turn), false, Some(tools)).ok();
        let text = render(ChatMessage::assistant(PROBE_TEXT))?;
        let one_call = ChatMessage::calls(vec![call("Oslo").into()]);
        let one = render(one_call.clone())?;
        let turn = turn_text(&text, &one)?;
        let found = find_call(turn, &call("Oslo"))?;
        // Messages' values go through the template as markers (to keep them plain text when tokenized):
        // the template must render them the same way.
        let pieces = template.render_pieces(&conversation(one_call), false, Some(tools)).ok()?;
        let joined: String = pieces.iter().map(Piece::text).collect();
        if joined != one {
            return None;
        }
        // Text around the call that holds the probe's values is not a syntax (a header naming the tool).
        let around = [&turn[..found.start], &turn[found.end..]];
        if around.iter().any(|t| ["Oslo", "Bergen", PROBE_TOOL, "days"].iter().any(|v| t.contains(v))) {
            return None;
        }
        let mut syntax = Self {
            open: turn[..found.start].to_string(),
            close: turn[found.end..].to_string(),
            separator: None,
            name_key: found.name_key,
            args_key: found.args_key,
            name_first: found.name_first,
            rendered: true,
            control_markers: false,
            lark: Default::default(),
        };
        // A second call: refused (Llama 3.x), or after a separator.
        let calls = [call("Oslo"), call("Bergen")];
        syntax.separator =
            render(ChatMessage::calls(calls.iter().cloned().map(Into::into).collect())).and_then(|two| {
                let turn = turn_text(&text, &two)?;
                let rest = turn.strip_prefix(&syntax.render(&calls[..1]))?;
                let sep = rest.strip_suffix(&syntax.render(&calls[1..]))?;
                (!sep.contains("Oslo") && !sep.contains("Bergen")).then(|| sep.to_string())
            });
        Some(syntax)
    }

    /// Qwen's form where the template's text describes it (`tools`, `<tool_call>`, `</tool_call>`) and each
    /// marker is one token even in message text (user-defined, as Qwen's and SmolLM 3's are).
    fn described(template: &ChatTemplate, tok: &Tokenizer) -> Option<Self> {
        let src = template.source();
        let described = src.contains("tools") && src.contains(CALL_OPEN) && src.contains(CALL_CLOSE);
        let one_token = |s: &str| tok.encode(s, false).ok().is_some_and(|ids| ids.len() == 1);
        (described && one_token(CALL_OPEN) && one_token(CALL_CLOSE)).then(|| Self { rendered: false, ..Self::hermes() })
    }

    /// Whether a call may also be written as a fenced JSON block ([`FENCE_OPEN`](super::FENCE_OPEN)): Qwen
    /// 2.5 Coder's habit, allowed where the syntax is Qwen's.
    pub fn fenced(&self) -> bool {
        self.open.trim() == CALL_OPEN
    }

    /// At most how many calls a turn can make, given the settings' `wanted`.
    pub fn max_calls(&self, wanted: usize) -> usize {
        match self.separator {
            Some(_) => wanted.max(1),
            None => 1,
        }
    }

    /// One call's JSON object, keys in the syntax's order.
    pub fn call_json(&self, call: &ToolCall) -> String {
        let mut m = serde_json::Map::new();
        let (name, args) = ((&self.name_key, Value::String(call.tool.clone())), (&self.args_key, call.args.clone()));
        let (first, second) = if self.name_first { (name, args) } else { (args, name) };
        m.insert(first.0.clone(), first.1);
        m.insert(second.0.clone(), second.1);
        python_json(&Value::Object(m))
    }

    /// Calls as the model writes them (and as the template renders them).
    pub fn render(&self, calls: &[ToolCall]) -> String {
        let sep = self.separator.as_deref().unwrap_or("\n");
        calls.iter().map(|c| format!("{}{}{}", self.open, self.call_json(c), self.close)).collect::<Vec<_>>().join(sep)
    }

    /// The assistant turn that keeps `calls` in the conversation: the calls for the template to render,
    /// or their text where it renders none or cannot render so many in one turn.
    pub fn turn(&self, calls: Vec<ToolCall>) -> ChatMessage {
        if self.rendered && calls.len() <= self.max_calls(calls.len()) {
            ChatMessage::calls(calls.into_iter().map(Into::into).collect())
        } else {
            ChatMessage::assistant(self.render(&calls))
        }
    }

    /// The assistant turn that keeps a reply of calls as the model wrote it (`text`): the text itself,
    /// whose tokens are those generated (a number as written, `2.50`; a fenced call), unless a marker is
    /// a control token, which message text cannot hold: then the calls, for the template to render.
    pub fn kept_turn(&self, text: &str, calls: Vec<ToolCall>) -> ChatMessage {
        if self.control_markers {
            self.turn(calls)
        } else {
            ChatMessage::assistant(text)
        }
    }

    /// The Lark sequences of `open`, `close` and the separator (see the field).
    pub(crate) fn lark(&self) -> &[String; 3] {
        &self.lark
    }
}

/// The syntax in one line: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>, several a turn`.
impl std::fmt::Display for CallSyntax {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let escaped = |t: &str| t.escape_debug().to_string();
        let (name, args) = (format!("\"{}\": …", self.name_key), format!("\"{}\": …", self.args_key));
        let (first, second) = if self.name_first { (name, args) } else { (args, name) };
        write!(f, "{}{{{first}, {second}}}{}", escaped(&self.open), escaped(&self.close))?;
        match &self.separator {
            Some(_) => f.write_str(", several a turn")?,
            None => f.write_str(", one a turn")?,
        }
        if !self.rendered {
            f.write_str(", written into the turn's text")?;
        }
        Ok(())
    }
}

/// The probe's tool.
fn probe_spec() -> ToolSpec {
    ToolSpec {
        name: PROBE_TOOL.into(),
        description: "Current weather in a city.".into(),
        parameters: json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}
        }, "required": ["city"]}),
    }
}

/// Where the assistant turn's text is in `other`, a rendering of the probe conversation that differs
/// from `text` (the same conversation with [`PROBE_TEXT`] as the turn) only in that turn.
fn turn_text<'a>(text: &str, other: &'a str) -> Option<&'a str> {
    let mut pre = text.bytes().zip(other.bytes()).take_while(|(a, b)| a == b).count();
    while !text.is_char_boundary(pre) || !other.is_char_boundary(pre) {
        pre -= 1;
    }
    let (a, b) = (&text[pre..], &other[pre..]);
    let mut suf = a.bytes().rev().zip(b.bytes().rev()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(a.len() - suf) || !b.is_char_boundary(b.len() - suf) {
        suf -= 1;
    }
    (&a[..a.len() - suf] == PROBE_TEXT).then(|| &b[..b.len() - suf])
}

/// A call's JSON object found in a turn's text.
struct Found {
    start: usize,
    end: usize,
    name_key: String,
    args_key: String,
    name_first: bool,
}

/// The JSON object in `turn` that is `call`: two keys, one the tool's name and one its arguments, written
/// as Python's `json.dumps` writes it.
fn find_call(turn: &str, call: &ToolCall) -> Option<Found> {
    turn.match_indices('{').find_map(|(start, _)| {
        let mut values = serde_json::Deserializer::from_str(&turn[start..]).into_iter::<Value>();
        let Some(Ok(Value::Object(m))) = values.next() else { return None };
        let end = start + values.byte_offset();
        if m.len() != 2 {
            return None;
        }
        let name_at = m.values().position(|v| v.as_str() == Some(call.tool.as_str()))?;
        let args_at = m.values().position(|v| v == &call.args)?;
        let key = |i: usize| m.keys().nth(i).cloned();
        let written = &turn[start..end];
        // As `tojson` writes it (the arguments go through the template as markers and come back so).
        if written != python_json(&Value::Object(m.clone())) {
            return None;
        }
        Some(Found { start, end, name_key: key(name_at)?, args_key: key(args_at)?, name_first: name_at == 0 })
    })
}

/// `text` as a Lark sequence: the tokenizer's special and user-defined tokens by id (`<[151657]>`), the
/// text between them quoted; `""` for no text.
fn lark_sequence(text: &str, tok: &Tokenizer) -> String {
    let Ok(ids) = tok.encode(text, true) else { return serde_json::to_string(text).unwrap_or_default() };
    let mut parts = Vec::new();
    let mut run: Vec<u8> = Vec::new();
    let flush = |run: &mut Vec<u8>, parts: &mut Vec<String>| {
        if !run.is_empty() {
            let s = String::from_utf8_lossy(run).into_owned();
            // JSON leaves DEL as it is; the grammar's lexer wants it escaped.
            parts.push(serde_json::to_string(&s).unwrap_or_default().replace('\u{7f}', "\\u007f"));
            run.clear();
        }
    };
    for id in ids {
        if tok.is_special(id) || tok.token_kind(id) == Some(TokenKind::UserDefined) {
            flush(&mut run, &mut parts);
            parts.push(format!("<[{id}]>"));
        } else {
            run.extend_from_slice(tok.token_bytes(id));
        }
    }
    flush(&mut run, &mut parts);
    if parts.is_empty() {
        "\"\"".into()
    } else {
        parts.join(" ")
    }
}
