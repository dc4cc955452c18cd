//! The Responses API (`POST /v1/responses`): a request is read into the chat-completions request it
//! stands for (so one set of checks and limits applies), and the finished request is written back as a
//! `response` object, or as the API's typed stream of events.
//!
//! Stateless: the whole conversation comes in `input` (messages, `function_call` items and their
//! `function_call_output`s); `previous_response_id` is refused, since nothing is stored.

use serde_json::{json, Map, Value};

use super::api::{parse_chat, ApiError, ChatRequest, Limits};
use super::worker::Completion;

type Res<T> = std::result::Result<T, ApiError>;

/// The request fields a response repeats back.
#[derive(Debug, Clone)]
pub(crate) struct Echo {
    instructions: Value,
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: bool,
    temperature: Value,
    top_p: Value,
    max_output_tokens: Value,
    text: Value,
    metadata: Value,
}

/// Reads a Responses request: the chat request it stands for, and what the response repeats.
pub(crate) fn parse_responses(body: &[u8], limits: &Limits) -> Res<(ChatRequest, Echo)> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad("body", format!("the body is not JSON: {e}")))?;
    let Value::Object(o) = v else { return Err(ApiError::bad("body", "the body must be a JSON object")) };
    if o.get("previous_response_id").is_some_and(|p| !p.is_null()) {
        return Err(ApiError::bad(
            "previous_response_id",
            "responses are not stored here: send the whole conversation in `input`",
        ));
    }
    let mut chat = Map::new();
    let mut messages = Vec::new();
    match o.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(ApiError::bad("instructions", "must be a string")),
    }
    match o.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) if items.len() <= limits.max_messages => {
            for (i, item) in items.iter().enumerate() {
                input_item(i, item, &mut messages)?;
            }
        }
        Some(Value::Array(items)) => {
            return Err(ApiError::bad("input", format!("{} items; at most {}", items.len(), limits.max_messages)))
        }
        Some(_) => return Err(ApiError::bad("input", "must be a string or an array of input items")),
        None => return Err(ApiError::bad("input", "is required")),
    }
    chat.insert("messages".into(), Value::Array(messages));
    // Their number is checked with the chat request's.
    let tools = match o.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Res<Vec<_>>>()?,
        Some(_) => return Err(ApiError::bad("tools", "must be an array of tools")),
    };
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    match o.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(s @ Value::String(_)) => {
            chat.insert("tool_choice".into(), s.clone());
        }
        Some(Value::Object(c)) => {
            match (c.get("type").and_then(Value::as_str), c.get("name").and_then(Value::as_str)) {
                (Some("function"), Some(name)) => {
                    chat.insert("tool_choice".into(), json!({"type": "function", "function": {"name": name}}));
                }
                _ => return Err(ApiError::bad("tool_choice", "expected {\"type\": \"function\", \"name\": …}")),
            }
        }
        Some(_) => return Err(ApiError::bad("tool_choice", "expected a string or an object")),
    }
    match o.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => {}
        Some(Value::Object(f)) => {
            let format = match f.get("type").and_then(Value::as_str) {
                Some("json_schema") => json!({"type": "json_schema",
                    "json_schema": {"name": f.get("name"), "schema": f.get("schema")}}),
                Some(kind @ ("text" | "json_object")) => json!({"type": kind}),
                _ => return Err(ApiError::bad("text.format.type", "expected text, json_object or json_schema")),
            };
            chat.insert("response_format".into(), format);
        }
        Some(_) => return Err(ApiError::bad("text.format", "must be an object")),
    }
    for (from, to) in [
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("max_output_tokens", "max_tokens"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("stream", "stream"),
        ("seed", "seed"),
    ] {
        if let Some(v) = o.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    let req = parse_chat(Value::Object(chat).to_string().as_bytes(), limits).map_err(renamed)?;
    let echo = Echo {
        instructions: o.get("instructions").cloned().unwrap_or(Value::Null),
        tools: o.get("tools").cloned().filter(|t| !t.is_null()).unwrap_or(json!([])),
        tool_choice: o.get("tool_choice").cloned().filter(|t| !t.is_null()).unwrap_or(json!("auto")),
        parallel_tool_calls: req.parallel_tool_calls,
        temperature: o.get("temperature").cloned().unwrap_or(json!(1.0)),
        top_p: o.get("top_p").cloned().unwrap_or(json!(1.0)),
        max_output_tokens: o.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        text: o.get("text").cloned().filter(|t| !t.is_null()).unwrap_or(json!({"format": {"type": "text"}})),
        metadata: o.get("metadata").cloned().filter(|m| !m.is_null()).unwrap_or(json!({})),
    };
    Ok((req, echo))
}

/// A chat-completions error in this API's field names: the messages are `input`, a tool's fields sit on
/// the tool itself, `max_tokens` is `max_output_tokens`, the response format is `text.format`.
fn renamed(mut e: ApiError) -> ApiError {
    if let Some(p) = e.param.take() {
        e.param = Some(if p.starts_with("messages") {
            "input".to_string()
        } else if p.starts_with("tools[") {
            p.replacen(".function", "", 1)
        } else if p == "max_tokens" {
            "max_output_tokens".to_string()
        } else if let Some(rest) = p.strip_prefix("response_format") {
            format!("text.format{}", rest.replacen(".json_schema", "", 1))
        } else {
            p
        });
    }
    e
}

/// A message's text as chat content: a string, or `input_text` / `output_text` / `text` parts.
fn item_text(at: &str, content: Option<&Value>) -> Res<String> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (Some("refusal"), _) => text.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or("")),
                    _ => {
                        return Err(ApiError::bad(
                            format!("{at}.content[{j}]"),
                            "only text parts (input_text, output_text) are supported",
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::bad(format!("{at}.content"), "must be a string or an array of text parts")),
    }
}

/// One `input` item as chat messages: function calls join the assistant message before them.
fn input_item(i: usize, item: &Value, messages: &mut Vec<Value>) -> Res<()> {
    let at = format!("input[{i}]");
    let Value::Object(o) = item else { return Err(ApiError::bad(at, "must be an object")) };
    let str_field = |key: &str| {
        o.get(key).and_then(Value::as_str).ok_or_else(|| ApiError::bad(format!("{at}.{key}"), "is required"))
    };
    match o.get("type").and_then(Value::as_str) {
        None | Some("message") => {
            let role = str_field("role")?;
            let role = match role {
                "user" | "assistant" | "system" | "developer" => role,
                other => {
                    return Err(ApiError::bad(
                        format!("{at}.role"),
                        format!("`{other}`: expected user, assistant, system or developer"),
                    ))
                }
            };
            messages.push(json!({"role": role, "content": item_text(&at, o.get("content"))?}));
        }
        Some("function_call") => {
            let call = json!({"id": str_field("call_id")?, "type": "function",
                              "function": {"name": str_field("name")?, "arguments": str_field("arguments")?}});
            match messages.last_mut() {
                Some(m) if m["role"] == "assistant" => match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => m["tool_calls"] = json!([call]),
                },
                _ => messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => {
            let output = match o.get("output") {
                Some(Value::String(s)) => s.clone(),
                out @ Some(Value::Array(_)) => item_text(&format!("{at}.output"), out)?,
                _ => return Err(ApiError::bad(format!("{at}.output"), "must be a string")),
            };
            messages.push(json!({"role": "tool", "tool_call_id": str_field("call_id")?, "content": output}));
        }
        // The model's reasoning from an earlier response: not shown to the model again.
        Some("reasoning") => {}
        Some(other) => {
            return Err(ApiError::bad(
                format!("{at}.type"),
                format!("`{other}`: expected message, function_call, function_call_output or reasoning"),
            ))
        }
    }
    Ok(())
}

/// A Responses function tool (`{"type": "function", "name", "description", "parameters"}`) as a chat one.
fn tool(i: usize, t: &Value) -> Res<Value> {
    let at = format!("tools[{i}]");
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::bad(format!("{at}.type"), "only function tools are supported"));
    }
    let mut f = Map::new();
    for key in ["name", "description", "parameters"] {
        if let Some(v) = t.get(key) {
            f.insert(key.into(), v.clone());
        }
    }
    Ok(json!({"type": "function", "function": f}))
}

/// What every object and event of one response repeats.
pub(crate) struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub echo: Echo,
}

impl ResponseMeta {
    /// The `response` object: `status` with its `output` items and usage (none until the end).
    pub(crate) fn response(&self, status: &str, output: Vec<Value>, usage: Option<Value>) -> Value {
        let e = &self.echo;
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "usage": usage, "error": null,
            "incomplete_details": incomplete, "instructions": e.instructions, "tools": e.tools,
            "tool_choice": e.tool_choice, "parallel_tool_calls": e.parallel_tool_calls,
            "temperature": e.temperature, "top_p": e.top_p, "max_output_tokens": e.max_output_tokens,
            "text": e.text, "metadata": e.metadata, "truncation": "disabled", "store": false,
            "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
        })
    }
}

/// The status a finished request's response has.
pub(crate) fn status(c: &Completion) -> &'static str {
    match c.finish_reason {
        "length" => "incomplete",
        _ => "completed",
    }
}

pub(crate) fn usage(c: &Completion) -> Value {
    json!({"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
           "total_tokens": c.prompt_tokens + c.completion_tokens,
           "input_tokens_details": {"cached_tokens": c.cached_tokens},
           "output_tokens_details": {"reasoning_tokens": 0}})
}

/// An id with the API's prefix.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// The assistant message item holding `text`.
pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// A `function_call` item for each call, each with its own `call_id`.
pub(crate) fn call_items(c: &Completion) -> Vec<Value> {
    c.calls
        .iter()
        .map(|call| {
            json!({"type": "function_call", "id": new_id("fc"), "call_id": new_id("call"), "name": call.tool,
                   "arguments": call.args.to_string(), "status": "completed"})
        })
        .collect()
}

/// The whole response of a finished request.
pub(crate) fn whole(meta: &ResponseMeta, c: &Completion) -> Value {
    let mut output = Vec::new();
    if let Some(text) = c.content.as_deref().filter(|t| !t.is_empty()) {
        output.push(message_item(&new_id("msg"), text, "completed"));
    }
    output.extend(call_items(c));
    meta.response(status(c), output, Some(usage(c)))
}

/// The events of a streamed response, built as the worker's text and end arrive: each `(type, data)`.
pub(crate) struct EventStream {
    pub meta: ResponseMeta,
    sequence: u64,
    /// The message item once its first text arrived: its id and the text so far.
    message: Option<(String, String)>,
    output: Vec<Value>,
}

impl EventStream {
    pub(crate) fn new(meta: ResponseMeta) -> Self {
        Self { meta, sequence: 0, message: None, output: Vec::new() }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> (String, String) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (kind.to_string(), data.to_string())
    }

    /// `response.created` and `response.in_progress`.
    pub(crate) fn start(&mut self) -> Vec<(String, String)> {
        let r = self.meta.response("in_progress", Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    /// Text of the answer: the message item and its text part opened at the first, then a delta.
    pub(crate) fn text(&mut self, delta: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.message.is_none() {
            let id = new_id("msg");
            let item =
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
            out.push(self.event("response.output_item.added", json!({"output_index": 0, "item": item})));
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
            ));
            self.message = Some((id, String::new()));
        }
        let Some((id, text)) = self.message.as_mut() else { unreachable!("opened above") };
        text.push_str(delta);
        let id = id.clone();
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": delta}),
        ));
        out
    }

    /// The end: the text's last part (the answer that stands, where it is not what was streamed), the
    /// message closed, each call as an item with its arguments, and `response.completed`.
    pub(crate) fn done(&mut self, c: &Completion) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(answer) = c.content.as_deref().filter(|t| !t.trim().is_empty()) {
            let streamed = self.message.as_ref().map_or("", |(_, t)| t.as_str());
            if streamed.trim() != answer.trim() {
                // Not streamed, or streamed and then not used: the answer that stands, on a line of its own.
                let rest = if streamed.is_empty() { answer.to_string() } else { format!("\n{answer}") };
                out.extend(self.text(&rest));
            }
        }
        if let Some((id, text)) = self.message.take() {
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            out.push(self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text}),
            ));
            out.push(self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
            ));
            let item = message_item(&id, &text, "completed");
            out.push(self.event("response.output_item.done", json!({"output_index": 0, "item": item})));
            self.output.push(item);
        }
        for item in call_items(c) {
            let index = self.output.len();
            let mut opened = item.clone();
            opened["arguments"] = json!("");
            opened["status"] = json!("in_progress");
            out.push(self.event("response.output_item.added", json!({"output_index": index, "item": opened})));
            let (id, args) = (item["id"].clone(), item["arguments"].clone());
            out.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": args}),
            ));
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": args}),
            ));
            out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
            self.output.push(item);
        }
        let r = self.meta.response(status(c), std::mem::take(&mut self.output), Some(usage(c)));
        let kind = if status(c) == "incomplete" { "response.incomplete" } else { "response.completed" };
        out.push(self.event(kind, json!({"response": r})));
        out
    }

    /// A failure after the stream began: an `error` event.
    pub(crate) fn failed(&mut self, e: &ApiError) -> (String, String) {
        let body = e.body();
        self.event("error", json!({"code": body["error"]["type"], "message": e.message, "param": e.param}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::api::{Choice, Format, Message};

    fn parse(v: Value) -> Res<ChatRequest> {
        parse_responses(v.to_string().as_bytes(), &Limits::default()).map(|(r, _)| r)
    }

    #[test]
    fn a_conversation_with_a_call_and_its_output_reads_as_chat() {
        let r = parse(json!({
            "model": "m", "instructions": "be brief",
            "input": [
                {"role": "user", "content": "weather in Paris?"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
                {"type": "reasoning", "summary": []},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}
            ],
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
            "tool_choice": {"type": "function", "name": "weather"},
            "max_output_tokens": 64, "stream": true, "text": {"format": {"type": "text"}}
        }))
        .unwrap();
        assert_eq!(r.messages[0], Message::System("be brief".into()));
        let Message::Assistant { calls, content } = &r.messages[2] else { panic!("{:?}", r.messages[2]) };
        assert_eq!((calls.len(), content), (2, &None));
        assert_eq!(calls[1].1.args, json!({"city": "Rome"}));
        assert_eq!(r.messages[3], Message::Tool { call_id: "c1".into(), content: "18 C".into() });
        assert_eq!(r.messages[4], Message::User("and now?".into()));
        assert_eq!(r.choice, Choice::Function("weather".into()));
        assert_eq!((r.max_tokens, r.stream, r.format.clone()), (Some(64), true, Format::Text));
        assert_eq!(r.tools[0].name, "weather");
    }

    #[test]
    fn each_bad_field_is_named_in_this_apis_terms() {
        let cases = [
            (json!({}), "input"),
            (json!({"input": 5}), "input"),
            (json!({"input": [{"role": "robot", "content": "x"}]}), "input[0].role"),
            (json!({"input": [{"type": "function_call", "name": "f"}]}), "input[0].call_id"),
            (json!({"input": [{"type": "image", "url": "x"}]}), "input[0].type"),
            (json!({"input": "hi", "previous_response_id": "resp_1"}), "previous_response_id"),
            (json!({"input": "hi", "tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"input": "hi", "tools": [{"type": "function", "name": "a b"}]}), "tools[0]"),
            (json!({"input": "hi", "max_output_tokens": 0}), "max_output_tokens"),
            (json!({"input": "hi", "text": {"format": {"type": "yaml"}}}), "text.format.type"),
            (json!({"input": "hi", "tool_choice": "required"}), "tool_choice"),
            (json!({"input": [{"role": "assistant", "content": "x"}]}), "input"),
        ];
        for (body, param) in cases {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
        }
        let many: Vec<Value> = (0..200).map(|i| json!({"type": "function", "name": format!("t{i}")})).collect();
        let e = parse(json!({"input": "hi", "tools": many})).unwrap_err();
        assert_eq!((e.param.as_deref(), e.message.as_str()), (Some("tools"), "200 tools; at most 128"));
    }

    fn completion(content: Option<&str>, calls: usize, finish: &'static str) -> Completion {
        Completion {
            content: content.map(String::from),
            calls: (0..calls).map(|i| crate::tools::ToolCall::new("weather", json!({"city": i}))).collect(),
            finish_reason: finish,
            prompt_tokens: 10,
            reasoning: None,
            cached_tokens: 4,
            completion_tokens: 5,
        }
    }

    fn meta() -> ResponseMeta {
        let (_, echo) = parse_responses(br#"{"input": "hi"}"#, &Limits::default()).unwrap();
        ResponseMeta { id: "resp_1".into(), created: 1, model: "m".into(), echo }
    }

    #[test]
    fn a_streamed_answer_adds_up_to_the_text_that_stands_and_calls_come_whole() {
        let mut s = EventStream::new(meta());
        let mut events = s.start();
        events.extend(s.text("Hel"));
        events.extend(s.text("lo"));
        events.extend(s.done(&completion(Some("Hello"), 2, "tool_calls")));
        let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds.first(), Some(&"response.created"));
        assert_eq!(kinds.last(), Some(&"response.completed"));
        let data: Vec<Value> = events.iter().map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
        let seq: Vec<u64> = data.iter().map(|d| d["sequence_number"].as_u64().unwrap()).collect();
        assert!(seq.windows(2).all(|w| w[1] == w[0] + 1), "{seq:?}");
        let text: String = data
            .iter()
            .filter(|d| d["type"] == "response.output_text.delta")
            .map(|d| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Hello");
        let last = &data.last().unwrap()["response"];
        assert_eq!(last["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(last["output"].as_array().unwrap().len(), 3);
        assert_eq!(last["output"][2]["type"], "function_call");
        assert_eq!(last["usage"]["input_tokens_details"]["cached_tokens"], 4);

        // A reply streamed and then not used: the answer that stands follows on a line of its own.
        let mut s = EventStream::new(meta());
        s.text("Err");
        let end = s.done(&completion(Some("Paris"), 0, "length"));
        let done: Value =
            serde_json::from_str(&end.iter().find(|(k, _)| k == "response.output_text.done").unwrap().1).unwrap();
        assert_eq!(done["text"], "Err\nParis");
        assert_eq!(end.last().unwrap().0, "response.incomplete");
    }

    #[test]
    fn a_whole_response_has_the_apis_shape() {
        let r = whole(&meta(), &completion(None, 1, "tool_calls"));
        assert_eq!((r["object"].as_str(), r["status"].as_str()), (Some("response"), Some("completed")));
        let item = &r["output"][0];
        assert_eq!((item["type"].as_str(), item["name"].as_str()), (Some("function_call"), Some("weather")));
        assert!(item["call_id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(serde_json::from_str::<Value>(item["arguments"].as_str().unwrap()).unwrap(), json!({"city": 0}));
        assert_eq!(r["usage"]["total_tokens"], 15);
    }
}
