//! A step's grammar and the check of what it decoded: extraction (a complete decision), validation (the
//! decision schema or the native syntax's shape, known tools, the tools' argument schemas and validators),
//! and the decision as the conversation keeps it.

use serde_json::Value;

use super::super::decision::{self, Decision, DecisionFormat, ToolChoice};
use super::super::driver::{self, DriverOutput};
use super::super::native::{self, CallSyntax};
use super::super::{Agent, AgentConfig};
use super::checks::Failure;
use crate::decode::constraint::Grammar;
use crate::error::{Error, Result};
use crate::text::chat::ChatMessage;
use crate::tools::{ToolCall, ToolSpec};

/// The grammar of one step's decisions, with the compiled validator of a ReAct schema.
pub(in crate::agent) struct StepGrammar {
    pub(in crate::agent) grammar: Grammar,
    choice: ToolChoice,
    validator: Option<decision::DecisionValidator>,
}

impl StepGrammar {
    pub(in crate::agent) fn new(
        specs: &[ToolSpec],
        choice: &ToolChoice,
        config: &AgentConfig,
        syntax: &CallSyntax,
    ) -> Result<Self> {
        let opts = &config.decision;
        // The ReAct schema also checks the tool set (duplicates, an unknown tool choice) for both formats.
        let schema = decision::decision_schema(specs, choice, opts)?;
        Ok(match config.format {
            DecisionFormat::React => Self {
                validator: Some(decision::DecisionValidator::new(&schema)?),
                grammar: Grammar::JsonSchema(schema),
                choice: choice.clone(),
            },
            DecisionFormat::Native => Self {
                grammar: Grammar::Lark(native::native_grammar(specs, choice, opts, syntax)?),
                choice: choice.clone(),
                validator: None,
            },
        })
    }
}

impl Agent {
    /// Extraction (a complete JSON object) and validation (the decision schema, known tools, the tools'
    /// argument schemas and validators).
    pub(super) fn check(&self, out: &DriverOutput, schema: &StepGrammar) -> std::result::Result<Decision, Failure> {
        if schema.validator.is_none() {
            return self.check_native(out, schema);
        }
        if !out.complete {
            return Err(Failure::Extraction(format!(
                "the reply ended before the decision was complete ({} tokens)",
                out.stats.generated_tokens
            )));
        }
        let v = driver::extract_json(&out.text)
            .ok_or_else(|| Failure::Extraction("the reply contains no JSON object".into()))?;
        // Calls first: a wrong tool or argument gets a precise message rather than "matches no
        // alternative of the decision schema".
        let calls: Vec<&Value> = match v.get("calls").and_then(|c| c.as_array()) {
            Some(cs) => cs.iter().collect(),
            None if v.get("tool").is_some() => vec![&v],
            None => Vec::new(),
        };
        for c in calls {
            let Some(tool) = c.get("tool").and_then(|t| t.as_str()) else { continue };
            let call = ToolCall { tool: tool.to_string(), args: c.get("args").cloned().unwrap_or(Value::Null) };
            if let Err(e) = self.check_call(&call) {
                return Err(Failure::Validation(e, v));
            }
        }
        let validator = schema.validator.as_ref().expect("ReAct steps have a validator");
        let decision = validator.parse(v.clone()).map_err(|e| Failure::Validation(e.to_string(), v))?;
        Ok(decision)
    }

    /// [`check`](Self::check) for the native format. An answer cut off at the token limit is kept as it
    /// is (an answer has no structure to lose); a cut-off call is an extraction failure.
    fn check_native(&self, out: &DriverOutput, step: &StepGrammar) -> std::result::Result<Decision, Failure> {
        let decision = match native::parse_native(&out.text, &self.syntax) {
            Ok(d) if out.complete || d.calls().is_empty() => d,
            Err(e) if out.complete => return Err(Failure::Extraction(e.to_string())),
            // Cut off by the token limit inside a later call (a runaway string or array): the calls that
            // were complete are kept.
            _ => native::parse_complete_calls(&out.text, &self.syntax).ok_or_else(|| {
                Failure::Extraction(format!(
                    "the reply ended before the call was complete ({} tokens)",
                    out.stats.generated_tokens
                ))
            })?,
        };
        let as_value = || serde_json::to_value(&decision).unwrap_or(Value::Null);
        let calls = decision.calls();
        let max = self.syntax.max_calls(self.config.decision.parallel_calls.unwrap_or(1));
        let shape_error = match (&step.choice, calls.is_empty()) {
            (ToolChoice::None, false) => Some("no tool may be called at this step: answer".to_string()),
            (ToolChoice::Required | ToolChoice::Specific(_), true) => Some("a tool must be called".to_string()),
            _ if calls.len() > max => Some(format!("{} calls in one reply; at most {max}", calls.len())),
            (ToolChoice::Specific(name), _) => {
                calls.iter().find(|c| &c.tool != name).map(|c| format!("`{}` called; only `{name}` may be", c.tool))
            }
            _ => None,
        };
        if let Some(e) = shape_error {
            return Err(Failure::Validation(e, as_value()));
        }
        for call in &calls {
            if let Err(e) = self.check_call(call) {
                return Err(Failure::Validation(e, as_value()));
            }
        }
        Ok(decision)
    }

    /// A call's validation error (unknown tool, arguments failing its schema or validator), naming the tool.
    pub(super) fn check_call(&self, call: &ToolCall) -> std::result::Result<(), String> {
        self.executor.check(call).map_err(|outcome| {
            format!("{} (tool `{}`)", outcome.error_text().unwrap_or_else(|| outcome.observation()), call.tool)
        })
    }

    /// The decision as the conversation keeps it: the compact JSON (ReAct) or the reply (native), rebuilt
    /// from the calls when a repeated call was cut off.
    pub(super) fn kept_text(&self, reply: &str, decision: &Decision, cut: bool) -> Result<String> {
        Ok(match (self.config.format, cut) {
            (DecisionFormat::React, false) => serde_json::to_string(&decision_value(reply))?,
            (DecisionFormat::React, true) => {
                let mut v = decision_value(reply);
                v["calls"] = serde_json::to_value(decision.calls())?;
                serde_json::to_string(&v)?
            }
            (DecisionFormat::Native, false) => reply.trim().to_string(),
            (DecisionFormat::Native, true) => self.syntax.render(&decision.calls()),
        })
    }

    /// The assistant turn that keeps a decision in the conversation (`text`: as [`kept_text`]
    /// (Self::kept_text) wrote it): the text, except native calls whose syntax has control-token markers,
    /// which the template renders ([`CallSyntax::kept_turn`]).
    pub(super) fn kept_turn(&self, text: &str, decision: &Decision) -> ChatMessage {
        let calls = decision.calls();
        match self.config.format {
            DecisionFormat::Native if !calls.is_empty() => self.syntax.kept_turn(text, calls),
            _ => ChatMessage::assistant(text),
        }
    }
}

/// The decision JSON as the conversation keeps it (compact; free-form prose around it is dropped).
pub(super) fn decision_value(text: &str) -> Value {
    driver::extract_json(text).unwrap_or(Value::Null)
}

/// The most values of a parameter's `enum` that the native call score's prompt shows
/// ([`StepGrammars::native_branch`]): the live paths of a small tree (the everyday sets' 12 files and 5
/// folders, where the setting was chosen) are shown; a repository's hundreds would be prefilled again for
/// every request (a plain question from this repository's root took 64 s instead of 4), so a longer list
/// is left out of the prompt (the grammar keeps it).
const SHOWN_ENUM_VALUES: usize = 32;

/// `specs` as the native call score's prompt shows them: each property's `enum` of more than
/// [`SHOWN_ENUM_VALUES`] values left out.
fn shown_in_prompt(specs: &[ToolSpec]) -> Vec<ToolSpec> {
    let mut shown = specs.to_vec();
    for spec in &mut shown {
        let Some(properties) = spec.parameters.get_mut("properties").and_then(Value::as_object_mut) else { continue };
        for schema in properties.values_mut().filter_map(Value::as_object_mut) {
            if schema.get("enum").and_then(Value::as_array).is_some_and(|e| e.len() > SHOWN_ENUM_VALUES) {
                schema.remove("enum");
            }
        }
    }
    shown
}

/// The grammars a step chooses from.
pub(super) struct StepGrammars {
    /// The run's tool choice.
    pub(super) normal: StepGrammar,
    /// Answers only: after a repeated call is refused, an `auto` run must answer.
    pub(super) answer_only: StepGrammar,
    /// Calls only (under `auto`): the first step where a call is required, or the step after an error
    /// where the settings ask for a call.
    pub(super) call_only: Option<StepGrammar>,
    /// One more call after a decision's calls, when the settings propose more calls.
    pub(super) more_calls: Option<Grammar>,
    /// A native decision's grammar under `auto`, whose first token the model's call score is read at
    /// ([`AgentConfig::native_branch`]), and the tools its template renders (with their live parameters,
    /// as the grammars have them: the files that exist, where they are few: [`shown_in_prompt`]).
    pub(super) native_branch: Option<(Grammar, Value)>,
}

impl StepGrammars {
    pub(super) fn new(specs: &[ToolSpec], config: &AgentConfig, syntax: &CallSyntax) -> Result<Self> {
        Ok(Self {
            normal: StepGrammar::new(specs, &config.tool_choice, config, syntax)?,
            answer_only: StepGrammar::new(specs, &ToolChoice::None, config, syntax)?,
            call_only: (config.tool_choice == ToolChoice::Auto && !specs.is_empty())
                .then(|| StepGrammar::new(specs, &ToolChoice::Required, config, syntax))
                .transpose()?,
            more_calls: (config.propose_more_calls
                && config.format == DecisionFormat::Native
                && syntax.max_calls(config.decision.parallel_calls.unwrap_or(1)) > 1
                && !specs.is_empty()
                && config.tool_choice != ToolChoice::None)
                .then(|| {
                    native::native_extension_grammar(specs, &config.tool_choice, &config.decision, syntax)
                        .map(Grammar::Lark)
                })
                .transpose()?,
            native_branch: (config.native_branch
                && config.format == DecisionFormat::React
                && config.tool_choice == ToolChoice::Auto
                && !specs.is_empty())
            .then(|| {
                let grammar = native::native_grammar(specs, &ToolChoice::Auto, &config.decision, syntax)?;
                Ok::<_, Error>((Grammar::Lark(grammar), native::tools_value(&shown_in_prompt(specs))))
            })
            .transpose()?,
        })
    }

    pub(super) fn pick(&self, forced_call: bool, force_answer: bool) -> &StepGrammar {
        match (&self.call_only, forced_call, force_answer) {
            (_, _, true) => &self.answer_only,
            (Some(required), true, _) => required,
            _ => &self.normal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_native_score_prompt_shows_a_short_enum_and_leaves_a_long_one_out() {
        let paths = |n: usize| (0..n).map(|i| format!("f{i}.txt")).collect::<Vec<_>>();
        let spec = |n: usize| {
            let parameters = json!({"type": "object", "properties": {
                "path": {"type": "string", "enum": paths(n)},
                "unit": {"type": "string", "enum": ["c", "f"]},
            }});
            ToolSpec::new("read_file", "reads", parameters).unwrap()
        };
        let shown = shown_in_prompt(&[spec(12), spec(500)]);
        assert_eq!(shown[0].parameters, spec(12).parameters);
        assert!(shown[1].parameters["properties"]["path"].get("enum").is_none());
        assert_eq!(shown[1].parameters["properties"]["unit"]["enum"], json!(["c", "f"]));
    }
}
