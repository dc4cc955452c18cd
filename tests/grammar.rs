//! Grammar-constrained decoding: data-driven accept/reject tables for schemas, Lark grammars, regexes and
//! the decision grammar in every tool-choice mode; a property test that constrained sampling from a
//! random-weight model always yields decisions a JSON-schema validator accepts; clear errors for bad
//! grammars before any token is generated.

mod common;

use reagent::agent::native::CallSyntax;
use std::sync::Arc;

use common::tiny_model;
use reagent::agent::decision::parse_decision;
use reagent::model::Arch;
use reagent::{
    decision_schema, generate, Decision, DecisionOptions, GenerateParams, Grammar, GrammarEngine, LanguageModel,
    Sampling, ToolChoice, ToolSpec,
};
use serde_json::{json, Value};

fn engine() -> (GrammarEngine, Arc<reagent::Tokenizer>) {
    let m = tiny_model(Arch::Qwen2);
    let tok = m.tokenizer().clone();
    (GrammarEngine::new(tok.clone(), m.vocab_size(), m.stop_tokens()).unwrap(), tok)
}

/// Whether the whole of `text` is a complete match of `grammar`.
fn accepts(engine: &GrammarEngine, tok: &reagent::Tokenizer, grammar: &Grammar, text: &str) -> bool {
    let mut c = engine.constraint(grammar).unwrap();
    let ids = tok.encode(text, false).unwrap();
    c.consume_prefix(&ids).unwrap() == ids.len() && c.is_accepting()
}

fn check_table(grammar: Grammar, accepted: &[&str], rejected: &[&str]) {
    let (engine, tok) = engine();
    for s in accepted {
        assert!(accepts(&engine, &tok, &grammar, s), "should accept {s:?} under {grammar:?}");
    }
    for s in rejected {
        assert!(!accepts(&engine, &tok, &grammar, s), "should reject {s:?} under {grammar:?}");
    }
}

#[test]
fn json_schema_types_enums_required_nested_and_arrays() {
    let schema = json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "unit": {"enum": ["c", "f"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "loc": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}
        },
        "required": ["n", "unit"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false}
    });
    check_table(
        Grammar::JsonSchema(schema),
        &[
            r#"{"n":3,"unit":"c"}"#,
            r#"{"n":-12,"unit":"f","tags":["a","b"]}"#,
            r#"{"n":0,"unit":"c","loc":{"lat":1.5}}"#,
        ],
        &[
            r#"{"n":3.5,"unit":"c"}"#,
            r#"{"n":"3","unit":"c"}"#,
            r#"{"n":3,"unit":"k"}"#,
            r#"{"unit":"c"}"#,
            r#"{"n":3,"unit":"c","tags":["a","b","c"]}"#,
            r#"{"n":3,"unit":"c","loc":{}}"#,
            r#"{"n":3,"unit":"c","extra":1}"#,
            r#"{"n": 3,"unit":"c"}"#,
        ],
    );
}

#[test]
fn lark_and_regex() {
    check_table(
        Grammar::Lark(
            r#"start: "Answer: " NUM " " UNIT
NUM: /[0-9]+/
UNIT: "kg" | "g""#
                .into(),
        ),
        &["Answer: 12 kg", "Answer: 7 g"],
        &["Answer: 12kg", "answer: 12 kg", "Answer: x g", "Answer: 12 lb"],
    );
    check_table(Grammar::Regex(r"(yes|no)\.".into()), &["yes.", "no."], &["yes", "maybe.", "yes.."]);
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            "calculator",
            "Evaluates an arithmetic expression",
            json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
        )
        .unwrap(),
        ToolSpec::new(
            "weather",
            "Current weather",
            json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"enum": ["c", "f"]}
                },
                "required": ["city", "days"]
            }),
        )
        .unwrap(),
    ]
}

const CALC: &str = r#"{"thought":"add","type":"call_tool","tool":"calculator","args":{"expression":"1+2"}}"#;
const WEATHER: &str =
    r#"{"thought":"t","type":"call_tool","tool":"weather","args":{"city":"Oslo","days":3,"unit":"c"}}"#;
const ANSWER: &str = r#"{"thought":"done","type":"final_answer","answer":"3"}"#;
const PARALLEL: &str = r#"{"thought":"both","type":"call_tools","calls":[{"tool":"calculator","args":{"expression":"2"}},{"tool":"weather","args":{"city":"Rome","days":1}}]}"#;

/// Decisions the `auto` decision grammar of [`tools`] refuses.
const WRONG_DECISIONS: &[&str] = &[
    // args of the other tool
    r#"{"thought":"x","type":"call_tool","tool":"calculator","args":{"city":"Oslo","days":3}}"#,
    // integer argument given as a string / out of range
    r#"{"thought":"t","type":"call_tool","tool":"weather","args":{"city":"Oslo","days":"3"}}"#,
    r#"{"thought":"t","type":"call_tool","tool":"weather","args":{"city":"Oslo","days":9}}"#,
    // missing required argument, unknown tool, unknown argument
    r#"{"thought":"t","type":"call_tool","tool":"weather","args":{"city":"Oslo"}}"#,
    r#"{"thought":"t","type":"call_tool","tool":"search","args":{}}"#,
    r#"{"thought":"t","type":"call_tool","tool":"calculator","args":{"expression":"1","x":1}}"#,
    // shapes: answer without answer, thought not first, parallel calls when not enabled
    r#"{"thought":"t","type":"final_answer"}"#,
    r#"{"type":"final_answer","thought":"t","answer":"a"}"#,
    PARALLEL,
    // arguments out of the schema's order
    r#"{"thought":"t","type":"call_tool","tool":"weather","args":{"days":3,"city":"Oslo"}}"#,
];

fn decision(choice: ToolChoice, opts: DecisionOptions) -> Grammar {
    Grammar::JsonSchema(decision_schema(&tools(), &choice, &opts).unwrap())
}

#[test]
fn decision_grammar_ties_args_to_the_named_tool() {
    check_table(decision(ToolChoice::Auto, DecisionOptions::default()), &[CALC, WEATHER, ANSWER], WRONG_DECISIONS);
}

#[test]
fn every_tool_choice_mode() {
    let opts = DecisionOptions::default;
    check_table(decision(ToolChoice::Required, opts()), &[CALC, WEATHER], &[ANSWER]);
    check_table(decision(ToolChoice::None, opts()), &[ANSWER], &[CALC, WEATHER]);
    check_table(decision(ToolChoice::Specific("weather".into()), opts()), &[WEATHER], &[CALC, ANSWER]);
    let parallel = opts().parallel_calls(Some(2));
    check_table(decision(ToolChoice::Auto, parallel.clone()), &[CALC, ANSWER, PARALLEL], &[]);
    let three = r#"{"thought":"x","type":"call_tools","calls":[{"tool":"calculator","args":{"expression":"1"}},{"tool":"calculator","args":{"expression":"2"}},{"tool":"calculator","args":{"expression":"3"}}]}"#;
    check_table(decision(ToolChoice::Required, parallel), &[PARALLEL], &[three, ANSWER]);
}

#[test]
fn strings_are_bounded() {
    let opts = DecisionOptions::default().max_thought_chars(5).max_string_chars(4);
    check_table(
        decision(ToolChoice::Auto, opts),
        &[r#"{"thought":"12345","type":"final_answer","answer":"abcd"}"#],
        &[
            r#"{"thought":"123456","type":"final_answer","answer":"a"}"#,
            r#"{"thought":"1","type":"final_answer","answer":"abcde"}"#,
            r#"{"thought":"1","type":"call_tool","tool":"calculator","args":{"expression":"12345"}}"#,
        ],
    );
}

#[test]
fn several_tool_sets_compile() {
    let (engine, _) = engine();
    let many: Vec<ToolSpec> = (0..20)
        .map(|i| {
            ToolSpec::new(
                format!("tool_{i}"),
                "a tool",
                json!({"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}, "flag": {"type": "boolean"}, "xs": {"type": "array", "items": {"type": "number"}}}, "required": ["q"]}),
            )
            .unwrap()
        })
        .collect();
    for set in [&many[..1], &many[..5], &many[..]] {
        for choice in [ToolChoice::Auto, ToolChoice::Required, ToolChoice::None, ToolChoice::Specific("tool_0".into())]
        {
            let schema = decision_schema(set, &choice, &DecisionOptions::default()).unwrap();
            engine.constraint(&Grammar::JsonSchema(schema)).unwrap();
        }
    }
}

#[test]
fn bad_grammars_fail_before_generation_and_say_why() {
    let (engine, _) = engine();
    let err = |g: Grammar| engine.constraint(&g).err().expect("should fail").to_string();
    let e = err(Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "strng"}}})));
    assert!(e.contains("JSON schema") && e.contains("strng"), "{e}");
    let e = err(Grammar::Lark("start: foo\n".into()));
    assert!(e.contains("Lark") && e.contains("foo"), "{e}");
    let e = err(Grammar::Regex("(unclosed".into()));
    assert!(e.contains("regex"), "{e}");
    // Typed, with the compiler's error kept as the cause.
    let e = engine.constraint(&Grammar::Regex("(unclosed".into())).err().unwrap();
    assert!(matches!(&e, reagent::Error::InvalidGrammar { what, .. } if what == "regex"), "{e:?}");
    let cause = std::error::Error::source(&e).expect("the regex error is the source");
    assert!(cause.to_string().contains("unclosed"), "{cause}");
}

/// Property: under the decision grammar, a random-weight model sampling at temperature 1.0 always produces
/// a decision that parses and that a JSON-schema validator (not the grammar) accepts.
#[test]
fn random_model_decisions_always_validate() {
    let mut model = tiny_model(Arch::Qwen2);
    let tok = model.tokenizer().clone();
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), model.stop_tokens()).unwrap();
    let opts = DecisionOptions::default().max_thought_chars(24).max_string_chars(12).parallel_calls(Some(2));
    let prompt = tok.encode("hello world", false).unwrap();
    let mut kinds = std::collections::HashSet::new();
    for (i, choice) in
        [ToolChoice::Auto, ToolChoice::Required, ToolChoice::None, ToolChoice::Specific("weather".into())]
            .into_iter()
            .enumerate()
    {
        let schema = decision_schema(&tools(), &choice, &opts).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        for seed in 0..40u64 {
            let mut c = engine.constraint(&Grammar::JsonSchema(schema.clone())).unwrap();
            let params = GenerateParams::default()
                .max_tokens(400)
                .sampling(Sampling::Random { temperature: 1.0, top_k: None, top_p: None })
                .seed(seed * 31 + i as u64);
            let stops = model.stop_tokens().to_vec();
            let g = generate(
                &mut model,
                &tok,
                reagent::Request::new(&prompt).stop_tokens(&stops).constraint(Some(&mut c)),
                &params,
                &mut |_| {},
            )
            .unwrap();
            let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", g.text));
            assert!(validator.is_valid(&v), "seed {seed} {choice:?}: {}", g.text);
            let d = parse_decision(&g.text, &schema).unwrap().unwrap();
            kinds.insert(std::mem::discriminant(&d));
            match (&choice, &d) {
                (ToolChoice::None, Decision::FinalAnswer { .. }) => {}
                (ToolChoice::None, _) => panic!("tool call under `none`: {}", g.text),
                (ToolChoice::Required | ToolChoice::Specific(_), Decision::FinalAnswer { .. }) => {
                    panic!("answer under {choice:?}: {}", g.text)
                }
                (ToolChoice::Specific(name), d) => assert!(d.calls().iter().all(|c| &c.tool == name)),
                _ => {}
            }
        }
    }
    assert!(kinds.len() >= 2, "the random model should produce more than one kind of decision");
}

/// Whether constrained generations of the decision grammars end complete within a tight token limit (200),
/// for a random-weight model whose strings would otherwise run on for hundreds of tokens. The tiny
/// vocabulary is mostly single bytes (`"type":"call_tools"` is 18 tokens, not Qwen's 5), so the closing
/// room is scaled up from the default [`CLOSE_WITHIN`](reagent::decode::generate::CLOSE_WITHIN) likewise.
fn decisions_within_limit(close_within: usize) -> Vec<(String, bool)> {
    let mut model = tiny_model(Arch::Qwen2);
    let tok = model.tokenizer().clone();
    let stops = model.stop_tokens().to_vec();
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), &stops).unwrap();
    let opts = DecisionOptions::default().parallel_calls(Some(2));
    let schema = decision_schema(&tools(), &ToolChoice::Auto, &opts).unwrap();
    let grammars = [Grammar::JsonSchema(schema.clone()), native(ToolChoice::Auto, opts)];
    let prompt = tok.encode("hello world", false).unwrap();
    let mut out = Vec::new();
    for (g, grammar) in grammars.iter().enumerate() {
        for seed in 0..12u64 {
            let mut c = engine.constraint(grammar).unwrap();
            let params = GenerateParams::default()
                .max_tokens(200)
                .sampling(Sampling::Random { temperature: 1.0, top_k: None, top_p: None })
                .seed(seed * 7 + g as u64)
                .close_within(close_within);
            let gen = generate(
                &mut model,
                &tok,
                reagent::Request::new(&prompt).stop_tokens(&stops).constraint(Some(&mut c)),
                &params,
                &mut |_| {},
            )
            .unwrap();
            let complete = c.is_finished() || c.is_accepting() && gen.stop != reagent::FinishReason::MaxTokens;
            let parses = match g {
                0 => parse_decision(&gen.text, &schema).is_ok_and(|d| d.is_ok()),
                _ => reagent::agent::native::parse_native(&gen.text, &CallSyntax::hermes()).is_ok(),
            };
            out.push((format!("{} [{} tokens, {:?}]", gen.text, gen.tokens.len(), gen.stop), complete && parses));
        }
    }
    out
}

/// Near the token limit constrained output is steered to close what is open: ReAct and native decisions of
/// a model that never ends a string by itself still end complete and parse within the limit; without the
/// steering they are cut off.
#[test]
fn decisions_close_before_the_token_limit() {
    for (text, ok) in decisions_within_limit(100) {
        assert!(ok, "cut off or unparsable: {text}");
    }
    let cut = decisions_within_limit(0).into_iter().filter(|(_, ok)| !ok).count();
    assert!(cut > 0, "without closing, a random model's strings should run past the limit");
}

/// What a decision for the calculator (strings capped at 10 characters) is generated from on `model`: its
/// tokenizer, the decision grammar's constraint, a prompt and the generation's parameters.
fn calculator_decision(
    model: &reagent::Model,
) -> (Arc<reagent::Tokenizer>, reagent::Constraint, Vec<u32>, GenerateParams) {
    let tok = model.tokenizer().clone();
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), model.stop_tokens()).unwrap();
    let opts = DecisionOptions::default().max_thought_chars(10).max_string_chars(10);
    let schema = decision_schema(&tools(), &ToolChoice::Specific("calculator".into()), &opts).unwrap();
    let c = engine.constraint(&Grammar::JsonSchema(schema)).unwrap();
    let prompt = tok.encode("hello", false).unwrap();
    (tok, c, prompt, GenerateParams::default().max_tokens(2000))
}

#[test]
fn forced_tokens_are_counted_and_structure_is_forced() {
    let mut model = tiny_model(Arch::Qwen2);
    let (tok, mut c, prompt, params) = calculator_decision(&model);
    let g = generate(&mut model, &tok, reagent::Request::new(&prompt).constraint(Some(&mut c)), &params, &mut |_| {})
        .unwrap();
    assert!(g.text.starts_with(r#"{"thought":""#), "{}", g.text);
    // `{"thought":"` is forced, and so is `","type":"call_tool","tool":"calculator","args":{"expression":"`.
    let forced = c.stats().forced_tokens;
    let prefix = tok.encode(r#"{"thought":""#, false).unwrap().len();
    assert!(forced >= prefix + 10, "only {forced} forced tokens: {} ({:?})", g.text, g.stop);
    assert_eq!(g.stop, reagent::FinishReason::GrammarComplete);
    assert_eq!(forced + c.stats().sampled_tokens, g.tokens.len());
}

/// A model that records each forward pass (tokens, position) of the model it wraps.
struct Recording<'a> {
    inner: &'a mut reagent::Model,
    calls: Vec<(usize, usize)>,
}

impl LanguageModel for Recording<'_> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn context_length(&self) -> usize {
        self.inner.context_length()
    }
    fn cache_len(&self) -> usize {
        self.inner.cache_len()
    }
    fn forward(&mut self, tokens: &[u32], pos: usize) -> reagent::Result<Vec<f32>> {
        self.calls.push((tokens.len(), pos));
        self.inner.forward(tokens, pos)
    }
    fn truncate(&mut self, len: usize) {
        self.inner.truncate(len)
    }
}

/// A run of forced tokens after a sampled token goes through the model in the same forward pass as that
/// token: one pass per sampled token (plus the forced start), each generated token run once, in order.
#[test]
fn forced_tokens_share_the_forward_pass_of_the_sampled_token_before_them() {
    let mut model = tiny_model(Arch::Qwen2);
    let (tok, mut c, prompt, params) = calculator_decision(&model);
    let mut rec = Recording { inner: &mut model, calls: Vec::new() };
    let g = generate(&mut rec, &tok, reagent::Request::new(&prompt).constraint(Some(&mut c)), &params, &mut |_| {})
        .unwrap();
    assert_eq!(g.stop, reagent::FinishReason::GrammarComplete);
    let (prefill, after) = rec.calls.split_first().expect("a prefill");
    assert_eq!(*prefill, (prompt.len(), 0));
    let mut pos = prompt.len();
    for &(n, p) in after {
        assert_eq!(p, pos, "forward passes run the generated tokens in order: {:?}", rec.calls);
        pos += n;
    }
    let run = pos - prompt.len();
    assert!(run == g.tokens.len() || run + 1 == g.tokens.len(), "{run} of {} tokens run", g.tokens.len());
    let sampled = c.stats().sampled_tokens;
    assert!(after.iter().any(|&(n, _)| n > 1), "no forced run: {}", g.text);
    assert!(
        after.len() <= sampled + 1,
        "{} passes for {sampled} sampled tokens: forced runs took passes of their own ({:?})",
        after.len(),
        after
    );
}

// The native format: `<tool_call>` blocks in the model's own syntax, or a plain answer.

const N_CALC: &str = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+2\"}}\n</tool_call>";
const N_WEATHER: &str =
    "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>";
const N_ANSWER: &str = "It is 4.";

fn native(choice: ToolChoice, opts: DecisionOptions) -> Grammar {
    Grammar::Lark(reagent::agent::native::native_grammar(&tools(), &choice, &opts, &CallSyntax::hermes()).unwrap())
}

/// The grammar of a proposed call: a separator, then exactly one call by the tools' schemas, nothing else.
#[test]
fn the_extension_grammar_is_one_more_call() {
    let opts = DecisionOptions::default().parallel_calls(Some(3));
    let g = Grammar::Lark(
        reagent::agent::native::native_extension_grammar(&tools(), &ToolChoice::Auto, &opts, &CallSyntax::hermes())
            .unwrap(),
    );
    check_table(
        g,
        &[&format!("\n{N_CALC}"), &format!("\n\n{N_WEATHER}")],
        &[N_CALC, &format!("\n{N_CALC}\n{N_CALC}"), &format!("\n{N_ANSWER}"), "\n", &format!("\n{N_CALC} and")],
    );
    let none =
        reagent::agent::native::native_extension_grammar(&tools(), &ToolChoice::None, &opts, &CallSyntax::hermes());
    assert!(none.is_err(), "no call to propose under `none`");
}

/// A decision made a call at a time: its first call (or its answer), then its continuation after its
/// first calls: stop, or as many more calls as the decision had left, nothing else; none once it has no
/// call left.
#[test]
fn the_continuation_grammar_is_the_decisions_remaining_calls() {
    use reagent::agent::native::native_continuation_grammar;
    let opts = DecisionOptions::default().parallel_calls(Some(3));
    let Grammar::Lark(g) = native(ToolChoice::Auto, opts) else { unreachable!() };
    let after_one = Grammar::Lark(native_continuation_grammar(&g, 1).unwrap());
    check_table(
        after_one,
        &["", &format!("\n{N_CALC}"), &format!("\n\n{N_WEATHER}\n{N_CALC}")],
        &[N_CALC, N_ANSWER, &format!("\n{N_ANSWER}"), &format!("\n{N_CALC}\n{N_CALC}\n{N_CALC}"), "\n"],
    );
    let after_two = Grammar::Lark(native_continuation_grammar(&g, 2).unwrap());
    check_table(after_two, &["", &format!("\n{N_WEATHER}")], &[&format!("\n{N_CALC}\n{N_CALC}")]);
    assert_eq!(native_continuation_grammar(&g, 3), None, "no call left after three");
    assert_eq!(native_continuation_grammar(&g, 0), None);
    let first = Grammar::Lark(reagent::agent::native::native_first_call_grammar(&g).unwrap());
    check_table(first, &[N_CALC, N_WEATHER, N_ANSWER], &[&format!("{N_CALC}\n{N_WEATHER}"), ""]);
    let Grammar::Lark(single) = native(ToolChoice::Auto, DecisionOptions::default()) else { unreachable!() };
    assert_eq!(native_continuation_grammar(&single, 1), None, "one call a decision");
    assert_eq!(reagent::agent::native::native_first_call_grammar(&single), None);
}

#[test]
fn native_grammar_ties_arguments_to_the_named_tool() {
    let two = format!("{N_CALC}\n{N_WEATHER}");
    let three = format!("{N_CALC}\n{N_WEATHER}\n{N_CALC}");
    let parallel = DecisionOptions::default().parallel_calls(Some(2));
    check_table(
        native(ToolChoice::Auto, parallel.clone()),
        &[N_CALC, N_WEATHER, N_ANSWER, &two, "Two lines\nof answer"],
        &[
            // the other tool's arguments, a missing required argument, an unknown tool or argument
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\", \"x\": 1}}\n</tool_call>",
            // compact separators (the template renders ", " and ": "), arguments first, no newline
            "<tool_call>\n{\"name\":\"calculator\",\"arguments\":{\"expression\":\"1\"}}\n</tool_call>",
            "<tool_call>\n{\"arguments\": {\"expression\": \"1\"}, \"name\": \"calculator\"}\n</tool_call>",
            "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}</tool_call>",
            // more calls than allowed, text after a call, an unclosed call, an answer starting with `<` or blank
            &three,
            &format!("{N_CALC} done"),
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}",
            "<b>4</b>",
            " 4",
            "",
        ],
    );
    let single = DecisionOptions::default();
    check_table(native(ToolChoice::Auto, single.clone()), &[N_CALC, N_ANSWER], &[&two]);
    check_table(native(ToolChoice::Required, single.clone()), &[N_CALC, N_WEATHER], &[N_ANSWER]);
    check_table(native(ToolChoice::None, single.clone()), &[N_ANSWER], &[N_CALC]);
    check_table(native(ToolChoice::Specific("weather".into()), single), &[N_WEATHER], &[N_CALC, N_ANSWER]);
}

/// A branch bias decides the call/answer choice at the first token, and its margin is recorded before the
/// bias: a large positive bias makes a call, a large negative one an answer, whatever the weights.
#[test]
fn branch_bias_takes_the_call_or_answer_choice() {
    use reagent::decode::constraint::{BranchBias, BranchPoint};
    let mut model = tiny_model(Arch::Qwen2);
    let tok = model.tokenizer().clone();
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), model.stop_tokens()).unwrap();
    let starts = reagent::agent::native::NativeTokens::of(&tok, &CallSyntax::hermes()).call_starts;
    let opts = DecisionOptions::default().max_string_chars(8).max_answer_tokens(6);
    let prompt = tok.encode("hello world", false).unwrap();
    let stops = model.stop_tokens().to_vec();
    let mut margins = Vec::new();
    for bias in [100.0f32, -100.0] {
        let grammar = native(ToolChoice::Auto, opts.clone());
        let branches = vec![BranchBias::new("call", BranchPoint::Start, starts.clone(), bias)];
        let mut c = engine.constraint(&grammar).unwrap().with_branches(branches);
        let params = GenerateParams::default().max_tokens(200);
        let g = generate(
            &mut model,
            &tok,
            reagent::Request::new(&prompt).stop_tokens(&stops).constraint(Some(&mut c)),
            &params,
            &mut |_| {},
        )
        .unwrap();
        let d = reagent::agent::native::parse_native(&g.text, &CallSyntax::hermes())
            .unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
        assert_eq!(matches!(d, Decision::FinalAnswer { .. }), bias < 0.0, "bias {bias}: {:?}", g.text);
        let m = &c.stats().branch_margins;
        assert_eq!(m.len(), 1, "one branch point at the start: {m:?}");
        margins.push(m[0].margin);
    }
    // The recorded margin is the model's own, the same whichever way the bias pushed.
    assert_eq!(margins[0], margins[1]);
}

/// Decodes `schema` on the tiny model with the value-end branches at `close` and `end_list`; the value,
/// its text, and the labels of the branches that applied.
fn decode_with_value_ends(
    schema: &Value,
    close: f32,
    end_list: f32,
    max_tokens: usize,
) -> (Value, String, Vec<&'static str>) {
    let mut model = tiny_model(Arch::Qwen2);
    let tok = model.tokenizer().clone();
    let engine = GrammarEngine::new(tok.clone(), model.vocab_size(), model.stop_tokens()).unwrap();
    let branches = reagent::agent::native::NativeTokens::of(&tok, &CallSyntax::hermes()).ends.branches(close, end_list);
    if close == 0.0 {
        assert!(branches.iter().all(|b| b.label != "close"), "a zero bias adds no branch");
    }
    let mut c = engine.constraint(&Grammar::JsonSchema(schema.clone())).unwrap().with_branches(branches);
    let prompt = tok.encode("hello", false).unwrap();
    let params = GenerateParams::default().max_tokens(max_tokens);
    let g = generate(&mut model, &tok, reagent::Request::new(&prompt).constraint(Some(&mut c)), &params, &mut |_| {})
        .unwrap();
    let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{e}: {}", g.text));
    (v, g.text, c.stats().branch_margins.iter().map(|m| m.label).collect())
}

/// The closing bias applies only between values, where a comma and a closing bracket compete: a large one
/// leaves optional arguments out, a large negative one puts them in, and numbers are never cut by it.
#[test]
fn closing_bias_decides_optional_arguments_only_between_values() {
    let schema = json!({
        "x-guidance": {"whitespace_flexible": false},
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 100, "maximum": 999}, "b": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": false
    });
    for (bias, with_b) in [(100.0f32, false), (-100.0, true)] {
        let (v, text, labels) = decode_with_value_ends(&schema, bias, 0.0, 60);
        assert_eq!(v.get("b").is_some(), with_b, "bias {bias}: {text}");
        assert!((100..=999).contains(&v["a"].as_i64().unwrap()), "three digits, never cut: {text}");
        assert!(labels.iter().all(|&l| l == "close"));
    }
}

/// The end-list bias decides whether a string goes on at a comma (a list written as one value) or ends
/// there, and whether an array takes another item; the object's close is left to the model when its
/// bias is zero.
#[test]
fn end_list_bias_decides_strings_at_commas_and_array_items() {
    let schema = json!({
        "x-guidance": {"whitespace_flexible": false},
        "type": "object",
        "properties": {
            "s": {"type": "string", "pattern": "^a(,a){0,5}$"},
            "n": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 1, "maxItems": 6}
        },
        "required": ["s", "n"],
        "additionalProperties": false
    });
    for bias in [100.0f32, -100.0] {
        let (v, text, labels) = decode_with_value_ends(&schema, 0.0, bias, 80);
        let (s, n) = (v["s"].as_str().unwrap(), v["n"].as_array().unwrap());
        if bias > 0.0 {
            assert_eq!(s, "a", "a string ends where it could go on at a comma: {text}");
            assert_eq!(n.len(), 1, "an array ends after its first item: {text}");
        } else {
            assert_eq!(s, "a,a,a,a,a,a", "a string goes on at a comma: {text}");
            assert_eq!(n.len(), 6, "an array takes items up to its limit: {text}");
        }
        assert!(labels.contains(&"end-string") && labels.contains(&"end-list"), "{labels:?}");
    }
}

/// Deeply nested grammars and schemas (a chain of 3,000 Lark rules, a `$ref` chain of 1,000) compile or
/// fail with an error; they never overflow the stack and abort the process.
#[test]
fn deep_grammars_and_schemas_do_not_overflow_the_stack() {
    let (engine, _) = engine();
    let mut lark = String::from("start: r0\n");
    for i in 0..3000 {
        lark.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
    }
    lark.push_str("r3000: \"b\"\n");
    let _ = engine.constraint(&Grammar::Lark(lark)); // compiled or refused: either is fine, a crash is not
    let mut defs = serde_json::Map::new();
    for i in 0..1000 {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert("d1000".into(), json!({"type": "integer"}));
    let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    let _ = engine.constraint(&Grammar::JsonSchema(schema.clone()));
    let tool = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": schema["$defs"].clone()});
    let _ = reagent::ToolSpec::new("deep", "", tool);
}

/// Tool schemas with their own `$defs` / `definitions` (and a `$ref` to the whole schema) work in both
/// decision formats: the definitions move to the decision's root, so the references resolve, and a
/// decision using them validates and is generated by the grammar.
#[test]
fn tool_schemas_with_definitions_work_in_both_formats() {
    use reagent::agent::decision::DecisionValidator;
    type Opts = DecisionOptions;
    let (engine, tok) = engine();
    let tree = ToolSpec::new(
        "tree",
        "A tree of labels.",
        json!({"type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}, "tag": {"$ref": "#/definitions/Tag"}},
               "required": ["root"],
               "$defs": {"Node": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 4},
                         "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/Node"}}}, "required": ["label"]}},
               "definitions": {"Tag": {"enum": ["a", "b"]}}}),
    )
    .unwrap();
    let schema = decision_schema(std::slice::from_ref(&tree), &ToolChoice::Required, &Opts::default()).unwrap();
    let v = DecisionValidator::new(&schema).unwrap();
    let ok = json!({"thought": "t", "type": "call_tool", "tool": "tree",
                    "args": {"root": {"label": "x", "kids": [{"label": "y"}]}, "tag": "a"}});
    v.parse(ok.clone()).unwrap();
    let bad = json!({"thought": "t", "type": "call_tool", "tool": "tree", "args": {"root": {"kids": []}, "tag": "c"}});
    assert!(v.parse(bad).is_err());
    assert!(accepts(&engine, &tok, &Grammar::JsonSchema(schema.clone()), &ok.to_string()));
    let native =
        reagent::agent::native::native_grammar(&[tree], &ToolChoice::Required, &Opts::default(), &CallSyntax::hermes())
            .unwrap();
    let call = "<tool_call>\n{\"name\": \"tree\", \"arguments\": {\"root\": {\"label\": \"x\", \"kids\": [{\"label\": \"y\"}]}}}\n</tool_call>";
    assert!(accepts(&engine, &tok, &Grammar::Lark(native), call));
}

/// Greedy decoding of `grammar` by fixed preferences (a logit per token text, the rest 0), without a
/// model: the text written.
fn decode_by_preference(grammar: &Grammar, prefer: &[(&str, f32)], max_tokens: usize) -> String {
    let (engine, tok) = engine();
    let mut c = engine.constraint(grammar).unwrap();
    let mut base = vec![0.0f32; tok.vocab_size()];
    for (text, logit) in prefer {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        base[ids[0] as usize] = *logit;
    }
    let mut out = Vec::new();
    while out.len() < max_tokens && !c.is_finished() {
        out.extend(c.forced_tokens().unwrap());
        if c.is_finished() {
            break;
        }
        let mut logits = base.clone();
        c.mask_logits(&mut logits).unwrap();
        let (best, _) =
            logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &l)| if l > b.1 { (i, l) } else { b });
        if Some(best as u32) == tok.eos() || c.is_accepting() && logits[best] == f32::NEG_INFINITY {
            break;
        }
        c.consume(best as u32).unwrap();
        out.push(best as u32);
    }
    tok.decode(&out, false).unwrap()
}

fn longest_digit_run(s: &str) -> usize {
    s.split(|c: char| !c.is_ascii_digit()).map(str::len).max().unwrap_or(0)
}

/// A model that runs a number on ("100000…", "0.00000…") meets the digit cap: the number ends within the
/// token limit, its exponent still allowed; a run the grammar itself requires is never cut.
#[test]
fn runs_of_digits_are_capped_unless_the_grammar_needs_them() {
    use reagent::decode::constraint::MAX_DIGIT_RUN;
    let number = Grammar::JsonSchema(json!({"type": "object", "properties": {"x": {"type": "number"}},
        "required": ["x"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}}));
    // Digits first, then a point, then the end of the object.
    let text = decode_by_preference(&number, &[("1", 10.0), ("0", 9.0), (".", 5.0), ("}", 4.0)], 200);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["x"].is_number(), "{text}");
    assert_eq!(longest_digit_run(&text), MAX_DIGIT_RUN, "{text}");
    assert!(text.contains('.'), "the fraction runs to the cap too: {text}");
    // The exponent form stays open to numbers in the decision grammar (it bounds only integers).
    let force = ToolSpec::new(
        "force",
        "Force between charges",
        json!({"type": "object", "properties": {"permittivity": {"type": "number"}, "n": {"type": "integer"}}}),
    )
    .unwrap();
    let schema = decision_schema(&[force], &ToolChoice::Required, &DecisionOptions::default()).unwrap();
    check_table(
        Grammar::JsonSchema(schema),
        &[r#"{"thought":"","type":"call_tool","tool":"force","args":{"permittivity":8.854e-12}}"#],
        &[r#"{"thought":"","type":"call_tool","tool":"force","args":{"n":1e3}}"#],
    );
    // A pattern that needs thirty digits gets them.
    let thirty = Grammar::JsonSchema(json!({"type": "string", "pattern": "^[0-9]{30}$"}));
    let text = decode_by_preference(&thirty, &[("1", 10.0)], 200);
    assert_eq!(longest_digit_run(&text), 30, "{text}");
}

/// The tokens `prefer_closing` leaves allowed after `prefix` under `schema`, with every token equally likely.
fn closing_choices(schema: Value, prefix: &str) -> Vec<String> {
    let m = tiny_model(Arch::Qwen2);
    let tok = m.tokenizer().clone();
    let engine = GrammarEngine::new(tok.clone(), m.vocab_size(), m.stop_tokens()).unwrap();
    let mut c = engine.constraint(&Grammar::JsonSchema(schema)).unwrap();
    let ids = tok.encode(prefix, false).unwrap();
    assert_eq!(c.consume_prefix(&ids).unwrap(), ids.len(), "{prefix:?}");
    let mut logits = vec![0f32; m.vocab_size()];
    c.mask_logits(&mut logits).unwrap();
    c.prefer_closing(&mut logits);
    let kept = logits.iter().enumerate().filter(|(_, &l)| l > f32::NEG_INFINITY);
    kept.map(|(t, _)| tok.decode(&[t as u32], false).unwrap()).collect()
}

/// Near the token limit, inside a string only a token that starts with its closing quote is left (a `}`
/// there is text, and a model that likes braces wrote `1440000}}}}…` to the limit); outside a string a
/// bracket closes; a string's opening quote is not a way to close an empty array.
#[test]
fn closing_near_the_limit_closes_strings_with_their_quote() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a", "b"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}});
    let in_string = closing_choices(schema.clone(), r#"{"a":"1440000"#);
    assert!(!in_string.is_empty() && in_string.iter().all(|t| t.trim_start().starts_with('"')), "{in_string:?}");
    let in_array = closing_choices(schema, r#"{"a":"x","b":["#);
    assert!(!in_array.is_empty() && in_array.iter().all(|t| t.trim_start().starts_with(']')), "{in_array:?}");
}

/// A grammar that matches nothing is named as such, with a hint for its own kind (a regex that excludes
/// every character was reported as "a $ref cycle").
#[test]
fn a_grammar_matching_nothing_is_explained_for_its_kind() {
    let (engine, _) = engine();
    let err = |g: Grammar| match engine.constraint(&g) {
        Ok(_) => panic!("compiled"),
        Err(e) => e.to_string(),
    };
    let regex = err(Grammar::Regex(r"[^\x00-\x{10FFFF}]".into()));
    assert!(regex.contains("matches no text") && regex.contains("character class"), "{regex}");
    let schema = err(Grammar::JsonSchema(serde_json::json!({"enum": []})));
    assert!(schema.contains("JSON schema") && schema.contains("nsatisfiable"), "{schema}");
}

// GBNF, for llama.cpp's server: the decision grammars written in its format take the same texts.

fn check_gbnf(gbnf: &str, accepted: &[&str], rejected: &[&str]) {
    let g = common::gbnf::Gbnf::parse(gbnf);
    for s in accepted {
        assert!(g.accepts(s), "should accept {s:?} under\n{gbnf}");
    }
    for s in rejected {
        assert!(!g.accepts(s), "should reject {s:?} under\n{gbnf}");
    }
}

/// A ReAct decision schema as GBNF: the tool names, each tool's arguments in order with the required
/// ones, their types, enums and small integer ranges; the shapes of each tool choice.
#[test]
fn decision_schemas_as_gbnf_take_the_same_decisions() {
    use reagent::agent::driver::gbnf;
    let schema = |choice: ToolChoice, opts: DecisionOptions| decision_schema(&tools(), &choice, &opts).unwrap();
    let auto = gbnf::schema(&schema(ToolChoice::Auto, DecisionOptions::default())).unwrap();
    check_gbnf(
        &auto,
        &[
            CALC,
            WEATHER,
            ANSWER,
            r#"{"thought":"t","type":"call_tool","tool":"weather","args":{"city":"Oslo","days":7}}"#,
        ],
        WRONG_DECISIONS,
    );
    let required = gbnf::schema(&schema(ToolChoice::Required, DecisionOptions::default())).unwrap();
    check_gbnf(&required, &[CALC, WEATHER], &[ANSWER]);
    let parallel = DecisionOptions::default().parallel_calls(Some(2));
    check_gbnf(&gbnf::schema(&schema(ToolChoice::Auto, parallel)).unwrap(), &[CALC, ANSWER, PARALLEL], &[]);
    let short = DecisionOptions::default().max_thought_chars(5).max_string_chars(4);
    check_gbnf(
        &gbnf::schema(&schema(ToolChoice::None, short)).unwrap(),
        &[r#"{"thought":"abcde","type":"final_answer","answer":"abcd"}"#],
        &[
            r#"{"thought":"abcdef","type":"final_answer","answer":"a"}"#,
            r#"{"thought":"a","type":"final_answer","answer":"abcde"}"#,
        ],
    );
}

/// A native decision's Lark grammar as GBNF: the calls in the model's syntax with the same arguments, as
/// many as allowed, or an answer that does not start like a call; a token marker as its text.
#[test]
fn native_grammars_as_gbnf_take_the_same_decisions() {
    use reagent::agent::driver::gbnf;
    let (_, tok) = engine();
    let parallel = DecisionOptions::default().parallel_calls(Some(2));
    let Grammar::Lark(lark) = native(ToolChoice::Auto, parallel) else { unreachable!() };
    let two = format!("{N_CALC}\n{N_WEATHER}");
    let three = format!("{N_CALC}\n{N_WEATHER}\n{N_CALC}");
    let fenced = "```json\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+2\"}}\n```";
    check_gbnf(
        &gbnf::lark(&lark, &tok).unwrap(),
        &[N_CALC, N_WEATHER, N_ANSWER, &two, &format!("{N_CALC}\n\n{N_WEATHER}"), "Two lines\nof answer", fenced],
        &[
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
            "<tool_call>\n{\"name\":\"calculator\",\"arguments\":{\"expression\":\"1\"}}\n</tool_call>",
            &three,
            &format!("{N_CALC} done"),
            "<b>4</b>",
            " 4",
            "",
        ],
    );
    // The grammars a decision made a call a request takes.
    let Grammar::Lark(lark) = native(ToolChoice::Auto, DecisionOptions::default().parallel_calls(Some(3))) else {
        unreachable!()
    };
    let first = reagent::agent::native::native_first_call_grammar(&lark).unwrap();
    check_gbnf(&gbnf::lark(&first, &tok).unwrap(), &[N_CALC, N_ANSWER], &[&two]);
    let rest = reagent::agent::native::native_continuation_grammar(&lark, 1).unwrap();
    check_gbnf(&gbnf::lark(&rest, &tok).unwrap(), &["", &format!("\n{N_WEATHER}"), &format!("\n{two}")], &[N_CALC]);
    // A marker by token id is the token's text; an id with no text and a grammar it cannot read are
    // errors naming them.
    let id = tok.token_id("<|im_end|>").unwrap();
    check_gbnf(&gbnf::lark(&format!("start: <[{id}]> \"x\""), &tok).unwrap(), &["<|im_end|>x"], &["x"]);
    let err = gbnf::lark("start: /a|b/", &tok).unwrap_err().to_string();
    assert!(err.contains("gbnf") && err.contains("a|b"), "{err}");
}

/// GBNF read back into Lark (`reagent serve`'s `grammar` field, for clients of llama.cpp's server): a
/// decision schema written as GBNF and read back takes the same decisions under llguidance. (A native
/// grammar's call markers do not come back: GBNF has no special tokens, and llguidance matches a literal
/// with ordinary tokens only.)
#[test]
fn gbnf_read_into_lark_takes_the_same_decisions() {
    use reagent::agent::driver::gbnf;
    use reagent::decode::gbnf::to_lark;
    let schema = decision_schema(&tools(), &ToolChoice::Auto, &DecisionOptions::default()).unwrap();
    let lark = to_lark(&gbnf::schema(&schema).unwrap()).unwrap();
    check_table(Grammar::Lark(lark), &[CALC, WEATHER, ANSWER], WRONG_DECISIONS);
}
