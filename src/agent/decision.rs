//! The ReAct decision: its types, and the grammar that makes only valid decisions possible.
//!
//! A decision is one compact JSON object. Single call (the default shape):
//! `{"thought":"…","type":"call_tool","tool":"calculator","args":{"expression":"2+2"}}`;
//! answer: `{"thought":"…","type":"final_answer","answer":"…"}`; with parallel calls enabled (at most N):
//! `{"thought":"…","type":"call_tools","calls":[{"tool":"a","args":{…}},{"tool":"b","args":{…}}]}`.
//!
//! [`decision_schema`] builds a JSON schema from the tool set and the [`ToolChoice`], starting from the
//! template `grammars/decision.schema.json`. Each tool is its own `anyOf` alternative, so `args` is tied to
//! the tool named in the same object: llguidance compiles the schema into the decoding grammar, and the
//! same schema validates decisions made without a grammar. Every string and array without a bound gets
//! one from [`DecisionOptions`], so no decision can run until the token limit.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::tools::{ToolCall, ToolSpec};

const TEMPLATE: &str = include_str!("../../grammars/decision.schema.json");

/// Which decisions the grammar allows.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// Call a tool or answer.
    #[default]
    Auto,
    /// Call some tool.
    Required,
    /// Answer; no tool calls.
    None,
    /// Call this tool.
    Specific(String),
}

impl std::str::FromStr for ToolChoice {
    type Err = Error;

    /// `auto`, `required`, `none`, or a tool name.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "" => return Err(Error::param("tool choice", "empty")),
            name => ToolChoice::Specific(name.to_string()),
        })
    }
}

/// How decisions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DecisionFormat {
    /// reagent's ReAct JSON object `{thought, type, tool, args, answer}`, described in the system prompt;
    /// works with every model.
    #[default]
    React,
    /// The model's own tool-call syntax, with the tools rendered by its chat template (for templates that
    /// support it, see [`crate::agent::native`]).
    Native,
}

impl std::str::FromStr for DecisionFormat {
    type Err = Error;

    /// `react` or `native`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "react" => Ok(Self::React),
            "native" => Ok(Self::Native),
            _ => Err(Error::param("decision format", format!("`{s}` (the formats are react, native)"))),
        }
    }
}

impl std::fmt::Display for DecisionFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::React => "react",
            Self::Native => "native",
        })
    }
}

/// Logit biases at the branches of a decision (see [`crate::decode::constraint::BranchBias`]): positive
/// values favour calling a tool over answering, one more call over stopping, closing an object of
/// arguments over adding an optional argument, and ending a list (an array, or a string at a comma) over
/// adding an item. Applied where the format makes each choice at one token (the native format).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BranchBiases {
    pub call: f32,
    pub more_calls: f32,
    #[serde(default)]
    pub close: f32,
    #[serde(default)]
    pub end_list: f32,
}

/// Bounds and shape options of the decision grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecisionOptions {
    /// Maximum characters of `thought`.
    pub max_thought_chars: usize,
    /// Maximum characters of `answer` and of any string argument without its own `maxLength`.
    pub max_string_chars: usize,
    /// Maximum items of any array argument without its own `maxItems`.
    pub max_array_items: usize,
    /// Maximum items of an array of objects or arrays without its own `maxItems` (each item takes many
    /// tokens: a made-up list of 32 ingredients runs past the decision's token limit).
    pub max_nested_items: usize,
    /// Allow up to this many calls in one decision (`type: call_tools`); `None` or `Some(1)`: single calls.
    pub parallel_calls: Option<usize>,
    /// Maximum tokens of a native-format answer (ReAct answers are bounded by `max_string_chars`).
    pub max_answer_tokens: usize,
}

impl Default for DecisionOptions {
    fn default() -> Self {
        Self {
            max_thought_chars: 200,
            max_string_chars: 1000,
            max_array_items: 32,
            max_nested_items: 8,
            parallel_calls: None,
            max_answer_tokens: 400,
        }
    }
}

setters!(DecisionOptions {
    max_thought_chars: usize,
    max_string_chars: usize,
    max_array_items: usize,
    max_nested_items: usize,
    parallel_calls: Option<usize>,
    max_answer_tokens: usize,
});

setters!(BranchBiases { call: f32, more_calls: f32, close: f32, end_list: f32 });

/// A parsed decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    CallTool { thought: String, tool: String, args: Value },
    CallTools { thought: String, calls: Vec<ToolCall> },
    FinalAnswer { thought: String, answer: String },
}

impl Decision {
    /// The model's reasoning.
    pub fn thought(&self) -> &str {
        match self {
            Decision::CallTool { thought, .. }
            | Decision::CallTools { thought, .. }
            | Decision::FinalAnswer { thought, .. } => thought,
        }
    }

    /// The decision cut before the first call that repeats an earlier call of the same decision (same tool,
    /// same arguments), and whether anything was cut. A small model asked for several calls, once it has
    /// made the ones the request needs, tends to start over from the first: a repeat within one decision
    /// is never useful, and what follows it is a loop, not a request.
    pub fn until_repeated_call(self) -> (Self, bool) {
        let Decision::CallTools { thought, mut calls } = self else { return (self, false) };
        let first_repeat = (1..calls.len()).find(|&i| calls[..i].contains(&calls[i]));
        let Some(i) = first_repeat else { return (Decision::CallTools { thought, calls }, false) };
        calls.truncate(i);
        (Decision::from_calls(thought, calls), true)
    }

    /// A decision making `calls`: a single call when there is one, else several.
    pub(crate) fn from_calls(thought: String, mut calls: Vec<ToolCall>) -> Self {
        match calls.len() {
            1 => {
                let c = calls.pop().expect("one call");
                Decision::CallTool { thought, tool: c.tool, args: c.args }
            }
            _ => Decision::CallTools { thought, calls },
        }
    }

    /// The calls this decision makes (empty for an answer).
    pub fn calls(&self) -> Vec<ToolCall> {
        match self {
            Decision::CallTool { tool, args, .. } => vec![ToolCall { tool: tool.clone(), args: args.clone() }],
            Decision::CallTools { calls, .. } => calls.clone(),
            Decision::FinalAnswer { .. } => Vec::new(),
        }
    }
}

/// Builds the decision schema for `tools` under `choice`.
pub fn decision_schema(tools: &[ToolSpec], choice: &ToolChoice, opts: &DecisionOptions) -> Result<Value> {
    let template: Map<String, Value> =
        serde_json::from_str(TEMPLATE).expect("grammars/decision.schema.json is valid JSON");
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(Error::Tool { tool: t.name.clone(), reason: "registered twice".into() });
        }
    }
    let callable: Vec<&ToolSpec> = match choice {
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
        ToolChoice::None => Vec::new(),
        ToolChoice::Specific(name) => {
            let t = tools.iter().find(|t| &t.name == name).ok_or_else(|| Error::Tool {
                tool: name.clone(),
                reason: format!(
                    "tool choice names an unknown tool (registered: {})",
                    tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            })?;
            vec![t]
        }
    };
    if callable.is_empty() && matches!(choice, ToolChoice::Required) {
        return Err(Error::param("tool choice", "`required` with no tools registered"));
    }
    let thought = json!({"type": "string", "maxLength": opts.max_thought_chars});
    let answer = json!({"type": "string", "maxLength": opts.max_string_chars});
    // The tools' own definitions, moved to the root where their `$ref`s can reach them.
    let defs = std::cell::RefCell::new(Map::new());
    let fill = |shape: &str, tool: Option<&ToolSpec>, extra: &[(&str, Value)]| -> Value {
        let mut vars: Vec<(&str, Value)> = vec![("$thought", thought.clone()), ("$answer", answer.clone())];
        if let Some(t) = tool {
            vars.push(("$tool", Value::String(t.name.clone())));
            vars.push(("$args", hoisted_args(t, opts, &mut defs.borrow_mut())));
        }
        vars.extend(extra.iter().cloned());
        substitute(&template[shape], &vars)
    };
    let mut alternatives: Vec<Value> = callable.iter().map(|t| fill("call_tool", Some(t), &[])).collect();
    let parallel = opts.parallel_calls.filter(|&n| n > 1);
    if let (Some(n), false) = (parallel, callable.is_empty()) {
        let calls: Vec<Value> = callable.iter().map(|t| fill("call", Some(t), &[])).collect();
        alternatives.push(fill("call_tools", None, &[("$max_calls", json!(n)), ("$call", Value::Array(calls))]));
    }
    if matches!(choice, ToolChoice::Auto | ToolChoice::None) {
        alternatives.push(fill("final_answer", None, &[]));
    }
    let mut schema = Map::new();
    schema.insert("x-guidance".into(), template["x-guidance"].clone());
    let defs = defs.into_inner();
    if !defs.is_empty() {
        schema.insert("$defs".into(), Value::Object(defs));
    }
    if alternatives.len() == 1 {
        let only = alternatives.pop().expect("one alternative");
        schema.extend(only.as_object().expect("template shapes are objects").clone());
    } else {
        schema.insert("anyOf".into(), Value::Array(alternatives));
    }
    Ok(Value::Object(schema))
}

/// Replaces every string value equal to a variable name by the variable's value.
fn substitute(v: &Value, vars: &[(&str, Value)]) -> Value {
    match v {
        Value::String(s) => vars.iter().find(|(k, _)| k == s).map(|(_, x)| x.clone()).unwrap_or_else(|| v.clone()),
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, vars)).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), substitute(x, vars))).collect()),
        _ => v.clone(),
    }
}

/// [`bounded_args`] for a schema that sits inside a bigger document: the tool's `$defs` and
/// `definitions` move into `defs` as `<tool>.<name>`, and its `$ref`s (to those, or `#` to the whole
/// argument schema) are rewritten to point there.
pub(crate) fn hoisted_args(tool: &ToolSpec, opts: &DecisionOptions, defs: &mut Map<String, Value>) -> Value {
    let mut args = bounded_args(&tool.parameters, opts);
    let mut local = Map::new();
    if let Some(o) = args.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = o.remove(key) {
                local.extend(d);
            }
        }
    }
    let name = &tool.name;
    let mut recursive = false;
    rewrite_refs(&mut args, name, &mut recursive);
    for (k, mut v) in local {
        rewrite_refs(&mut v, name, &mut recursive);
        defs.insert(format!("{name}.{k}"), v);
    }
    if recursive {
        defs.insert(format!("{name}.__root"), args.clone());
    }
    args
}

fn rewrite_refs(v: &mut Value, tool: &str, recursive: &mut bool) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref") {
                let rest = r.strip_prefix("#/$defs/").or_else(|| r.strip_prefix("#/definitions/"));
                if let Some(rest) = rest {
                    *r = format!("#/$defs/{tool}.{rest}");
                } else if r == "#" {
                    *recursive = true;
                    *r = format!("#/$defs/{tool}.__root");
                }
            }
            o.values_mut().for_each(|x| rewrite_refs(x, tool, recursive));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, tool, recursive)),
        _ => {}
    }
}

/// The bound given to integers without their own: fifteen digits, as many as a double holds exactly.
pub const MAX_NUMBER: i64 = 999_999_999_999_999;

/// A tool's argument schema with length bounds added where it has none (strings, arrays, and integers:
/// [`MAX_NUMBER`]), and `additionalProperties: false` on objects that do not say otherwise (a decision
/// may not invent arguments).
pub(crate) fn bounded_args(schema: &Value, opts: &DecisionOptions) -> Value {
    let mut s = schema.clone();
    bound(&mut s, opts);
    if let Some(o) = s.as_object_mut() {
        o.entry("type").or_insert_with(|| json!("object"));
        o.entry("properties").or_insert_with(|| json!({}));
    }
    s
}

fn bound(v: &mut Value, opts: &DecisionOptions) {
    let Some(o) = v.as_object_mut() else { return };
    let is = |o: &Map<String, Value>, ty: &str| match o.get("type") {
        Some(Value::String(t)) => t == ty,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == ty),
        _ => false,
    };
    if is(o, "string") && !o.contains_key("enum") && !o.contains_key("const") && !o.contains_key("pattern") {
        o.entry("maxLength").or_insert_with(|| json!(opts.max_string_chars));
    }
    if is(o, "array") {
        let nested = o.get("items").and_then(Value::as_object).is_some_and(|i| is(i, "object") || is(i, "array"));
        let most = if nested { opts.max_nested_items } else { opts.max_array_items };
        o.entry("maxItems").or_insert_with(|| json!(most));
    }
    // A small model can run a number on ("100000000000000000000…") until the token limit cuts the decision
    // off. Integers are bounded here; numbers are not (a bound takes away their exponent: "8.854e-12"), and
    // constrained decoding caps every run of digits (`MAX_DIGIT_RUN`), their fraction's too.
    if is(o, "integer") && !is(o, "number") && !o.contains_key("enum") && !o.contains_key("const") {
        let given = |o: &Map<String, Value>, keys: [&str; 2]| keys.iter().find_map(|k| o.get(*k)?.as_f64());
        let (low, high) = (given(o, ["minimum", "exclusiveMinimum"]), given(o, ["maximum", "exclusiveMaximum"]));
        let max = MAX_NUMBER as f64;
        // Each missing side, unless the other lies beyond it (the schema's own range is kept whole).
        if low.is_none() && high.is_none_or(|h| h >= -max) {
            o.insert("minimum".into(), json!(-MAX_NUMBER));
        }
        if high.is_none() && low.is_none_or(|l| l <= max) {
            o.insert("maximum".into(), json!(MAX_NUMBER));
        }
    }
    if is(o, "object") {
        o.entry("additionalProperties").or_insert(Value::Bool(false));
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(props)) = o.get_mut(key) {
            props.values_mut().for_each(|p| bound(p, opts));
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(x) = o.get_mut(key) {
            bound(x, opts);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(xs)) = o.get_mut(key) {
            xs.iter_mut().for_each(|x| bound(x, opts));
        }
    }
}

/// A decision schema compiled for validation (compile once, check every decision).
pub struct DecisionValidator {
    validator: jsonschema::Validator,
}

/// Why a reply is not a valid decision: the text the model is shown when the step is retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// The reply is not JSON.
    #[error("not valid JSON: {0}")]
    NotJson(String),
    /// The JSON fails the decision schema (a wrong tool name, arguments against the tool's schema…).
    #[error("{message} (at {at})")]
    Schema { message: String, at: String },
    /// The JSON passes the schema but does not read as a decision.
    #[error("not a decision: {0}")]
    NotADecision(String),
    /// A reply in the native format that cannot be read (an unclosed call, a call that is not JSON…).
    #[error("{0}")]
    Native(String),
}

impl DecisionValidator {
    pub fn new(schema: &Value) -> Result<Self> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| Error::grammar("decision schema", e.to_string()))?;
        Ok(Self { validator })
    }

    /// Checks a parsed JSON value against the schema and reads it as a decision.
    pub fn parse(&self, v: Value) -> std::result::Result<Decision, DecisionError> {
        if let Some(e) = self.validator.iter_errors(&v).next() {
            return Err(DecisionError::Schema { message: e.to_string(), at: e.instance_path().to_string() });
        }
        serde_json::from_value(v).map_err(|e| DecisionError::NotADecision(e.to_string()))
    }
}

/// Parses a decision from JSON text, checking it against `schema` (a decision schema from
/// [`decision_schema`]) with a JSON-schema validator.
pub fn parse_decision(text: &str, schema: &Value) -> Result<std::result::Result<Decision, DecisionError>> {
    let validator = DecisionValidator::new(schema)?;
    Ok(match serde_json::from_str(text) {
        Ok(v) => validator.parse(v),
        Err(e) => Err(DecisionError::NotJson(e.to_string())),
    })
}

/// The system-prompt text that tells the model its tools and the decision format, with a short example.
pub fn decision_instructions(tools: &[ToolSpec], choice: &ToolChoice, opts: &DecisionOptions) -> String {
    let mut s = String::from(
        "You are an agent that solves the user's task step by step. At each step reply with ONE JSON object, \
         nothing else.\n",
    );
    if !tools.is_empty() && *choice != ToolChoice::None {
        s.push_str("\nTools:\n");
        for t in tools {
            s.push_str(&format!("- {}: {} Arguments (JSON schema): {}\n", t.name, t.description, t.parameters));
        }
        s.push_str(
            "\nTo call a tool: {\"thought\":\"<your reasoning>\",\"type\":\"call_tool\",\"tool\":\"<tool name>\",\
             \"args\":{<arguments>}}\n",
        );
        if let Some(n) = opts.parallel_calls.filter(|&n| n > 1) {
            s.push_str(&format!(
                "To call up to {n} tools at once: {{\"thought\":\"...\",\"type\":\"call_tools\",\"calls\":\
                 [{{\"tool\":\"<name>\",\"args\":{{...}}}},...]}}\n"
            ));
        }
        s.push_str("The tool's result comes back as an observation; then decide the next step.\n");
    }
    if matches!(choice, ToolChoice::Auto | ToolChoice::None) {
        s.push_str(
            "When you know the answer: {\"thought\":\"<your reasoning>\",\"type\":\"final_answer\",\
             \"answer\":\"<the answer>\"}\n",
        );
        if matches!(choice, ToolChoice::Auto) && !tools.is_empty() {
            s.push_str("If no listed tool helps with the task, give the final answer directly.\n");
        }
    }
    s.push_str("Never repeat a call you already made: use its observation. As soon as the observations answer the task, give the final answer.\n");
    if *choice != ToolChoice::None && !tools.is_empty() {
        s.push_str(&example_exchange(choice, opts.parallel_calls.is_some_and(|n| n > 1)));
    }
    if opts.max_thought_chars == 0 {
        // The grammar leaves every thought empty: the format and the example show it so.
        let thought = regex::Regex::new(r#""thought":"[^"]*""#).expect("a valid regex");
        s = thought.replace_all(&s, r#""thought":"""#).into_owned();
    }
    s
}

/// A concrete exchange with made-up tools: small models copy placeholders literally, and they need to see
/// the answer being taken from the observation, and (one call at a time) a value read by one tool worked
/// on by another rather than answered as read. Made-up tools are used rather than listed ones: an example
/// call to a real tool gets copied into unrelated tasks.
fn example_exchange(choice: &ToolChoice, parallel: bool) -> String {
    let mut s = String::new();
    s.push_str("\nExample of a whole exchange, with made-up tools (use only the tools listed above):\n");
    if parallel {
        s.push_str(
            "User: When are the dentist and the vet appointments?\n\
             You: {\"thought\":\"Two independent lookups: I make both calls at once.\",\"type\":\"call_tools\",\
             \"calls\":[{\"tool\":\"lookup_notes\",\"args\":{\"query\":\"dentist\"}},\
             {\"tool\":\"lookup_notes\",\"args\":{\"query\":\"vet\"}}]}\n\
             User: Observation: lookup_notes {\"query\":\"dentist\"} returned: dentist: Friday 3 pm\n\
             lookup_notes {\"query\":\"vet\"} returned: vet: Monday 9 am\n",
        );
        if matches!(choice, ToolChoice::Auto) {
            s.push_str(
                "You: {\"thought\":\"The notes give both times.\",\"type\":\"final_answer\",\
                 \"answer\":\"Dentist: Friday at 3 pm; vet: Monday at 9 am\"}\n",
            );
        }
    } else {
        s.push_str(
            "User: How long is the hike in the notes, in miles?\n\
             You: {\"thought\":\"The notes may give the hike's length.\",\"type\":\"call_tool\",\
             \"tool\":\"lookup_notes\",\"args\":{\"query\":\"hike\"}}\n\
             User: Observation: lookup_notes {\"query\":\"hike\"} returned: hike: 12 km along the ridge\n\
             You: {\"thought\":\"12 km, asked in miles: a tool converts it.\",\"type\":\"call_tool\",\
             \"tool\":\"convert_units\",\"args\":{\"value\":12,\"from\":\"km\",\"to\":\"mi\"}}\n\
             User: Observation: convert_units {\"value\":12,\"from\":\"km\",\"to\":\"mi\"} returned: 7.46\n",
        );
        if matches!(choice, ToolChoice::Auto) {
            s.push_str(
                "You: {\"thought\":\"The conversion gives 7.46.\",\"type\":\"final_answer\",\
                 \"answer\":\"7.46 miles\"}\n",
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calc() -> ToolSpec {
        ToolSpec::new(
            "calculator",
            "Evaluates arithmetic",
            json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
        )
        .unwrap()
    }

    #[test]
    fn string_and_array_arguments_get_bounds() {
        let s = decision_schema(&[calc()], &ToolChoice::Specific("calculator".into()), &DecisionOptions::default())
            .unwrap();
        assert_eq!(s["properties"]["args"]["properties"]["expression"]["maxLength"], 1000);
        assert_eq!(s["properties"]["args"]["additionalProperties"], false);
        assert_eq!(s["properties"]["thought"]["maxLength"], 200);
        assert_eq!(s["properties"]["tool"]["const"], "calculator");
    }

    #[test]
    fn integers_without_bounds_get_fifteen_digits() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "x": {"type": ["number", "null"]}, "pct": {"type": "integer", "maximum": 100},
            "k": {"type": "integer", "enum": [1, 2]}, "y": {"type": "number"}
        }});
        let b = bounded_args(&schema, &DecisionOptions::default());
        assert_eq!(b["properties"]["n"]["maximum"], MAX_NUMBER);
        assert_eq!(b["properties"]["n"]["minimum"], -MAX_NUMBER);
        assert_eq!(b["properties"]["pct"]["maximum"], 100, "its own bound is kept");
        assert_eq!(b["properties"]["pct"]["minimum"], -MAX_NUMBER, "the missing side is added");
        assert!(b["properties"]["k"].get("maximum").is_none(), "an enum is bound enough");
        for free in ["x", "y"] {
            assert!(b["properties"][free].get("maximum").is_none(), "a number keeps its exponent: {free}");
        }
    }

    #[test]
    fn arrays_of_objects_get_fewer_items_than_arrays_of_scalars() {
        let schema = json!({"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "ingredients": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            "few": {"type": "array", "items": {"type": "object"}, "maxItems": 50}
        }});
        let opts = DecisionOptions::default();
        let b = bounded_args(&schema, &opts);
        assert_eq!(b["properties"]["tags"]["maxItems"], opts.max_array_items);
        assert_eq!(b["properties"]["ingredients"]["maxItems"], opts.max_nested_items);
        assert_eq!(b["properties"]["grid"]["maxItems"], opts.max_nested_items);
        assert_eq!(b["properties"]["grid"]["items"]["maxItems"], opts.max_array_items, "its rows hold scalars");
        assert_eq!(b["properties"]["few"]["maxItems"], 50, "its own bound is kept");
        assert!(opts.max_nested_items < opts.max_array_items);
    }

    #[test]
    fn calls_stop_at_the_first_repeat() {
        let c = |x: i64| ToolCall { tool: "f".into(), args: json!({"x": x}) };
        let d = Decision::CallTools { thought: String::new(), calls: vec![c(1), c(2), c(1), c(3)] };
        let (d, cut) = d.until_repeated_call();
        assert!(cut);
        assert_eq!(d.calls(), vec![c(1), c(2)]);
        let (d, cut) = Decision::CallTools { thought: String::new(), calls: vec![c(1), c(1)] }.until_repeated_call();
        assert!(cut && matches!(d, Decision::CallTool { .. }), "{d:?}");
        let same = Decision::CallTools { thought: String::new(), calls: vec![c(1), c(2)] };
        assert_eq!(same.clone().until_repeated_call(), (same, false));
    }

    #[test]
    fn tool_choice_errors_name_the_problem() {
        let err = decision_schema(&[calc()], &ToolChoice::Specific("nope".into()), &DecisionOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("`nope`") && err.contains("calculator"), "{err}");
        let err = decision_schema(&[], &ToolChoice::Required, &DecisionOptions::default()).unwrap_err().to_string();
        assert!(err.contains("required"), "{err}");
        let err =
            decision_schema(&[calc(), calc()], &ToolChoice::Auto, &DecisionOptions::default()).unwrap_err().to_string();
        assert!(err.contains("twice"), "{err}");
    }
}
