//! The OpenAI chat-completions request, read from untrusted JSON into checked values: every refusal is a
//! 400 with the API's error object, naming the field (`messages[2].role`, `tools[0].function.parameters`).

use serde_json::{json, Map, Value};

use crate::tools::{ToolCall, ToolSpec};

/// Limits on what one request may carry.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_tools: usize,
    pub max_messages: usize,
    pub max_stops: usize,
    /// How long a client may take to send a request's head, to send its body, or to take the next part
    /// of a response, and how long a kept-alive connection may stay idle. Past it the connection is
    /// closed (a body's sender is answered 408 first); a response it stopped taking is cancelled.
    pub client_timeout: std::time::Duration,
    /// Connections open at once; more wait to be accepted until one closes.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            max_tools: 128,
            max_messages: 1024,
            max_stops: 4,
            client_timeout: std::time::Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

setters!(Limits {
    max_body_bytes: usize,
    max_tools: usize,
    max_messages: usize,
    max_stops: usize,
    client_timeout: std::time::Duration,
    max_connections: usize,
});

/// An error as the API returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// `invalid_request_error`, `server_error`, …
    pub kind: &'static str,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { status: 400, message: message.into(), param: Some(param.into()), kind: "invalid_request_error" }
    }

    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, kind }
    }

    /// The body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": null}})
    }
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Auto,
    None,
    Required,
    Function(String),
}

/// `response_format`, `structured_outputs` (vLLM's field, which reagent's remote driver sends), or
/// `grammar` (llama.cpp's servers' field, GBNF, read into Lark: [`crate::decode::gbnf`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    Text,
    JsonObject,
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (`structured_outputs.grammar`).
    Grammar(String),
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    System(String),
    User(String),
    /// Text, and the calls it made (with their ids).
    Assistant {
        content: Option<String>,
        calls: Vec<(String, ToolCall)>,
    },
    Tool {
        call_id: String,
        content: String,
    },
}

/// A checked chat-completions request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub choice: Choice,
    pub parallel_tool_calls: bool,
    pub format: Format,
    pub temperature: f32,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Added to the logits of these tokens at every sampled position (`logit_bias`, -100 to 100).
    pub logit_bias: Vec<(u32, f32)>,
    /// A completions request's prompt (`POST /v1/completions`), in place of `messages`.
    pub prompt: Option<Prompt>,
    /// Control tokens' texts kept in a generation's text (`skip_special_tokens: false`, vLLM's field; not
    /// streamed): a client that reads a model's call syntax (`<tool_call>`) itself.
    pub special_text: bool,
}

/// The prompt of `POST /v1/completions`: text, whose special tokens' texts (`<|im_start|>`) are read as
/// those tokens (as llama.cpp's and vLLM's servers read them), or token ids, taken as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// The most entries of a `logit_bias`.
const MAX_LOGIT_BIAS: usize = 1024;

type Res<T> = std::result::Result<T, ApiError>;

/// Reads a request body.
pub fn parse_chat(body: &[u8], limits: &Limits) -> Res<ChatRequest> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad("body", format!("the body is not JSON: {e}")))?;
    let Value::Object(o) = v else { return Err(ApiError::bad("body", "the body must be a JSON object")) };
    let model = opt_str(&o, "model")?.map(String::from);
    let messages = match o.get("messages") {
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::bad("messages", "must not be empty")),
        Some(Value::Array(a)) if a.len() > limits.max_messages => {
            return Err(ApiError::bad("messages", format!("{} messages; at most {}", a.len(), limits.max_messages)))
        }
        Some(Value::Array(a)) => a.iter().enumerate().map(|(i, m)| message(i, m)).collect::<Res<Vec<_>>>()?,
        Some(_) => return Err(ApiError::bad("messages", "must be an array of messages")),
        None => return Err(ApiError::bad("messages", "is required")),
    };
    if !messages.iter().any(|m| matches!(m, Message::User(_))) {
        return Err(ApiError::bad("messages", "there must be a user message"));
    }
    let tools = match o.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.len() > limits.max_tools => {
            return Err(ApiError::bad("tools", format!("{} tools; at most {}", a.len(), limits.max_tools)))
        }
        Some(Value::Array(a)) => a.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Res<Vec<_>>>()?,
        Some(_) => return Err(ApiError::bad("tools", "must be an array of tools")),
    };
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::bad(format!("tools[{i}].function.name"), format!("`{}` is defined twice", t.name)));
        }
    }
    let choice = match o.get("tool_choice") {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "none" => Choice::None,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("`{other}`: expected auto, none, required or a function"),
                ))
            }
        },
        Some(Value::Object(c)) => {
            let name = c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (c.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => Choice::Function(n.to_string()),
                _ => {
                    return Err(ApiError::bad(
                        "tool_choice",
                        "expected {\"type\": \"function\", \"function\": {\"name\": …}}",
                    ))
                }
            }
        }
        Some(_) => return Err(ApiError::bad("tool_choice", "expected a string or an object")),
    };
    match &choice {
        Choice::Function(n) if !tools.iter().any(|t| &t.name == n) => {
            return Err(ApiError::bad("tool_choice", format!("no tool `{n}` in `tools`")))
        }
        Choice::Required | Choice::Function(_) if tools.is_empty() => {
            return Err(ApiError::bad("tool_choice", "a tool call is required but no tools are given"))
        }
        _ => {}
    }
    let format = match o.get("response_format") {
        None | Some(Value::Null) => Format::Text,
        Some(Value::Object(f)) => match f.get("type").and_then(Value::as_str) {
            Some("text") => Format::Text,
            Some("json_object") => Format::JsonObject,
            Some("json_schema") => match f.get("json_schema").and_then(|j| j.get("schema")) {
                Some(s @ Value::Object(_)) => Format::JsonSchema(s.clone()),
                Some(Value::Bool(true)) | None => Format::JsonObject,
                _ => return Err(ApiError::bad("response_format.json_schema.schema", "must be a JSON schema object")),
            },
            _ => return Err(ApiError::bad("response_format.type", "expected text, json_object or json_schema")),
        },
        Some(_) => return Err(ApiError::bad("response_format", "must be an object")),
    };
    let format = match o.get("structured_outputs") {
        None | Some(Value::Null) => format,
        Some(_) if format != Format::Text => {
            return Err(ApiError::bad("structured_outputs", "give response_format or structured_outputs, not both"))
        }
        Some(Value::Object(s)) => match (s.get("grammar"), s.get("json")) {
            (Some(Value::String(g)), None) => Format::Grammar(g.clone()),
            (None, Some(j @ Value::Object(_))) => Format::JsonSchema(j.clone()),
            _ => {
                return Err(ApiError::bad(
                    "structured_outputs",
                    "expected {\"grammar\": a Lark grammar} or {\"json\": a JSON schema object}",
                ))
            }
        },
        Some(_) => return Err(ApiError::bad("structured_outputs", "must be an object")),
    };
    // llama.cpp's servers' field: a GBNF grammar, read into Lark.
    let format = match o.get("grammar") {
        None | Some(Value::Null) => format,
        Some(_) if format != Format::Text => {
            return Err(ApiError::bad("grammar", "give one of grammar, response_format and structured_outputs"))
        }
        Some(Value::String(g)) => match crate::decode::gbnf::to_lark(g) {
            Ok(lark) => Format::Grammar(lark),
            Err(e) => return Err(ApiError::bad("grammar", e.to_string())),
        },
        Some(_) => return Err(ApiError::bad("grammar", "must be a GBNF grammar as a string")),
    };
    if format != Format::Text && !tools.is_empty() && choice != Choice::None {
        return Err(ApiError::bad(
            "response_format",
            "a JSON response format with tools is not supported; use tool_choice none",
        ));
    }
    if let Some(n) = o.get("n").filter(|n| !n.is_null()) {
        if n.as_u64() != Some(1) {
            return Err(ApiError::bad("n", "only n = 1 is supported"));
        }
    }
    let temperature = opt_num(&o, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
    let top_p = opt_num(&o, "top_p", 0.0, 1.0)?.map(|p| p as f32).filter(|&p| p < 1.0);
    if top_p == Some(0.0) {
        return Err(ApiError::bad("top_p", "must be above 0"));
    }
    let seed = match o.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|i| i as u64))
                .ok_or_else(|| ApiError::bad("seed", "must be an integer"))?,
        ),
    };
    let max_tokens = match (opt_count(&o, "max_completion_tokens")?, opt_count(&o, "max_tokens")?) {
        (Some(n), _) | (None, Some(n)) => Some(n),
        (None, None) => None,
    };
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= limits.max_stops => a
            .iter()
            .map(|s| s.as_str().map(String::from).ok_or_else(|| ApiError::bad("stop", "must be strings")))
            .collect::<Res<Vec<_>>>()?,
        Some(Value::Array(_)) => return Err(ApiError::bad("stop", format!("at most {} strings", limits.max_stops))),
        Some(_) => return Err(ApiError::bad("stop", "must be a string or an array of strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "a stop string must not be empty"));
    }
    let stream = opt_bool(&o, "stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")?.unwrap_or(false),
        Some(_) => return Err(ApiError::bad("stream_options", "must be an object")),
    };
    let parallel_tool_calls = opt_bool(&o, "parallel_tool_calls")?.unwrap_or(true);
    let special_text = !opt_bool(&o, "skip_special_tokens")?.unwrap_or(true);
    if special_text && stream {
        return Err(ApiError::bad("skip_special_tokens", "false is not supported with stream"));
    }
    let logit_bias = match o.get("logit_bias") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) if m.len() > MAX_LOGIT_BIAS => {
            return Err(ApiError::bad("logit_bias", format!("{} entries; at most {MAX_LOGIT_BIAS}", m.len())))
        }
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let id =
                    k.parse::<u32>().map_err(|_| ApiError::bad("logit_bias", format!("`{k}` is not a token id")))?;
                match v.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                    _ => Err(ApiError::bad(format!("logit_bias.{id}"), "must be a number from -100 to 100")),
                }
            })
            .collect::<Res<Vec<_>>>()?,
        Some(_) => return Err(ApiError::bad("logit_bias", "must be an object of token ids and biases")),
    };
    Ok(ChatRequest {
        model,
        messages,
        tools,
        choice,
        parallel_tool_calls,
        format,
        temperature,
        top_p,
        seed,
        max_tokens,
        stop,
        stream,
        include_usage,
        logit_bias,
        prompt: None,
        special_text,
    })
}

/// Reads a `POST /v1/completions` body: its prompt, and the sampling, length, stop, stream and
/// constraint fields as a chat request reads them. What the legacy API has and reagent does not
/// (`echo`, `suffix`, `logprobs`, `best_of` over 1, several prompts) is refused, naming the field.
pub fn parse_completions(body: &[u8], limits: &Limits) -> Res<ChatRequest> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad("body", format!("the body is not JSON: {e}")))?;
    let Value::Object(mut o) = v else { return Err(ApiError::bad("body", "the body must be a JSON object")) };
    for field in ["messages", "tools", "tool_choice", "suffix"] {
        if o.get(field).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(
                field,
                "is not a field of completions (chat requests go to /v1/chat/completions)",
            ));
        }
    }
    if opt_bool(&o, "echo")? == Some(true) {
        return Err(ApiError::bad("echo", "echoing the prompt is not supported"));
    }
    if o.get("logprobs").is_some_and(|v| !v.is_null() && v != &Value::from(0)) {
        return Err(ApiError::bad("logprobs", "log-probabilities are not supported"));
    }
    if o.get("best_of").is_some_and(|v| !v.is_null() && v.as_u64() != Some(1)) {
        return Err(ApiError::bad("best_of", "only best_of = 1 is supported"));
    }
    let too_long = |n: usize| n > limits.max_body_bytes;
    let prompt = match o.remove("prompt") {
        Some(Value::String(s)) => Prompt::Text(s),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [] => return Err(ApiError::bad("prompt", "must not be empty")),
            ids if ids.iter().all(Value::is_u64) && !too_long(ids.len()) => Prompt::Tokens(
                ids.iter()
                    .map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()))
                    .collect::<Option<_>>()
                    .ok_or_else(|| ApiError::bad("prompt", "a token id is out of range"))?,
            ),
            [_, _, ..] if a.iter().all(Value::is_string) => {
                return Err(ApiError::bad("prompt", "one prompt per request (this server answers n = 1)"))
            }
            _ => return Err(ApiError::bad("prompt", "must be a string or an array of token ids")),
        },
        Some(Value::Null) | None => return Err(ApiError::bad("prompt", "is required")),
        Some(_) => return Err(ApiError::bad("prompt", "must be a string or an array of token ids")),
    };
    // The rest is read as a chat request's (one placeholder turn, dropped after).
    o.insert("messages".into(), serde_json::json!([{"role": "user", "content": ""}]));
    let mut req = parse_chat(Value::Object(o).to_string().as_bytes(), limits)?;
    req.messages.clear();
    req.prompt = Some(prompt);
    Ok(req)
}

fn opt_str<'a>(o: &'a Map<String, Value>, key: &str) -> Res<Option<&'a str>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::bad(key, "must be a string")),
    }
}

fn opt_bool(o: &Map<String, Value>, key: &str) -> Res<Option<bool>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad(key, "must be true or false")),
    }
}

fn opt_num(o: &Map<String, Value>, key: &str, lo: f64, hi: f64) -> Res<Option<f64>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            _ => Err(ApiError::bad(key, format!("must be a number from {lo} to {hi}"))),
        },
    }
}

fn opt_count(o: &Map<String, Value>, key: &str) -> Res<Option<usize>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n.min(1 << 20) as usize)),
            _ => Err(ApiError::bad(key, "must be a positive integer")),
        },
    }
}

/// A message's text: a string, or an array of `{"type": "text", "text": …}` parts.
fn content(at: &str, v: Option<&Value>) -> Res<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            format!("{at}.content[{j}]"),
                            "only text parts ({\"type\": \"text\", \"text\": …}) are supported",
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
        Some(_) => Err(ApiError::bad(format!("{at}.content"), "must be a string or an array of text parts")),
    }
}

fn message(i: usize, m: &Value) -> Res<Message> {
    let at = format!("messages[{i}]");
    let Value::Object(o) = m else { return Err(ApiError::bad(at, "must be an object")) };
    let role =
        o.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::bad(format!("{at}.role"), "is required"))?;
    let text = content(&at, o.get("content"))?;
    let required = |t: Option<String>| t.ok_or_else(|| ApiError::bad(format!("{at}.content"), "is required"));
    Ok(match role {
        "system" | "developer" => Message::System(required(text)?),
        "user" => Message::User(required(text)?),
        "assistant" => {
            let calls = match o.get("tool_calls") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => {
                    a.iter().enumerate().map(|(j, c)| assistant_call(&at, j, c)).collect::<Res<_>>()?
                }
                Some(_) => return Err(ApiError::bad(format!("{at}.tool_calls"), "must be an array")),
            };
            if text.is_none() && calls.is_empty() {
                return Err(ApiError::bad(format!("{at}.content"), "an assistant message needs content or tool_calls"));
            }
            Message::Assistant { content: text, calls }
        }
        "tool" => {
            let call_id = o
                .get("tool_call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad(format!("{at}.tool_call_id"), "is required for a tool message"))?;
            Message::Tool { call_id: call_id.to_string(), content: text.unwrap_or_default() }
        }
        other => {
            return Err(ApiError::bad(
                format!("{at}.role"),
                format!("`{other}`: expected system, developer, user, assistant or tool"),
            ))
        }
    })
}

fn assistant_call(at: &str, j: usize, c: &Value) -> Res<(String, ToolCall)> {
    let at = format!("{at}.tool_calls[{j}]");
    let id = c.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
    let f = c.get("function").ok_or_else(|| ApiError::bad(format!("{at}.function"), "is required"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad(format!("{at}.function.name"), "is required"))?;
    let args = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map_err(|e| ApiError::bad(format!("{at}.function.arguments"), format!("not JSON: {e}")))?,
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => json!({}),
        Some(_) => return Err(ApiError::bad(format!("{at}.function.arguments"), "must be a JSON string")),
    };
    Ok((id, ToolCall::new(name, args)))
}

fn tool(i: usize, t: &Value) -> Res<ToolSpec> {
    let at = format!("tools[{i}]");
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::bad(format!("{at}.type"), "only function tools are supported"));
    }
    let f = t.get("function").ok_or_else(|| ApiError::bad(format!("{at}.function"), "is required"))?;
    if !f.get("parameters").is_none_or(|p| p.is_object() || p.is_null()) {
        return Err(ApiError::bad(format!("{at}.function.parameters"), "must be a JSON schema object"));
    }
    let mut f = f.clone();
    if let Some(o) = f.as_object_mut() {
        if o.get("parameters").is_none_or(Value::is_null) {
            o.insert("parameters".into(), json!({"type": "object", "properties": {}}));
        }
    }
    ToolSpec::from_function_json(&f)
        .map_err(|e| ApiError::bad(format!("{at}.function"), crate::error::one_line(&e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Res<ChatRequest> {
        parse_chat(v.to_string().as_bytes(), &Limits::default())
    }

    #[test]
    fn a_full_request_reads_into_checked_values() {
        let r = parse(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "temperature": 0, "max_tokens": 64, "stop": ["\n\n"], "stream": true,
            "stream_options": {"include_usage": true}, "seed": 5
        }))
        .unwrap();
        assert_eq!(r.messages.len(), 4);
        assert_eq!(r.messages[1], Message::User("weather in Paris?".into()));
        let Message::Assistant { calls, .. } = &r.messages[2] else { panic!("{:?}", r.messages[2]) };
        assert_eq!(calls[0].1.args, json!({"city": "Paris"}));
        assert_eq!(r.choice, Choice::Function("weather".into()));
        assert_eq!(
            (r.temperature, r.max_tokens, r.seed, r.stream, r.include_usage),
            (0.0, Some(64), Some(5), true, true)
        );
    }

    #[test]
    fn structured_outputs_carry_a_grammar_or_a_schema() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let r = parse(json!({"messages": user, "structured_outputs": {"grammar": "start: /a+/"}})).unwrap();
        assert_eq!(r.format, Format::Grammar("start: /a+/".into()));
        let r = parse(json!({"messages": user, "structured_outputs": {"json": {"type": "object"}}})).unwrap();
        assert_eq!(r.format, Format::JsonSchema(json!({"type": "object"})));
        let r = parse(json!({"messages": user, "grammar": "root ::= \"yes\" | \"no\""})).unwrap();
        assert_eq!(r.format, Format::Grammar("start: \"yes\" | \"no\"\n".into()));
    }

    #[test]
    fn each_bad_field_is_named() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"role": "robot", "content": "x"}]}), "messages[0].role"),
            (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
            (json!({"messages": user, "temperature": 3}), "temperature"),
            (json!({"messages": user, "temperature": "hot"}), "temperature"),
            (json!({"messages": user, "max_tokens": 0}), "max_tokens"),
            (
                json!({"messages": user, "tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function",
            ),
            (json!({"messages": user, "tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (json!({"messages": user, "tool_choice": "required"}), "tool_choice"),
            (json!({"messages": user, "tool_choice": "sometimes"}), "tool_choice"),
            (json!({"messages": user, "structured_outputs": {"regex": "a+"}}), "structured_outputs"),
            (json!({"messages": user, "structured_outputs": "start: /a/"}), "structured_outputs"),
            (
                json!({"messages": user, "structured_outputs": {"grammar": "start: /a/"},
                       "response_format": {"type": "json_object"}}),
                "structured_outputs",
            ),
            (json!({"messages": user, "grammar": "root ::= \"a"}), "grammar"),
            (json!({"messages": user, "grammar": 7}), "grammar"),
            (
                json!({"messages": user, "grammar": "root ::= \"a\"", "structured_outputs": {"grammar": "start: /a/"}}),
                "grammar",
            ),
            (json!({"messages": user, "n": 2}), "n"),
            (json!({"messages": user, "stop": [1]}), "stop"),
            (json!({"messages": user, "response_format": {"type": "yaml"}}), "response_format.type"),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]},
                                 {"role": "user", "content": "x"}]}),
                "messages[0].tool_calls[0].function.arguments",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
        }
        let e = parse_chat(b"{not json", &Limits::default()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("body"));
        let many: Vec<Value> =
            (0..200).map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}})).collect();
        let e = parse(json!({"messages": user, "tools": many})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools"));
    }
}
