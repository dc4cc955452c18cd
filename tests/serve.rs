//! `reagent serve` over HTTP on a free loopback port, driven at the byte level: the API's shapes (plain
//! chat, streaming, tool calls under each `tool_choice`, JSON response formats), tool calls that validate
//! against their schemas, 400s naming the field for malformed requests (and the server serving on after
//! them), authentication.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::tiny_long_path;
use reagent::agent::ModelDriver;
use reagent::model::Arch;
use reagent::serve::{ServeOptions, Server};
use reagent::{LanguageModel, LoadOptions, Model, Sampling};
use serde_json::{json, Value};

fn server(opts: ServeOptions) -> Server {
    let model = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
    let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    Server::start(driver, opts.host("127.0.0.1".into()).port(0)).unwrap()
}

/// One HTTP/1.1 exchange: the status and the body (de-chunked).
fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A body past the limit is refused before it is all read: the rest may not be taken.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response: {text:?}"));
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    (status, if chunked { dechunk(rest) } else { rest.to_string() })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn post(addr: SocketAddr, body: &Value) -> (u16, Value) {
    post_to(addr, "/v1/chat/completions", body)
}

fn post_to(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = http(addr, "POST", path, body.to_string().as_bytes(), &[]);
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"enum": ["C", "F"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "forecast", "description": "Weather in the next days",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}}
    ])
}

/// Each returned call names a given tool and its arguments validate against that tool's schema.
fn check_calls(message: &Value, tools: &Value) -> Vec<String> {
    let calls = message["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool_calls: {message}"));
    assert!(!calls.is_empty());
    calls
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "function");
            assert!(c["id"].as_str().is_some_and(|id| !id.is_empty()));
            let name = c["function"]["name"].as_str().unwrap();
            let tool = tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name);
            let schema = &tool.unwrap_or_else(|| panic!("`{name}` is no given tool"))["function"]["parameters"];
            let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            let v = jsonschema::validator_for(schema).unwrap();
            assert!(v.is_valid(&args), "{name} {args} breaks {schema}");
            name.to_string()
        })
        .collect()
}

#[test]
fn chat_tools_and_json_answers_come_in_the_apis_shapes() {
    let s = server(ServeOptions::default());
    let a = s.addr();
    assert_eq!(http(a, "GET", "/health", b"", &[]).0, 200);
    let (status, models) = http(a, "GET", "/v1/models", b"", &[]);
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&models).unwrap()["object"], "list");

    let user = json!([{"role": "user", "content": "hello world"}]);
    let (status, r) = post(a, &json!({"model": "m", "messages": user, "max_tokens": 12, "temperature": 0}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    let content = r["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(["stop", "length"].contains(&r["choices"][0]["finish_reason"].as_str().unwrap()));
    assert_eq!(
        r["usage"]["total_tokens"],
        r["usage"]["prompt_tokens"].as_u64().unwrap() + r["usage"]["completion_tokens"].as_u64().unwrap()
    );

    // The same request streamed: chunks whose text adds up to the same answer, then [DONE].
    let body = json!({"messages": user, "max_tokens": 12, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (status, sse) = http(a, "POST", "/v1/chat/completions", body.to_string().as_bytes(), &[]);
    assert_eq!(status, 200);
    let data: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{sse}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(streamed, content);
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().is_some(), "include_usage");

    // Tools under each tool_choice that calls: every call validates.
    let tools = weather_tools();
    let weather = json!([{"role": "user", "content": "weather in Paris for 3 days"}]);
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "forecast"}})] {
        let (status, r) = post(a, &json!({"messages": weather, "tools": tools, "tool_choice": choice}));
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
        let names = check_calls(&r["choices"][0]["message"], &tools);
        if choice.is_object() {
            assert!(names.iter().all(|n| n == "forecast"), "{names:?}");
        }
    }
    // auto: a call (validating) or an answer.
    let (status, r) = post(a, &json!({"messages": weather, "tools": tools}));
    assert_eq!(status, 200, "{r}");
    match r["choices"][0]["finish_reason"].as_str().unwrap() {
        "tool_calls" => drop(check_calls(&r["choices"][0]["message"], &tools)),
        _ => assert!(r["choices"][0]["message"]["content"].is_string()),
    }
    // none: an answer, no calls.
    let (status, r) = post(a, &json!({"messages": weather, "tools": tools, "tool_choice": "none", "max_tokens": 8}));
    assert_eq!(status, 200, "{r}");
    assert!(r["choices"][0]["message"].get("tool_calls").is_none());
    // The call's result sent back: the next decision goes on from it.
    let turn = json!([
        {"role": "user", "content": "weather in Paris"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"}
    ]);
    let (status, r) = post(a, &json!({"messages": turn, "tools": tools}));
    assert_eq!(status, 200, "{r}");
    // A result the client's tool reports as a failure: the same call is not sent again (with one
    // argument-less tool, `required` can only repeat it), and no answer is the error passed on.
    let ping = json!([{"type": "function", "function": {"name": "ping", "description": "pings",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}]);
    let failed = json!([
        {"role": "user", "content": "ping the server"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "ping", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"error\": \"host unreachable\"}"}
    ]);
    let (status, r) = post(a, &json!({"messages": failed, "tools": ping, "tool_choice": "required"}));
    assert_eq!(status, 200, "{r}");
    let message = &r["choices"][0]["message"];
    assert!(message.get("tool_calls").is_none(), "the failed call was sent again: {r}");
    assert_eq!(message["content"], "No answer: `ping` failed: host unreachable", "{r}");
    // A streamed decision: the call in one delta with its index.
    let body = json!({"messages": weather, "tools": tools, "tool_choice": "required", "stream": true});
    let (_, sse) = http(a, "POST", "/v1/chat/completions", body.to_string().as_bytes(), &[]);
    let calls: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect();
    assert!(!calls.is_empty() && calls[0]["index"] == 0, "{sse}");
    check_calls(&json!({"tool_calls": calls}), &tools);

    // A JSON schema response format: the answer parses and validates.
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
                        "required": ["city", "n"], "additionalProperties": false});
    let body = json!({"messages": user, "max_tokens": 200,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "c", "strict": true, "schema": schema}}});
    let (status, r) = post(a, &body);
    assert_eq!(status, 200, "{r}");
    let answer: Value = serde_json::from_str(r["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(jsonschema::validator_for(&schema).unwrap().is_valid(&answer), "{answer}");

    let (_, metrics) = http(a, "GET", "/metrics", b"", &[]);
    assert!(metrics.contains("reagent_responses_total{status=\"200\"}"), "{metrics}");
}

#[test]
fn malformed_requests_get_400_naming_the_field_and_the_server_serves_on() {
    let s = server(ServeOptions::default());
    let a = s.addr();
    let user = json!([{"role": "user", "content": "hi"}]);
    let many: Vec<Value> =
        (0..5000).map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}})).collect();
    let bad_schema = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"x": {"type": "no-such-type"}}}}}]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "body"),
        (b"[1, 2]".to_vec(), "body"),
        (json!({}).to_string().into_bytes(), "messages"),
        (json!({"messages": "hi"}).to_string().into_bytes(), "messages"),
        (json!({"messages": [{"role": "robot", "content": "x"}]}).to_string().into_bytes(), "messages[0].role"),
        (json!({"messages": user, "temperature": "warm"}).to_string().into_bytes(), "temperature"),
        (json!({"messages": user, "max_tokens": -3}).to_string().into_bytes(), "max_tokens"),
        (json!({"messages": user, "stream": "yes"}).to_string().into_bytes(), "stream"),
        (json!({"messages": user, "tools": many}).to_string().into_bytes(), "tools"),
        (json!({"messages": user, "tools": bad_schema}).to_string().into_bytes(), "tools[0].function"),
        (json!({"messages": user, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": weather_tools()})
            .to_string()
            .into_bytes(), "tool_choice"),
        (vec![b' '; 10 << 20], "body"),
    ];
    for (body, param) in &cases {
        let (status, text) = http(a, "POST", "/v1/chat/completions", body, &[]);
        assert_eq!(status, 400, "{param}: {text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["param"], *param, "{text}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
    // Refused by the model rather than the reader (over the context): a 400 too, streamed or not.
    let long = json!([{"role": "user", "content": "lorem ipsum ".repeat(2000)}]);
    for stream in [false, true] {
        let body = json!({"messages": long, "stream": stream}).to_string();
        let (status, text) = http(a, "POST", "/v1/chat/completions", body.as_bytes(), &[]);
        assert_eq!(status, 400, "stream {stream}: {text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["param"], "messages");
    }
    let (status, r) = post(a, &json!({"messages": user, "max_tokens": 4}));
    assert_eq!(status, 200, "{r}");
}

#[test]
fn an_api_key_is_required_when_set_and_other_hosts_need_one() {
    let s = server(ServeOptions::default().api_key(Some("sesame".into())));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    let (status, _) = http(s.addr(), "POST", "/v1/chat/completions", body.as_bytes(), &[]);
    assert_eq!(status, 401);
    let (status, _) =
        http(s.addr(), "POST", "/v1/chat/completions", body.as_bytes(), &[("Authorization", "Bearer nope")]);
    assert_eq!(status, 401);
    let (status, _) =
        http(s.addr(), "POST", "/v1/chat/completions", body.as_bytes(), &[("Authorization", "Bearer sesame")]);
    assert_eq!(status, 200);

    let model = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
    let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    let open = Server::start(driver, ServeOptions::default().host("0.0.0.0".into()).port(0));
    assert!(open.is_err_and(|e| e.to_string().contains("--api-key")));
}

/// A long generation on the tiny model: a JSON string the grammar keeps open for 3,000 characters.
fn long_request(stream: bool) -> String {
    let schema =
        json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 3000}}, "required": ["s"]});
    json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4000, "stream": stream,
           "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    .to_string()
}

/// Opens a streamed long generation and returns the connection once its first chunk arrived (the
/// model thread is then busy with it). With no queue, a request that comes just before the model thread
/// is back waiting for work is refused (429): it is then sent again.
fn start_stream(addr: SocketAddr) -> TcpStream {
    start_stream_with(addr, None)
}

/// [`start_stream`] on a socket with this receive buffer size (a small one: the kernel does not take a
/// client's whole answer for it).
fn start_stream_with(addr: SocketAddr, receive_buffer: Option<usize>) -> TcpStream {
    for _ in 0..100 {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(size) = receive_buffer {
            sock.set_recv_buffer_size(size).unwrap();
        }
        sock.connect(&addr.into()).unwrap();
        let mut s: TcpStream = sock.into();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let body = long_request(true);
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&seen);
            if text.contains("data: ") {
                return s;
            }
            if text.starts_with("HTTP/1.1 429") {
                break;
            }
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the stream closed before its first chunk");
            seen.extend_from_slice(&buf[..n]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the model thread never took the stream");
}

#[test]
fn a_full_queue_answers_429_and_a_client_that_leaves_frees_the_model() {
    let s = server(ServeOptions::default().queue(0));
    let a = s.addr();
    let small = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    // How long the long generation takes when a client waits for it.
    // With no queue, a request that comes before the model thread waits for work is refused: again.
    let (whole, status) = loop {
        let t = std::time::Instant::now();
        match http(a, "POST", "/v1/chat/completions", long_request(false).as_bytes(), &[]) {
            (429, _) => std::thread::sleep(Duration::from_millis(20)),
            (status, _) => break (t.elapsed(), status),
        }
    };
    assert_eq!(status, 200);

    // While it runs, no request may wait (queue 0): 429 with Retry-After.
    let stream = start_stream(a);
    let mut c = TcpStream::connect(a).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{small}",
        small.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 429"), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("retry-after: 1"), "{reply}");

    // The streaming client leaves: its generation stops, and the model serves the next request long
    // before the generation would have ended.
    let left = std::time::Instant::now();
    drop(stream);
    loop {
        let (status, _) = http(a, "POST", "/v1/chat/completions", small.as_bytes(), &[]);
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(left.elapsed() < whole, "the model stayed busy after its client left ({:?})", left.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(left.elapsed() * 2 < whole, "freed after {:?}; the whole generation takes {whole:?}", left.elapsed());
}

#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn a_decisions_answer_in_words_keeps_to_max_tokens() {
    let model = Model::load(common::require_model("qwen2.5-coder-0.5b"), &LoadOptions::default()).unwrap();
    let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    // The single-decision profile decides in this model's own call format, whose answers are free text.
    let opts = ServeOptions::default().profile(reagent::catalog::Profile::SingleDecision);
    let s = Server::start(driver, opts.host("127.0.0.1".into()).port(0)).unwrap();
    let ask = json!([{"role": "user", "content": "Explain in detail how rainbows form."}]);
    let body = |max: Option<u64>| {
        // `auto`: a decision (`none` is a plain chat generation), which answers in words here.
        let mut b = json!({"messages": ask, "tools": weather_tools(), "tool_choice": "auto", "temperature": 0});
        if let Some(n) = max {
            b["max_tokens"] = json!(n);
        }
        b
    };
    let (status, long) = post(s.addr(), &body(None));
    assert_eq!(status, 200, "{long}");
    let long_tokens = long["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(long_tokens > 12, "{long}");
    let (status, short) = post(s.addr(), &body(Some(6)));
    assert_eq!(status, 200, "{short}");
    assert_eq!(short["choices"][0]["finish_reason"], "length", "{short}");
    assert!(short["usage"]["completion_tokens"].as_u64().unwrap() <= 7, "{short}");
    let text = short["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty() && long["choices"][0]["message"]["content"].as_str().unwrap().starts_with(text.trim()));
}

#[test]
fn conversations_taking_turns_keep_their_prefixes() {
    let s = server(ServeOptions::default());
    let a = s.addr();
    let first = |topic: &str| json!([{"role": "user", "content": format!("{} ", topic).repeat(60)}]);
    let ask = |messages: &Value| {
        let (status, r) = post(a, &json!({"messages": messages, "max_tokens": 4, "temperature": 0}));
        assert_eq!(status, 200, "{r}");
        r
    };
    let a1 = ask(&first("apples"));
    let b1 = ask(&first("pears"));
    assert!(b1["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() < 32, "{b1}");
    // The first conversation goes on after the second: its prefix comes back from the kept copy.
    let mut a2 = first("apples");
    a2.as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": a1["choices"][0]["message"]["content"]}),
        json!({"role": "user", "content": "and then?"}),
    ]);
    let r = ask(&a2);
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let a1_prompt = a1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached >= a1_prompt, "cached {cached} of {}, the first turn's prompt {a1_prompt}", r["usage"]);
}

#[test]
fn a_thinking_model_returns_its_thinking_as_reasoning_content() {
    let model = Model::load(common::tiny_thinking_path(), &LoadOptions::default()).unwrap();
    let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    let opts = ServeOptions::default().think_budget(Some(5));
    let s = Server::start(driver, opts.host("127.0.0.1".into()).port(0)).unwrap();
    // A model that cannot think is refused at the start, not at each request.
    let plain = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
    let plain = ModelDriver::constrained(plain, Sampling::Greedy, 0).unwrap();
    let opts = ServeOptions::default().think_budget(Some(5)).host("127.0.0.1".into()).port(0);
    let err = Server::start(plain, opts).err().expect("refused").to_string();
    assert!(err.contains("think budget"), "{err}");
    let tools = weather_tools();
    let body = json!({"messages": [{"role": "user", "content": "weather in Paris"}], "tools": tools,
                      "tool_choice": "required"});
    let (status, r) = post(s.addr(), &body);
    assert_eq!(status, 200, "{r}");
    let message = &r["choices"][0]["message"];
    assert!(message["reasoning_content"].is_string(), "{r}");
    check_calls(message, &tools);
}

/// A request with tools is the decision `reagent run` makes for the same conversation on the same model
/// (the same agent, settings and, with batch invariance, the same numbers): under `required` the same call,
/// under `auto` the same call or the same answer in the model's own words. Asked twice, the second time
/// with the conversation's KV kept from the first, the server answers the same.
#[test]
fn a_served_decision_is_the_decision_a_run_makes() {
    use reagent::agent::{Agent, AgentConfig, Decision, Profile};
    use reagent::tools::{FnTool, ToolError};
    let s = server(ServeOptions::default());
    let tools = weather_tools();
    let question = "What is the weather in Oslo?";
    for choice in ["required", "auto"] {
        let body = json!({"messages": [{"role": "user", "content": question}], "tools": tools,
            "tool_choice": choice, "temperature": 0});
        let (status, first) = post(s.addr(), &body);
        assert_eq!(status, 200, "{first}");
        let (_, again) = post(s.addr(), &body);
        // Call ids are drawn for each response; all else is the same.
        let without_ids = |r: &Value| {
            let mut m = r["choices"][0]["message"].clone();
            for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
                c.as_object_mut().unwrap().remove("id");
            }
            m
        };
        assert_eq!(without_ids(&first), without_ids(&again), "warm against cold");
        let message = &first["choices"][0]["message"];
        // The same decision from the library: the same model, the catalog's (here: default) run settings.
        let model = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
        let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
        let stubs = tools.as_array().unwrap().iter().map(|t| {
            let spec = reagent::ToolSpec::from_function_json(t).unwrap();
            std::sync::Arc::new(FnTool::new(spec, |_| Err(ToolError("not here".into()))))
                as std::sync::Arc<dyn reagent::Tool>
        });
        let mut config = AgentConfig::for_model(None, Profile::Run, true).unwrap();
        config.tool_choice = choice.parse().unwrap();
        let mut agent = Agent::builder().driver(driver).tools(stubs).config(config.max_steps(1)).build().unwrap();
        let t = agent.run(question).unwrap();
        match &t.steps[0].decision {
            Decision::FinalAnswer { answer, .. } => assert_eq!(message["content"], json!(answer), "{message}"),
            d => {
                let calls: Vec<(Value, Value)> = message["tool_calls"]
                    .as_array()
                    .unwrap_or_else(|| panic!("the run called, the server did not: {message}"))
                    .iter()
                    .map(|c| {
                        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                        (c["function"]["name"].clone(), args)
                    })
                    .collect();
                let run: Vec<(Value, Value)> = d.calls().iter().map(|c| (json!(c.tool), c.args.clone())).collect();
                assert_eq!(calls, run, "{choice}");
            }
        }
    }
}

/// With `"stream": true`, a request with tools whose decision answers in the model's own words gets the
/// answer's text as it is generated, in several content deltas that make the answer a plain request gets.
#[test]
fn an_answer_to_a_request_with_tools_is_streamed_as_it_is_generated() {
    let s = server(ServeOptions::default());
    let body = json!({"messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": weather_tools(), "tool_choice": "auto", "temperature": 0});
    let (status, whole) = post(s.addr(), &body);
    assert_eq!(status, 200, "{whole}");
    let answer = whole["choices"][0]["message"]["content"].as_str().expect("this decision answers").to_string();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, text) = http(s.addr(), "POST", "/v1/chat/completions", streamed.to_string().as_bytes(), &[]);
    assert_eq!(status, 200, "{text}");
    let deltas: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .filter(|c| !c.is_empty())
        .collect();
    assert!(deltas.len() > 3, "in pieces: {deltas:?}");
    assert_eq!(deltas.concat().trim(), answer);
}

/// `/v1/responses` in the Responses API's shapes: a plain answer, the same answer streamed as typed
/// events, a function call, and its output sent back as items; refusals name this API's fields.
#[test]
fn the_responses_api_answers_streams_and_calls() {
    let s = server(ServeOptions::default());
    let a = s.addr();
    let respond = |body: &Value| {
        let (status, text) = http(a, "POST", "/v1/responses", body.to_string().as_bytes(), &[]);
        (status, text)
    };
    let (status, text) = respond(&json!({"input": "hello world", "max_output_tokens": 12, "temperature": 0}));
    assert_eq!(status, 200, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((r["object"].as_str(), r["output"][0]["type"].as_str()), (Some("response"), Some("message")));
    let answer = r["output"][0]["content"][0]["text"].as_str().unwrap().to_string();
    assert!(["completed", "incomplete"].contains(&r["status"].as_str().unwrap()), "{r}");
    assert_eq!(
        r["usage"]["total_tokens"],
        r["usage"]["input_tokens"].as_u64().unwrap() + r["usage"]["output_tokens"].as_u64().unwrap()
    );

    // Streamed: named events in order, whose text deltas add up to the same answer.
    let (status, sse) =
        respond(&json!({"input": "hello world", "max_output_tokens": 12, "temperature": 0, "stream": true}));
    assert_eq!(status, 200, "{sse}");
    let names: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    let data: Vec<Value> =
        sse.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(names.len(), data.len(), "{sse}");
    assert!(names.iter().zip(&data).all(|(n, d)| d["type"] == *n), "{sse}");
    assert_eq!(names.first(), Some(&"response.created"));
    assert!(["response.completed", "response.incomplete"].contains(names.last().unwrap()), "{sse}");
    let deltas: String = data
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, answer);

    // A function tool under `required`: a call item whose arguments validate.
    let tools: Vec<Value> = weather_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut f = t["function"].clone();
            f["type"] = json!("function");
            f
        })
        .collect();
    let ask = json!([{"role": "user", "content": "weather in Paris for 3 days"}]);
    let (status, text) = respond(&json!({"input": ask, "tools": tools, "tool_choice": "required"}));
    assert_eq!(status, 200, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    let call = r["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").expect("a call").clone();
    let as_chat = json!({"tool_calls": [{"id": call["call_id"], "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]}}]});
    check_calls(&as_chat, &weather_tools());

    // The call and its output sent back as items: the next response goes on from them.
    let mut turn = ask.as_array().unwrap().clone();
    turn.push(call.clone());
    turn.push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"}));
    let (status, text) = respond(&json!({"input": turn, "tools": tools}));
    assert_eq!(status, 200, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    assert!(!r["output"].as_array().unwrap().is_empty(), "{r}");

    // Refusals name this API's fields.
    for (body, param) in [
        (json!({"input": "hi", "previous_response_id": "resp_1"}), "previous_response_id"),
        (json!({"input": [{"type": "function_call_output", "output": "x"}]}), "input[0].call_id"),
        (json!({"input": "hi", "tools": [{"type": "file_search"}]}), "tools[0].type"),
    ] {
        let (status, text) = respond(&body);
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some(param)), "{text}");
    }
}

/// Reads until the peer closes or `limit` passes: what arrived, and whether it closed.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&raw).into_owned(), closed)
}

#[test]
fn slow_idle_and_stalled_clients_are_let_go_and_the_server_serves_on() {
    let timeout = Duration::from_millis(250);
    let limits = reagent::serve::Limits::default().client_timeout(timeout).max_connections(32);
    let s = server(ServeOptions::default().queue(0).limits(limits));
    let a = s.addr();
    let health = || http(a, "GET", "/health", b"", &[]).0;

    // A head trickled and never finished: the connection is closed after the timeout.
    let mut c = TcpStream::connect(a).unwrap();
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHo").unwrap();
    let (_, closed) = read_until_closed(&mut c, Duration::from_secs(20));
    assert!(closed, "a trickled head kept its connection");

    // A body that stops coming: 408 naming the wait, then closed.
    let mut c = TcpStream::connect(a).unwrap();
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"messa").unwrap();
    let (reply, closed) = read_until_closed(&mut c, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("the body did not arrive within 0.25 s"), "{reply}");
    assert!(closed);

    // Twice as many idle connections as may be open: all are closed after the timeout, and /health
    // answers meanwhile (as soon as a slot frees).
    let mut idle: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(a).unwrap()).collect();
    assert_eq!(health(), 200);
    for c in &mut idle {
        let (_, closed) = read_until_closed(c, Duration::from_secs(20));
        assert!(closed, "an idle connection was kept");
    }

    // How long the long generation takes for a client that reads it.
    let whole = loop {
        let t = std::time::Instant::now();
        match http(a, "POST", "/v1/chat/completions", long_request(false).as_bytes(), &[]) {
            (429, _) => std::thread::sleep(Duration::from_millis(20)),
            (status, _) => {
                assert_eq!(status, 200);
                break t.elapsed();
            }
        }
    };
    // A client that asks for it streamed, takes its first chunk and reads no more: the server stops
    // writing after the timeout, and the model is free long before the generation would have ended.
    let stalled = start_stream_with(a, Some(4096));
    let sent = std::time::Instant::now();
    let small = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    loop {
        match http(a, "POST", "/v1/chat/completions", small.as_bytes(), &[]).0 {
            200 => break,
            status => assert_eq!(status, 429),
        }
        assert!(sent.elapsed() < whole * 3, "the model stayed busy for a client that stopped reading");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sent.elapsed() < whole, "freed after {:?}; the whole generation takes {whole:?}", sent.elapsed());
    drop(stalled);
    assert_eq!(health(), 200);
}

/// The agent with its decisions made over HTTP by `reagent serve` (the grammar sent as
/// `structured_outputs`), against the same agent in process on the same model: the same first decision.
#[test]
fn a_remote_decision_under_the_grammar_is_the_decision_made_in_process() {
    use reagent::agent::{Agent, AgentConfig, DecisionFormat, Profile, RemoteConstraint, RemoteDriver};
    use reagent::tools::FnTool;
    let s = server(ServeOptions::default());
    let add = || {
        let spec = reagent::ToolSpec::new(
            "add",
            "Adds two numbers",
            json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}),
        )
        .unwrap();
        std::sync::Arc::new(FnTool::new(spec, |_| Ok(json!(5)))) as std::sync::Arc<dyn reagent::Tool>
    };
    let mut config = AgentConfig::for_model(None, Profile::Run, false).unwrap();
    config.format = DecisionFormat::React;
    let config = config.max_steps(1);
    let question = "What is 2 plus 3?";
    let model = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
    let local = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    let mut agent = Agent::builder().driver(local).tools([add()]).config(config.clone()).build().unwrap();
    let here = agent.run(question).unwrap();
    let url = format!("http://{}/v1", s.addr());
    let remote = RemoteDriver::new(&url, "tiny", RemoteConstraint::Grammar, Duration::from_secs(120)).unwrap();
    let mut agent = Agent::builder().driver(remote).tools([add()]).config(config).build().unwrap();
    let there = agent.run(question).unwrap();
    assert_eq!(there.steps[0].decision, here.steps[0].decision);
    assert_eq!(there.steps[0].stats.prompt_tokens, here.steps[0].stats.prompt_tokens);
}

/// A server that fails: a 500 is tried again; text that is no decision is retried by the agent with
/// the same events as a local decision's; a 400 ends the run naming the server and its message.
#[test]
fn a_failing_server_gives_the_agents_own_failures_and_retries() {
    use reagent::agent::{Agent, AgentEvent, RemoteConstraint, RemoteDriver, StopReason};
    let completion = |content: &str| {
        json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 3}})
        .to_string()
    };
    let replies = vec![
        (500, "{\"error\": {\"message\": \"overloaded\"}}".to_string()),
        (200, completion("not a decision")),
        (200, completion(r#"{"thought": "", "type": "final_answer", "answer": "five"}"#)),
        // The answer in the model's own words, asked for once the decision answered.
        (200, completion("2 plus 3 is 5.")),
        (400, "{\"error\": {\"message\": \"messages: too long\"}}".to_string()),
    ];
    let (url, bodies) = common::fake_server(replies);
    let remote = RemoteDriver::new(&url, "m", RemoteConstraint::JsonSchema, Duration::from_secs(10))
        .unwrap()
        .retries(2, Duration::from_millis(1))
        .api_key(Some("sk-test".into()));
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = events.clone();
    let mut agent = Agent::builder()
        .driver(remote)
        .events(move |e: &AgentEvent| log.lock().unwrap().push(serde_json::to_value(e).unwrap()))
        .build()
        .unwrap();
    let t = agent.run("What is 2 plus 3?").unwrap();
    assert_eq!(t.final_answer.as_deref(), Some("2 plus 3 is 5."), "{:?}", events.lock().unwrap());
    let kinds: Vec<String> = events.lock().unwrap().iter().map(|e| e["event"].as_str().unwrap().to_string()).collect();
    assert!(kinds.contains(&"extraction_failed".to_string()), "{kinds:?}");
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 4, "the 500 tried again, the bad text retried by the agent, the answer asked for");
    let (head, body) = &bodies[0];
    assert!(head.contains("Authorization: Bearer sk-test") || head.contains("authorization: Bearer sk-test"));
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["response_format"]["type"], "json_schema", "{body}");
    // The next run's request is refused (400): the run fails naming the server and what it said.
    let t = agent.run("And 3 plus 4?").unwrap();
    match &t.stop_reason {
        StopReason::DriverError { message } => {
            assert!(message.contains(&url) && message.contains("HTTP 400: messages: too long"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

/// `POST /v1/completions`: a prompt (text with special tokens, or token ids) continued in the legacy API's
/// shapes, streamed or whole, under a grammar and a `logit_bias`; what the server does not do is refused
/// naming the field.
#[test]
fn completions_continue_a_prompt_under_a_grammar_and_a_logit_bias() {
    let s = server(ServeOptions::default());
    let a = s.addr();
    let complete = |body: &Value| post_to(a, "/v1/completions", body);
    let prompt = "<|im_start|>user\nyes or no?<|im_end|>\n<|im_start|>assistant\n";
    let (status, r) = complete(&json!({"prompt": prompt, "max_tokens": 10, "temperature": 0}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    let free = r["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(["stop", "length"].contains(&r["choices"][0]["finish_reason"].as_str().unwrap()));
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 5);

    // The same prompt as token ids, its special tokens read as those tokens: the same continuation.
    let model = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
    let tok = model.tokenizer();
    let mut ids: Vec<u32> = tok.bos().filter(|_| tok.add_bos()).into_iter().collect();
    ids.extend(tok.encode(prompt, true).unwrap());
    let (status, r) = complete(&json!({"prompt": ids, "max_tokens": 10, "temperature": 0}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["text"], free);
    assert_eq!(r["usage"]["prompt_tokens"], ids.len());

    // Streamed: `text` chunks that add up to the same continuation, then [DONE].
    let body = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": true});
    let (status, sse) = http(a, "POST", "/v1/completions", body.to_string().as_bytes(), &[]);
    assert_eq!(status, 200);
    let data: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{sse}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"), "{sse}");
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, free);

    // Under a grammar, then with the chosen word's first token pushed down by `logit_bias`: the other.
    let grammar = json!({"grammar": "start: \"yes\" | \"no\""});
    let (status, r) = complete(&json!({"prompt": prompt, "temperature": 0, "structured_outputs": grammar}));
    assert_eq!(status, 200, "{r}");
    let word = r["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(word == "yes" || word == "no", "{word}");
    let first = tok.encode(&word, false).unwrap()[0];
    let bias = json!({first.to_string(): -100});
    let body = json!({"prompt": prompt, "temperature": 0, "structured_outputs": grammar, "logit_bias": bias});
    let (status, r) = complete(&body);
    assert_eq!(status, 200, "{r}");
    let other = if word == "yes" { "no" } else { "yes" };
    assert_eq!(r["choices"][0]["text"], other);
    // The same grammar in GBNF as llama.cpp's servers take it (`grammar`), with the same bias: the same word.
    let body = json!({"prompt": prompt, "temperature": 0, "grammar": "root ::= \"yes\" | \"no\"", "logit_bias": bias});
    let (status, r) = complete(&body);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["text"], other);
    let (status, r) = complete(&json!({"prompt": prompt, "grammar": "root ::= [yes"}));
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("grammar")), "{r}");
    // A chat request takes `logit_bias` too.
    let user = json!([{"role": "user", "content": "yes or no?"}]);
    let chat = |bias: &Value| {
        let body = json!({"messages": user, "temperature": 0, "structured_outputs": grammar, "logit_bias": bias});
        let (status, r) = post(a, &body);
        assert_eq!(status, 200, "{r}");
        r["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    };
    let said = chat(&json!({}));
    let pushed = json!({tok.encode(&said, false).unwrap()[0].to_string(): -100});
    assert_ne!(chat(&pushed), said);

    // A control token's text only where asked: `<|im_start|>` pushed up by `logit_bias`.
    let start = tok.encode("<|im_start|>", true).unwrap();
    assert_eq!(start.len(), 1);
    let up = json!({start[0].to_string(): 100});
    let body = |skip: bool| json!({"prompt": prompt, "max_tokens": 2, "logit_bias": up, "skip_special_tokens": skip});
    let (_, r) = complete(&body(false));
    assert!(r["choices"][0]["text"].as_str().unwrap().contains("<|im_start|>"), "{r}");
    let (_, r) = complete(&body(true));
    assert!(!r["choices"][0]["text"].as_str().unwrap().contains("<|im_start|>"), "{r}");

    let vocab = model.vocab_size();
    for (body, field) in [
        (json!({"max_tokens": 4}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": [1, vocab + 5]}), "prompt"),
        (json!({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}), "messages"),
        (json!({"prompt": "a", "echo": true}), "echo"),
        (json!({"prompt": "a", "logprobs": 5}), "logprobs"),
        (json!({"prompt": "a", "logit_bias": {"x": 1}}), "logit_bias"),
        (json!({"prompt": "a", "logit_bias": {"7": 200}}), "logit_bias.7"),
        (json!({"prompt": "a", "logit_bias": {(vocab + 1).to_string(): 1}}), "logit_bias"),
        (json!({"prompt": "a", "stream": true, "skip_special_tokens": false}), "skip_special_tokens"),
    ] {
        let (status, r) = complete(&body);
        assert_eq!(status, 400, "{body}: {r}");
        assert_eq!(r["error"]["param"], field, "{body}: {r}");
    }
    // The server serves on.
    assert_eq!(complete(&json!({"prompt": prompt, "max_tokens": 2})).0, 200);
}
