//! Each family's call syntax, read from its chat template: the probe's reading, and native runs on tiny
//! models whose templates write calls as Qwen, Llama 3.x and llama.cpp's Phi-4-mini template do (written
//! here in their manner, on the tiny vocabulary).

mod common;

use std::sync::{Arc, Mutex};

use candle_core::quantized::gguf_file::Value as Meta;
use reagent::agent::native::CallSyntax;
use reagent::agent::{AgentConfig, AgentEvent, DecisionFormat, ModelDriver};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::Arch;
use reagent::tools::FnTool;
use reagent::{Agent, LoadOptions, Model, Sampling, ToolChoice, ToolSpec};
use serde_json::{json, Value};

/// Qwen's manner: tools in a system turn, each call a `<tool_call>` block, results in `<tool_response>`.
const QWEN: &str = "{% if tools %}{{ '<|im_start|>system\nTools:\n' }}{% for t in tools %}{{ t | tojson }}\
{{ '\n' }}{% endfor %}{{ 'Call in <tool_call> blocks.<|im_end|>\n' }}{% endif %}{% for m in messages %}\
{% if m.role == 'assistant' and m.tool_calls %}{{ '<|im_start|>assistant' }}{% if m.content %}{{ '\n' + m.content }}\
{% endif %}{% for c in m.tool_calls %}{{ '\n<tool_call>\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + \
(c.function.arguments | tojson) + '}\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}{% elif m.role == 'tool' %}\
{{ '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' }}{% else %}\
{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3.x's manner: tools in the first user turn, one bare `{"name", "parameters"}` object a turn
/// (a second call is refused), results in an `ipython` turn.
const LLAMA: &str = "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}\
{% if m.tool_calls | length != 1 %}{{ raise_exception('This model only supports single tool-calls at once!') }}\
{% endif %}{% set c = m.tool_calls[0].function %}{{ '<|im_start|>assistant\n{\"name\": \"' + c.name + \
'\", \"parameters\": ' + (c.arguments | tojson) + '}<|im_end|>\n' }}{% elif m.role == 'tool' %}\
{{ '<|im_start|>ipython\n' + m.content + '<|im_end|>\n' }}{% elif m.role == 'user' and tools and not ns_done %}\
{% set ns_done = true %}{{ '<|im_start|>user\nRespond with {\"name\": function name, \"parameters\": arguments}.\n' }}\
{% for t in tools %}{{ t | tojson }}{{ '\n' }}{% endfor %}{{ m.content + '<|im_end|>\n' }}{% else %}\
{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// llama.cpp's Phi-4-mini manner: each call the function object between control tokens, no separator.
const PHI: &str = "{% if tools %}{{ '<|im_start|>system\n' }}{% for t in tools %}{{ t['function'] | tojson }}\
{% endfor %}{{ '<|im_end|>\n' }}{% endif %}{% for m in messages %}{% if m.role == 'tool' %}\
{{ '<|im_start|>tool\n' + m.content + '<|im_end|>\n' }}{% else %}{{ '<|im_start|>' + m.role + '\n' + m.content }}\
{% for c in m.tool_calls %}{{ '<|tool_call|>' + (c['function'] | tojson) + '<|/tool_call|>' }}{% endfor %}\
{{ '<|im_end|>\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// SmolLM 3's manner: the tools as `xml_tools`, instructions that describe `<tool_call>` blocks, calls not
/// rendered, the assistant's text in HF's `{% generation %}` block (a tag minijinja lacks).
const DESCRIBED: &str = "{% if xml_tools is defined %}{{ '<|im_start|>system\n<tools>\n' }}{% for t in xml_tools %}\
{{ t | string }}{{ '\n' }}{% endfor %}{{ '</tools>\nFor each call write <tool_call>\n{\"name\": ..., \
\"arguments\": ...}\n</tool_call><|im_end|>\n' }}{% endif %}{% for m in messages %}{% if m.role == 'assistant' %}\
{%- generation -%}{{ '<|im_start|>assistant\n' + m.content + '<|im_end|>\n' }}{%- endgeneration -%}{% else %}\
{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Describes calls but lists no tools: the model would never see them.
const UNLISTED: &str = "{% if tools %}{{ '<|im_start|>system\nCall with <tool_call> blocks.<|im_end|>\n' }}\
{% endif %}{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A tiny model with `template`, and Phi-4-mini's call markers as control tokens.
fn tiny_with(name: &str, template: &str) -> Model {
    tiny_with_tokens(name, template, &[("<|tool_call|>", 3), ("<|/tool_call|>", 3)])
}

/// The tiny model with `template`, written as `name` with `extra` tokens (text, GGUF token type).
fn tiny_with_tokens(name: &str, template: &str, extra: &[(&str, i32)]) -> Model {
    static LOCK: Mutex<()> = Mutex::new(());
    let _written = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = common::scratch().join(format!("tiny-syntax-{name}.gguf"));
    if !path.exists() {
        let spec = TinySpec {
            context: 4096,
            metadata: vec![("tokenizer.chat_template".into(), Meta::String(template.into()))],
            extra_tokens: extra.iter().map(|&(t, kind)| (t.to_string(), kind)).collect(),
            ..TinySpec::new(Arch::Qwen2)
        };
        write_tiny_gguf(&path, &spec).unwrap();
    }
    Model::load(&path, &LoadOptions::default()).unwrap()
}

fn syntax_of(name: &str, template: &str) -> Option<CallSyntax> {
    let m = tiny_with(name, template);
    CallSyntax::of(m.chat_template(), m.tokenizer())
}

#[test]
fn each_templates_call_syntax_is_read_from_its_rendering() {
    let qwen = syntax_of("qwen", QWEN).expect("Qwen's manner renders calls");
    assert_eq!((qwen.open.as_str(), qwen.close.as_str()), ("<tool_call>\n", "\n</tool_call>"));
    assert_eq!(qwen.separator.as_deref(), Some("\n"));
    assert_eq!((qwen.name_key.as_str(), qwen.args_key.as_str(), qwen.name_first), ("name", "arguments", true));
    assert!(qwen.rendered && !qwen.control_markers);

    let llama = syntax_of("llama", LLAMA).expect("Llama's manner renders calls");
    assert_eq!((llama.open.as_str(), llama.close.as_str()), ("", ""));
    assert_eq!(llama.separator, None, "a second call is refused by the template");
    assert_eq!(llama.args_key, "parameters");
    assert_eq!(llama.max_calls(4), 1);
    // Two calls (a client's history) are more than the template renders in a turn: they are kept as text.
    let two = vec![reagent::ToolCall::new("f", json!({})), reagent::ToolCall::new("g", json!({}))];
    let turn = llama.turn(two);
    assert!(turn.tool_calls.is_empty() && turn.content.contains("\"g\""), "{turn:?}");

    let phi = syntax_of("phi", PHI).expect("the Phi manner renders calls");
    assert_eq!((phi.open.as_str(), phi.close.as_str()), ("<|tool_call|>", "<|/tool_call|>"));
    assert_eq!(phi.separator.as_deref(), Some(""));
    assert_eq!(phi.args_key, "arguments");
    assert!(phi.control_markers, "its markers are control tokens");

    let described =
        syntax_of("described", DESCRIBED).expect("xml_tools rendered, generation tags read, the markers described");
    assert!(!described.rendered, "calls are written into the turn's text");
    assert_eq!(described.open, "<tool_call>\n");

    assert_eq!(syntax_of("plain", reagent::text::chat::CHATML_TEMPLATE), None, "no tools: no syntax");
    assert_eq!(syntax_of("unlisted", UNLISTED), None, "a template that shows no tools has no native format");
}

fn calc() -> impl reagent::Tool + 'static {
    let spec = ToolSpec::new(
        "calc",
        "Evaluates an arithmetic expression.",
        json!({"type": "object", "properties": {"expression": {"enum": ["2+3"]}},
               "required": ["expression"]}),
    )
    .unwrap();
    FnTool::new(spec, |_: &Value| Ok(json!("5")))
}

/// A native run of two steps that must call: the first decision's text and the second step's prompt.
struct Run {
    text: String,
    calls: usize,
    /// The first step's prompt and generated tokens, and what the second step found in the KV cache.
    first: (usize, usize),
    second_reused: usize,
}

fn native_run(name: &str, template: &str) -> Run {
    let model = tiny_with(name, template);
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let config = AgentConfig::default()
        .format(DecisionFormat::Native)
        .tool_choice(ToolChoice::Required)
        .max_steps(2)
        .max_decision_tokens(400);
    let mut agent = Agent::builder()
        .driver(ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap())
        .tool(calc())
        .config(config)
        .events(move |e: &AgentEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let t = agent.run("What is 2+3?").unwrap();
    assert!(t.steps.len() == 2, "{name}: two steps, each a call: {:?}", t.stop_reason);
    let text = events
        .lock()
        .unwrap()
        .iter()
        .find_map(|e| match e {
            AgentEvent::DecisionExtracted { text, .. } => Some(text.clone()),
            _ => None,
        })
        .unwrap();
    let s = |i: usize| &t.steps[i].stats;
    Run {
        text,
        calls: t.steps[0].decision.calls().len(),
        first: (s(0).prompt_tokens, s(0).generated_tokens),
        second_reused: s(1).reused_tokens,
    }
}

/// Under each syntax the decision is a call in the model's own form, read back as a call, and the
/// template's rendering of it in the next prompt is the very tokens generated (all but the last, the end
/// of the turn, are found in the KV cache): the turn is kept as the model wrote it, control-token markers
/// included.
#[test]
fn native_runs_write_and_keep_calls_in_each_syntax() {
    for (name, template, open) in [
        ("qwen", QWEN, "<tool_call>\n{\"name\": \"calc\""),
        ("llama", LLAMA, "{\"name\": \"calc\", \"parameters\""),
        ("phi", PHI, "<|tool_call|>{\"name\": \"calc\""),
    ] {
        let run = native_run(name, template);
        // Qwen's syntax also takes a fenced block (Qwen 2.5 Coder's habit).
        let fenced = name == "qwen" && run.text.starts_with("```json\n{\"name\": \"calc\"");
        assert!(run.text.starts_with(open) || fenced, "{name}: {:?}", run.text);
        assert!(run.calls >= 1);
        if name == "llama" {
            assert_eq!(run.calls, 1, "one call a turn");
        }
        let (prompt, generated) = run.first;
        assert!(
            run.second_reused + 1 >= prompt + generated,
            "{name}: the second prompt re-renders the call as generated: {} of {prompt} + {generated} reused ({:?})",
            run.second_reused,
            run.text
        );
    }
}

/// `--chat-template FILE` (`LoadOptions::chat_template`) replaces the file's template: a model whose own
/// template renders no calls decides natively in the syntax of the one given. A missing or broken
/// template file is an error that names it.
#[test]
fn a_chat_template_file_replaces_the_models_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("llama.jinja");
    std::fs::write(&file, LLAMA).unwrap();
    let tiny = common::tiny_path(Arch::Qwen2);
    let plain = Model::load(&tiny, &LoadOptions::default()).unwrap();
    assert_eq!(CallSyntax::of(plain.chat_template(), plain.tokenizer()), None);
    let m = Model::load(&tiny, &LoadOptions::default().chat_template(Some(file.clone()))).unwrap();
    let syntax = CallSyntax::of(m.chat_template(), m.tokenizer()).unwrap();
    assert_eq!(syntax.args_key, "parameters");

    let missing = dir.path().join("missing.jinja");
    let e = Model::load(&tiny, &LoadOptions::default().chat_template(Some(missing))).err().unwrap().to_string();
    assert!(e.contains("missing.jinja"), "{e}");
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}").unwrap();
    let e = Model::load(&tiny, &LoadOptions::default().chat_template(Some(broken))).err().unwrap().to_string();
    assert!(e.contains("broken.jinja") && !e.contains('\n'), "{e}");
}

/// Templates see what Python's Jinja would: `tojson(indent=4)` indents by four spaces (Llama 3.x lists
/// tools so); `tojson` of a tool turn's content quotes and escapes it; a call's arguments keep their key
/// order. The tokens of a rendering are those of the whole text, with no control token from a message.
#[test]
fn templates_render_as_pythons_jinja_does() {
    let m = common::tiny_model(Arch::Qwen2);
    let t = reagent::ChatTemplate::new(
        "{% for t in tools %}{{ t | tojson(indent=4) }}{% endfor %}|{% for m in messages %}{% if m.role == 'tool' %}\
         {{ m.content | tojson }}{% else %}{{ m.content }}{% for c in m.tool_calls %}{{ c.function | tojson }}\
         {% endfor %}{% endif %}|{% endfor %}",
        m.tokenizer(),
    )
    .unwrap();
    let tools = json!([{"name": "f", "parameters": {}}]);
    let args: Value = serde_json::from_str(r#"{"zeta": 1, "alpha": "<|im_end|>"}"#).unwrap();
    let messages = [
        reagent::ChatMessage::user("hi"),
        reagent::ChatMessage::calls(vec![reagent::text::chat::ChatCall::new("f", args)]),
        reagent::ChatMessage::new(reagent::Role::Tool, "say \"hi\"\n"),
    ];
    let text = t.render(&messages, false, Some(&tools)).unwrap();
    let expected = "{\n    \"name\": \"f\",\n    \"parameters\": {}\n}|hi|{\"name\": \"f\", \"arguments\": \
                    {\"zeta\": 1, \"alpha\": \"<|im_end|>\"}}|\"say \\\"hi\\\"\\n\"|";
    assert_eq!(text, expected);
    let tok = m.tokenizer();
    let ids = t.render_tokens(tok, &messages, false, Some(&tools)).unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    assert!(!ids.contains(&end), "an argument's `<|im_end|>` stays text");
    assert_eq!(tok.decode(&ids, true).unwrap(), expected, "the tokens spell the same text");
    let sorted = "{{ {'b': {'d': 1, 'c': 2}, 'a': 3} | tojson(sort_keys=true) }}";
    let t = reagent::ChatTemplate::new(sorted, m.tokenizer()).unwrap();
    assert_eq!(t.render(&[], false, None).unwrap(), r#"{"a": 3, "b": {"c": 2, "d": 1}}"#);
    // A call's name is text too (a client's, on the server), wherever the template writes it.
    let named = [reagent::ChatMessage::calls(vec![reagent::text::chat::ChatCall::new("<|im_end|>", json!({}))])];
    for template in ["{{ messages[0].tool_calls[0].function.name }}", "{{ messages[0].tool_calls[0] | tojson }}"] {
        let t = reagent::ChatTemplate::new(template, m.tokenizer()).unwrap();
        let ids = t.render_tokens(tok, &named, false, None).unwrap();
        assert!(!ids.contains(&end), "{template}");
        assert_eq!(tok.decode(&ids, true).unwrap(), t.render(&named, false, None).unwrap());
    }
    let unknown = reagent::ChatTemplate::new("{{ 1 | tojson(width=3) }}", m.tokenizer()).unwrap();
    assert!(unknown.render(&[], false, None).is_err(), "an unknown keyword is an error");
}

/// An agent over a tiny model with Qwen's manner of template whose first choice is the model's native
/// call score plus `bias` (decisions in `format`).
fn native_branch_agent(bias: f32, format: DecisionFormat) -> Agent {
    let model = tiny_with("qwen", QWEN);
    Agent::builder()
        .driver(ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap())
        .tool(sum_tool())
        .config(native_branch_config(bias, format))
        .build()
        .unwrap()
}

/// The configuration of [`native_branch_agent`].
fn native_branch_config(bias: f32, format: DecisionFormat) -> AgentConfig {
    AgentConfig::default()
        .native_branch(true)
        .format(format)
        .system_prompt(Some("You are a helpful assistant.".into()))
        .branch_biases(reagent::agent::BranchBiases::default().call(bias))
        .answer_tokens(8)
        .max_steps(1)
        .decision(reagent::DecisionOptions::default().max_thought_chars(8).max_string_chars(8))
        .max_decision_tokens(200)
}

/// The one tool of [`native_branch_agent`].
fn sum_tool() -> impl reagent::Tool {
    FnTool::new(ToolSpec::new("sum", "adds", json!({"type": "object", "properties": {}})).unwrap(), |_| {
        Ok(json!("sum: 4"))
    })
}

#[test]
fn the_native_call_score_chooses_between_calling_and_answering() {
    let mut margins = Vec::new();
    for bias in [1000.0, -1000.0] {
        let t = native_branch_agent(bias, DecisionFormat::React).run("hello").unwrap();
        assert!(!t.steps.is_empty(), "{t:?}");
        let step = &t.steps[0];
        let margin = step.stats.branch_margins.iter().find(|m| m.label == "call").map(|m| m.margin);
        margins.push(margin.expect("the call score is the step's margin"));
        match bias > 0.0 {
            true => {
                assert!(matches!(&step.decision, reagent::Decision::CallTool { tool, .. } if tool == "sum"), "{step:?}")
            }
            // The answer is the model's own reply, not a ReAct decision's string.
            false => {
                assert!(matches!(&step.decision, reagent::Decision::FinalAnswer { .. }) && t.final_answer.is_some())
            }
        }
    }
    // The score is the model's, before the bias: the same both times, and the same as where a decision in
    // the model's own syntax starts.
    assert_eq!(margins[0], margins[1]);
    let native = native_branch_agent(0.0, DecisionFormat::Native).run("hello").unwrap();
    let margin = native.steps[0].stats.branch_margins.iter().find(|m| m.label == "call").map(|m| m.margin);
    assert_eq!(margin, Some(margins[0]));
}

#[test]
fn a_call_the_native_score_chose_and_the_support_dropped_is_answered_in_the_models_own_words() {
    // The score chooses the call; no call is supported enough to stand. The agent is built as
    // `native_branch_agent`'s, with a sink for the reply in the model's own words.
    let model = tiny_with("qwen", QWEN);
    let config = native_branch_config(1000.0, DecisionFormat::React).min_support(Some(1000.0));
    let replies = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = replies.clone();
    let mut agent = Agent::builder()
        .driver(ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap())
        .tool(sum_tool())
        .config(config)
        .answer_text(move |t| sink.lock().unwrap().push_str(t))
        .build()
        .unwrap();
    let t = agent.run("hello").unwrap();
    let step = &t.steps[0];
    assert!(step.support.is_some_and(|s| s < 1000.0), "the call was scored: {step:?}");
    assert!(matches!(step.decision, reagent::Decision::FinalAnswer { .. }), "{step:?}");
    // The reply was asked for (the tiny model's is cut off without a full sentence, so the decision's
    // answer then stands).
    assert!(!replies.lock().unwrap().is_empty(), "the model's own reply was not asked for");
}

/// A native decision on a remote model whose file is here: rendered here, sent to `/v1/completions` as
/// token ids under the native grammar, the same decision as in process (no branch biases, which the
/// server applies otherwise).
#[test]
fn a_remote_native_decision_is_the_decision_made_in_process() {
    use reagent::agent::{Driver, RemoteConstraint, RemoteDriver};
    use reagent::catalog::Profile;
    use reagent::serve::{ServeOptions, Server};
    let path = || common::scratch().join("tiny-syntax-qwen.gguf");
    let serving = ModelDriver::constrained(tiny_with("qwen", QWEN), Sampling::Greedy, 0).unwrap();
    let s = Server::start(serving, ServeOptions::default().host("127.0.0.1".into()).port(0)).unwrap();
    let weather = || {
        let spec = ToolSpec::new(
            "get_weather",
            "Current weather of a city",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        )
        .unwrap();
        std::sync::Arc::new(FnTool::new(spec, |_| Ok(json!("sunny")))) as std::sync::Arc<dyn reagent::Tool>
    };
    let mut config = AgentConfig::for_model(None, Profile::SingleDecision, true).unwrap();
    config.format = DecisionFormat::Native;
    config.branch_biases = Default::default();
    config.tool_choice = ToolChoice::Required;
    let mut config = config.max_steps(1);
    let question = "What is the weather in Paris?";
    let local = ModelDriver::constrained(tiny_with("qwen", QWEN), Sampling::Greedy, 0).unwrap();
    let syntax = local.call_syntax();
    assert!(syntax.is_some(), "the test model's template renders calls");
    let mut agent = Agent::builder().driver(local).tools([weather()]).config(config.clone()).build().unwrap();
    let here = agent.run(question).unwrap();
    let url = format!("http://{}/v1", s.addr());
    let remote =
        RemoteDriver::new(&url, "tiny", RemoteConstraint::Grammar, std::time::Duration::from_secs(120)).unwrap();
    // Without the file, the remote model has no call syntax: native decisions are refused at build.
    assert!(remote.call_syntax().is_none());
    let remote = remote.with_template(&path()).unwrap();
    assert_eq!(remote.call_syntax(), syntax);
    let mut agent = Agent::builder().driver(remote.clone()).tools([weather()]).config(config.clone()).build().unwrap();
    let there = agent.run(question).unwrap();
    assert!(!here.steps[0].decision.calls().is_empty(), "{:?}", here.steps[0]);
    assert_eq!(there.steps[0].decision, here.steps[0].decision);
    assert_eq!(there.steps[0].stats.prompt_tokens, here.steps[0].stats.prompt_tokens);
    // Up to three calls a decision, the stop after each call biased either way: remotely, one call a
    // request, the server's stop taking the bias as a `logit_bias`. Against the stop, the calls the
    // model makes in process (the random weights go on calling); for it, the decision's first call alone
    // (in process the bias goes after the call marker, which the random weights spell in pieces).
    let weather = || {
        let city = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]});
        let spec = ToolSpec::new("get_weather", "Current weather of a city", city).unwrap();
        std::sync::Arc::new(FnTool::new(spec, |_| Ok(json!("sunny")))) as std::sync::Arc<dyn reagent::Tool>
    };
    // The call markers as the model's own tokens (user-defined, as in Qwen's file).
    let marked = || tiny_with_tokens("qwen-marked", QWEN, &[("<tool_call>", 4), ("</tool_call>", 4)]);
    let s = Server::start(
        ModelDriver::constrained(marked(), Sampling::Greedy, 0).unwrap(),
        ServeOptions::default().host("127.0.0.1".into()).port(0),
    )
    .unwrap();
    let url = format!("http://{}/v1", s.addr());
    let remote = RemoteDriver::new(&url, "tiny", RemoteConstraint::Grammar, std::time::Duration::from_secs(120))
        .unwrap()
        .with_template(&common::scratch().join("tiny-syntax-qwen-marked.gguf"))
        .unwrap();
    let proposals = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let run = |driver: Box<dyn Driver>, config: &AgentConfig| {
        let sink = proposals.clone();
        let mut agent = Agent::builder()
            .boxed_driver(driver)
            .tools([weather()])
            .config(config.clone())
            .events(move |e: &AgentEvent| {
                if let AgentEvent::CallProposed { call, kept, .. } = e {
                    sink.lock().unwrap().push((call.clone(), *kept));
                }
            })
            .build()
            .unwrap();
        agent.run(question).unwrap().steps.remove(0)
    };
    let proposed = || std::mem::take(&mut *proposals.lock().unwrap());
    let local = || Box::new(ModelDriver::constrained(marked(), Sampling::Greedy, 0).unwrap());
    config.decision.parallel_calls = Some(3);
    let mut tokens = Vec::new();
    for more_calls in [100.0, -100.0] {
        config.branch_biases.more_calls = more_calls;
        let mut expected = config.clone();
        if more_calls < 0.0 {
            expected.decision.parallel_calls = Some(1);
        }
        let here = run(local(), &expected);
        let there = run(Box::new(remote.clone()), &config);
        // Calls that repeat one before are dropped from the decision: its length tells them apart.
        assert_eq!(there.decision, here.decision, "more-calls bias {more_calls}");
        assert_eq!(there.stats.generated_tokens, here.stats.generated_tokens, "more-calls bias {more_calls}");
        tokens.push(here.stats.generated_tokens);
    }
    assert!(tokens[0] > 2 * tokens[1], "the bias decides how many calls: {tokens:?} tokens");
    // A call proposed after the decision's call: the remote decision goes on from its text as the
    // model in process goes on from its cache.
    config.branch_biases.more_calls = 0.0;
    config.propose_more_calls = true;
    proposed();
    let here = run(local(), &config);
    let here_proposed = proposed();
    let there = run(Box::new(remote.clone()), &config);
    assert!(!here_proposed.is_empty(), "in process, a call is proposed");
    assert_eq!(proposed(), here_proposed);
    assert_eq!(there.decision, here.decision);
    assert_eq!(there.stats.generated_tokens, here.stats.generated_tokens);
}

/// Under `--constraint gbnf` (llama.cpp's server), a native decision goes to `/v1/completions` as that
/// server takes it: the prompt rendered here as text, the native grammar written as GBNF (the first call
/// alone, then the calls left), the call bias on the call marker and the more-calls bias on the stop
/// tokens as `logit_bias`; the reply's calls are the decision.
#[test]
fn a_gbnf_native_decision_is_sent_as_llama_cpp_takes_it() {
    use reagent::agent::{RemoteConstraint, RemoteDriver};
    use reagent::catalog::Profile;
    let marked = tiny_with_tokens("qwen-marked", QWEN, &[("<tool_call>", 4), ("</tool_call>", 4)]);
    let tok = marked.tokenizer().clone();
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let completion = |text: &str| {
        json!({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 3}})
        .to_string()
    };
    let (url, requests) = common::fake_server(vec![(200, completion(call)), (200, completion(""))]);
    let remote = RemoteDriver::new(&url, "tiny", RemoteConstraint::Gbnf, std::time::Duration::from_secs(30))
        .unwrap()
        .with_template(&common::scratch().join("tiny-syntax-qwen-marked.gguf"))
        .unwrap();
    let spec = ToolSpec::new(
        "get_weather",
        "Current weather of a city",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    )
    .unwrap();
    let weather = std::sync::Arc::new(FnTool::new(spec, |_| Ok(json!("sunny")))) as std::sync::Arc<dyn reagent::Tool>;
    let mut config = AgentConfig::for_model(None, Profile::SingleDecision, true).unwrap();
    config.format = DecisionFormat::Native;
    config.tool_choice = ToolChoice::Auto;
    config.decision.parallel_calls = Some(3);
    config.branch_biases = Default::default();
    config.branch_biases.call = 2.0;
    config.branch_biases.more_calls = 5.0;
    config.propose_more_calls = false;
    config.native_branch = false;
    let mut agent = Agent::builder().driver(remote).tools([weather]).config(config.max_steps(1)).build().unwrap();
    let t = agent.run("What is the weather in Paris?").unwrap();
    assert_eq!(t.steps[0].decision.calls()[0].args, json!({"city": "Paris"}));
    let seen = requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "the first call, then the calls left");
    let body = |i: usize| serde_json::from_str::<Value>(&seen[i].1).unwrap();
    let (first, rest) = (body(0), body(1));
    assert!(seen.iter().all(|(head, _)| head.starts_with("POST /v1/completions")), "{:?}", seen[0].0);
    let prompt = first["prompt"].as_str().expect("the prompt as text");
    assert!(prompt.contains("What is the weather in Paris?") && prompt.contains("get_weather"), "{prompt}");
    assert_eq!(rest["prompt"].as_str().unwrap(), format!("{prompt}{call}"), "the first call sent back");
    let first_grammar = common::gbnf::Gbnf::parse(first["grammar"].as_str().unwrap());
    assert!(first_grammar.accepts(call) && !first_grammar.accepts(&format!("{call}\n{call}")));
    let rest_grammar = common::gbnf::Gbnf::parse(rest["grammar"].as_str().unwrap());
    assert!(rest_grammar.accepts("") && rest_grammar.accepts(&format!("\n{call}")) && !rest_grammar.accepts(call));
    let marker = tok.encode("<tool_call>", true).unwrap()[0].to_string();
    assert_eq!(first["logit_bias"][&marker], json!(2.0));
    let stop = tok.token_id("<|im_end|>").unwrap().to_string();
    assert_eq!(rest["logit_bias"][&stop], json!(-5.0));
    assert!(rest["logit_bias"].get(&marker).is_none(), "no call bias after the first call");
}
