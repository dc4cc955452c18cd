//! Chat templates: the model's own Jinja `tokenizer.chat_template`, rendered with minijinja under the
//! Hugging Face conventions (`messages`, `add_generation_prompt`, `tools`, `bos_token`, `eos_token`,
//! `raise_exception`, Python-style `tojson`, Python string methods, trimmed blocks).

use std::sync::Arc;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use super::tokenizer::{TokenKind, Tokenizer};
use crate::error::{Error, Result};

/// ChatML, used for files of the llama family that carry no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + \
message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turn format, used for `gemma3` files that carry no `tokenizer.chat_template`.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{%- if messages and messages[0]['role'] == 'system' -%}\
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}\
{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}\
{%- for message in loop_messages -%}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

/// The template of a file that carries none, by GGUF architecture name: Gemma's turn format, else ChatML.
pub fn fallback_template(arch: &str) -> &'static str {
    match arch {
        "gemma3" => GEMMA_TEMPLATE,
        _ => CHATML_TEMPLATE,
    }
}

/// Texts of end-of-turn control tokens used by common chat formats (as llama.cpp's EOG list).
const END_OF_TURN_TEXTS: &[&str] =
    &["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<|end_of_text|>", "<EOT>"];

/// Tokens that end a turn or the text: EOS, the file's end-of-turn id, and every control token whose text
/// is a common end-of-turn marker; sorted, without duplicates.
pub fn stop_tokens(tok: &Tokenizer, eot: Option<u32>) -> Vec<u32> {
    let mut stops: Vec<u32> = tok.eos().into_iter().chain(eot).collect();
    stops.extend(
        END_OF_TURN_TEXTS
            .iter()
            .filter_map(|t| tok.token_id(t))
            .filter(|&id| tok.token_kind(id) == Some(TokenKind::Control)),
    );
    stops.sort_unstable();
    stops.dedup();
    stops
}

/// Who speaks a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// An assistant turn's calls, which the template renders in the model's own syntax (the Hugging Face
    /// `tool_calls`; see [`ChatMessage::calls`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatCall>,
}

/// One call of an assistant turn: the tool's name and its arguments (a JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChatCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl ChatCall {
    pub fn new(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Self { name: name.into(), arguments }
    }
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), tool_calls: Vec::new() }
    }
    /// An assistant turn that makes `calls` (no text).
    pub fn calls(calls: Vec<ChatCall>) -> Self {
        Self { role: Role::Assistant, content: String::new(), tool_calls: calls }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: String,
    bos: String,
    eos: String,
    /// Where the template came from, named in its errors.
    origin: Option<String>,
    /// The `enable_thinking` variable of templates with a thinking section (unset: the template's default).
    enable_thinking: Option<bool>,
}

/// The markers of a thinking section (Qwen 3, SmolLM 3).
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// `json.dumps` separators (", " and ": "), which HF's `tojson` produces and templates expect.
struct PyFormatter;

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// Serialises a value the way Python's `json.dumps(v, ensure_ascii=False)` does.
pub fn python_json(v: &impl Serialize) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PyFormatter);
    v.serialize(&mut ser).expect("serialising to a Vec cannot fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// HF's `tojson`: Python's `json.dumps(v, ensure_ascii=False)`, with `indent=N` as Python indents (N spaces
/// a level; Llama 3.x's template lists tools with `tojson(indent=4)`).
fn tojson(v: Value, indent: Option<Value>, kwargs: minijinja::value::Kwargs) -> std::result::Result<Value, JinjaError> {
    let bad = |e: String| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    // Taken as HF's defaults: `ensure_ascii` off, Python's separators.
    for key in ["ensure_ascii", "separators"] {
        let _: Option<Value> = kwargs.get(key)?;
    }
    kwargs.assert_all_used()?;
    let mut json = serde_json::to_value(&v).map_err(|e| bad(e.to_string()))?;
    if sort_keys {
        sort_object_keys(&mut json);
    }
    let s = match indent.filter(|i| !i.is_none()) {
        None => python_json(&json),
        Some(n) => {
            // Python takes a number of spaces or a string; more than a screen of spaces is no indent.
            let unit = match n.as_usize() {
                Some(n) => " ".repeat(n.min(64)),
                None => n.as_str().map(str::to_string).ok_or_else(|| bad("indent must be a number".into()))?,
            };
            let mut out = Vec::new();
            let fmt = serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            serde::Serialize::serialize(&json, &mut ser).map_err(|e| bad(e.to_string()))?;
            String::from_utf8(out).map_err(|e| bad(e.to_string()))?
        }
    };
    Ok(Value::from_safe_string(s))
}

/// Sorts every object's keys, as `json.dumps(sort_keys=True)` writes them.
fn sort_object_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.sort_keys();
            m.values_mut().for_each(sort_object_keys);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(sort_object_keys),
        _ => {}
    }
}

/// The source with HF's `{% generation %}` … `{% endgeneration %}` (which marks the assistant's text for
/// training masks, in SmolLM 3's template; minijinja has no such tag) as a block that is always taken,
/// whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    static TAG: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let tag = TAG.get_or_init(|| regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("a valid pattern"));
    tag.replace_all(source, |c: &regex::Captures<'_>| {
        let (open, close) = (&c[1], &c[3]);
        match c.get(2) {
            Some(_) => format!("{{%{open} endif {close}%}}"),
            None => format!("{{%{open} if true {close}%}}"),
        }
    })
    .into_owned()
}

fn raise_exception(msg: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// Instructions one render may run: Qwen's template with 100 tools uses well under a hundredth of this.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// Heap one render may hold (with the binary's [`crate::limits::BudgetAllocator`]): Qwen's template with
/// 100 tools needs well under a megabyte.
pub const TEMPLATE_MEMORY: usize = 256 << 20;

impl ChatTemplate {
    /// Compiles `source`; the tokenizer supplies `bos_token` and `eos_token`.
    pub fn new(source: &str, tok: &Tokenizer) -> Result<Self> {
        let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // A template is untrusted input (it comes inside the model file): each render gets a bounded number
        // of instructions, so a loop bomb is an error, not a hang.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| -> String {
            // Templates use this for "today's date"; a fixed, documented value keeps prompts reproducible.
            let _ = fmt;
            "01 January 2026".to_string()
        });
        env.add_template_owned("chat", without_generation_tags(source)).map_err(|e| Error::ChatTemplate {
            origin: None,
            problem: format!("cannot parse the template: {e}"),
            source: Some(e),
        })?;
        Ok(Self {
            env: Arc::new(env),
            source: source.to_string(),
            bos: text(tok.bos()),
            eos: text(tok.eos()),
            origin: None,
            enable_thinking: None,
        })
    }

    /// Names where the template came from (a model file), for error messages.
    pub fn with_origin(mut self, origin: impl Into<String>) -> Self {
        self.origin = Some(origin.into());
        self
    }

    fn error(&self, problem: String, source: Option<minijinja::Error>) -> Error {
        Error::ChatTemplate { origin: self.origin.clone(), problem, source }
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template has a thinking section it turns on and off by `enable_thinking` (Qwen 3,
    /// SmolLM 3): `<think>…</think>` before the answer.
    pub fn has_thinking(&self) -> bool {
        self.source.contains(THINK_OPEN) && self.source.contains("enable_thinking")
    }

    /// The template rendering with `enable_thinking` set to `on` (for templates without a thinking
    /// section, the same rendering).
    pub fn with_thinking(&self, on: bool) -> Self {
        Self { enable_thinking: Some(on), ..self.clone() }
    }

    /// Renders a conversation. `tools` is passed to the template as the HF `tools` variable.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let values = template_messages(
            messages,
            |_, m| m.content.clone(),
            |_, _, c| c.name.clone(),
            |_, _, c| c.arguments.clone(),
        );
        self.render_values(values, add_generation_prompt, tools)
    }

    fn render_values(
        &self,
        messages: Vec<serde_json::Value>,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        self.env.get_template("chat").map_err(|e| self.error(e.to_string(), Some(e)))?;
        let (env, tools) = (self.env.clone(), tools.cloned());
        let (bos, eos) = (self.bos.clone(), self.eos.clone());
        let thinking = self.enable_thinking;
        // Fuel bounds the instructions; the memory budget bounds what a few instructions can ask for.
        let rendered = crate::limits::with_memory_budget(TEMPLATE_MEMORY, move || {
            let tmpl = env.get_template("chat")?;
            let mut ctx = minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => bos,
                eos_token => eos,
                tools => tools.clone(),
            };
            // SmolLM 3's template takes its tools as `xml_tools` (and tests whether it is defined).
            if let Some(tools) = tools {
                ctx = minijinja::context! { xml_tools => tools, ..ctx };
            }
            // Set only when asked: a template tests whether it is defined.
            match thinking {
                Some(on) => tmpl.render(minijinja::context! { enable_thinking => on, ..ctx }),
                None => tmpl.render(ctx),
            }
        });
        match rendered {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(e)) => Err(self.error(format!("rendering failed: {e}"), Some(e))),
            Err(crate::limits::Exceeded::Memory) => {
                Err(self.error(format!("rendering failed: it needs more than {} MiB", TEMPLATE_MEMORY >> 20), None))
            }
            Err(crate::limits::Exceeded::Stack) => {
                Err(self
                    .error("rendering failed: it recurses without end (a value that contains itself?)".into(), None))
            }
        }
    }
}

/// Marks a message's content inside rendered template text (private-use characters no template emits).
const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

/// A piece of rendered template text: the template's own (where control tokens may be written) or a
/// message's, which is always plain text: its content, or a call's name or arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Template(String),
    Text(String),
    /// A call's name or arguments, inside the template's own text for the call (`"arguments": ` …
    /// `}`): tokenized as one text with it, as the model wrote the call.
    Call(String),
}

impl Piece {
    /// The piece's text.
    pub fn text(&self) -> &str {
        match self {
            Self::Template(t) | Self::Text(t) | Self::Call(t) => t,
        }
    }
}

/// A conversation as templates see it (the Hugging Face shape: an assistant turn's calls are `tool_calls`,
/// each `{"type": "function", "function": {"name", "arguments"}}`); `arguments` gives each call's
/// arguments value, by message and call.
fn template_messages(
    messages: &[ChatMessage],
    mut content: impl FnMut(usize, &ChatMessage) -> String,
    mut name: impl FnMut(usize, usize, &ChatCall) -> String,
    mut arguments: impl FnMut(usize, usize, &ChatCall) -> serde_json::Value,
) -> Vec<serde_json::Value> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut v = serde_json::json!({"role": m.role, "content": content(i, m)});
            if !m.tool_calls.is_empty() {
                let calls: Vec<serde_json::Value> = m
                    .tool_calls
                    .iter()
                    .enumerate()
                    .map(|(j, c)| {
                        serde_json::json!({"type": "function", "function": {
                            "name": name(i, j, c), "arguments": arguments(i, j, c)
                        }})
                    })
                    .collect();
                v["tool_calls"] = serde_json::Value::Array(calls);
            }
            v
        })
        .collect()
}

impl ChatTemplate {
    /// Renders and tokenizes a conversation so that only the template's own text can produce control
    /// tokens: the template output is encoded with special-token parsing on, every message's content and
    /// every call's arguments with it off. A tool output or user text containing `<|im_end|>` stays plain
    /// text.
    pub fn render_tokens(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>> {
        // A message's content is tokenized on its own, as reagent always has (its edges stay where the
        // message's are); a call's name and arguments with the template text around them, which
        // writes the rest of the call.
        let mut out = Vec::new();
        let mut run: Vec<(&str, bool)> = Vec::new();
        let pieces = self.render_pieces(messages, add_generation_prompt, tools)?;
        for p in &pieces {
            match p {
                Piece::Template(t) => run.push((t, true)),
                Piece::Call(t) => run.push((t, false)),
                Piece::Text(t) => {
                    out.extend(tok.encode_spans(&std::mem::take(&mut run))?);
                    out.extend(tok.encode(t, false)?);
                }
            }
        }
        out.extend(tok.encode_spans(&run)?);
        Ok(out)
    }

    /// The rendering of [`render_tokens`](Self::render_tokens), in pieces: each message's content and each
    /// call's arguments (as `tojson` writes them) go through the template as markers and come back as
    /// [`Piece::Text`]. A template that quotes an arguments marker (`tojson` of a string) has the quotes
    /// taken off; one that reads into the arguments (their keys) renders differently from
    /// [`render`](Self::render), which the call syntax's probe checks.
    pub fn render_pieces(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<Piece>> {
        let marked = template_messages(
            messages,
            // Empty content stays empty: templates test it (`{% if message.content %}`).
            |i, m| if m.content.is_empty() { String::new() } else { format!("{OPEN}{i}{CLOSE}") },
            |i, j, _| format!("{OPEN}{i}.{j}.n{CLOSE}"),
            |i, j, _| serde_json::Value::String(format!("{OPEN}{i}.{j}{CLOSE}")),
        );
        let text = self.render_values(marked, add_generation_prompt, tools)?;
        let altered = || self.error("template altered a message marker".into(), None);
        let mut out = Vec::new();
        let mut rest = text.as_str();
        while let Some(start) = rest.find(OPEN) {
            let mut before = &rest[..start];
            let after = &rest[start + OPEN.len_utf8()..];
            let end = after.find(CLOSE).ok_or_else(|| self.error("template split a message marker".into(), None))?;
            let mut next = &after[end + CLOSE.len_utf8()..];
            // Quoted (`tojson` of a string): the quotes and escapes `tojson` writes, as text.
            let mut quoted = || match (before.strip_suffix('"'), next.strip_prefix('"')) {
                (Some(b), Some(n)) => {
                    (before, next) = (b, n);
                    true
                }
                _ => false,
            };
            let number = |s: &str| s.parse::<usize>().map_err(|_| altered());
            let parts: Vec<&str> = after[..end].split('.').collect();
            let piece = match parts.as_slice() {
                [i] => {
                    let content = &messages.get(number(i)?).ok_or_else(altered)?.content;
                    Piece::Text(if quoted() { python_json(content) } else { content.clone() })
                }
                [i, j, rest @ ..] => {
                    let (i, j) = (number(i)?, number(j)?);
                    let call: &ChatCall = messages.get(i).and_then(|m| m.tool_calls.get(j)).ok_or_else(altered)?;
                    Piece::Call(match rest {
                        // A call's name is the client's text on the server: never a control token either.
                        ["n"] if quoted() => python_json(&call.name),
                        ["n"] => call.name.clone(),
                        [] => {
                            quoted();
                            python_json(&call.arguments)
                        }
                        _ => return Err(altered()),
                    })
                }
                _ => return Err(altered()),
            };
            if !before.is_empty() {
                out.push(Piece::Template(before.to_string()));
            }
            if !piece.text().is_empty() {
                out.push(piece);
            }
            rest = next;
        }
        if !rest.is_empty() {
            out.push(Piece::Template(rest.to_string()));
        }
        Ok(out)
    }
}
