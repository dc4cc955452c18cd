//! What a run's requests need from live state: the grammars with the tools' live parameters (paths that
//! exist), the needs the tools read in the request ([`Tool::needed_for`](crate::tools::Tool::needed_for))
//! and the grammars of the calls that meet them, and whether the first decision must call.

use super::{RunState, StepGrammar, StepGrammars};
use crate::agent::decision::ToolChoice;
use crate::agent::events::AgentEvent;
use crate::agent::{Agent, FirstCall};
use crate::error::Result;
use crate::tools::{Need, ToolCall, ToolSpec};

impl Agent {
    /// The run's grammars, from the grammar specs with each tool's [live
    /// parameters](crate::tools::Tool::live_parameters) (paths that exist), read at the start of a run; from
    /// the specs as built where no tool narrows its parameters or the narrowed grammar does not compile.
    pub(super) fn step_grammars(&self) -> Result<StepGrammars> {
        let mut specs = self.grammar_specs.clone();
        let mut narrowed = false;
        for spec in &mut specs {
            if let Some(p) = self.executor.tools().get(&spec.name).and_then(|t| t.live_parameters()) {
                spec.parameters = p;
                narrowed = true;
            }
        }
        if narrowed {
            let live = StepGrammars::new(&specs, &self.config, &self.syntax);
            if let Ok(g) = live.and_then(|g| self.driver.check_grammar(&g.normal.grammar).map(|()| g)) {
                return Ok(g);
            }
        }
        StepGrammars::new(&self.grammar_specs, &self.config, &self.syntax)
    }

    /// The first reason a tool gives, after the run's successful calls, why the request still needs it
    /// ([`Tool::needed_for`](crate::tools::Tool::needed_for)), that was not raised before.
    pub(super) fn still_needed(&self, run: &RunState) -> Option<Need> {
        if run.steps.is_empty() || self.config.first_call == FirstCall::Never {
            return None;
        }
        let outputs: Vec<(&ToolCall, String)> =
            run.history.iter().filter(|(_, o)| o.is_ok()).map(|(c, o)| (c, o.observation())).collect();
        let done: Vec<crate::tools::Done> =
            outputs.iter().map(|(call, output)| crate::tools::Done { call, output }).collect();
        self.needs(&run.task, &done).into_iter().find(|n| !run.pending_raised.contains(&n.reason))
    }

    /// What the tools say `task` still needs after `done`, in the order the request names them.
    fn needs(&self, task: &str, done: &[crate::tools::Done]) -> Vec<Need> {
        let tools = self.executor.tools();
        let mut needs: Vec<Need> = Vec::new();
        for need in tools.names().into_iter().filter_map(|name| tools.get(name)?.needed_for(task, done)) {
            // One need that several tools can meet (a folder: listed or searched) offers all their calls.
            match needs.iter_mut().find(|n| n.at == need.at && n.reason == need.reason) {
                Some(same) if !same.calls.is_empty() && !need.calls.is_empty() => same.calls.extend(need.calls),
                Some(_) => {}
                None => needs.push(need),
            }
        }
        needs.sort_by_key(|n| n.at);
        needs
    }

    /// The grammar of the calls that meet `need` (calls only), where it names them and they compile.
    pub(super) fn need_grammar(&self, need: &Need) -> Option<StepGrammar> {
        if need.calls.is_empty() {
            return None;
        }
        self.checked_grammar(&need.calls, &ToolChoice::Required)
    }

    /// The grammar of the calls a tool says `expression` needs ([`Tool::needed_for`](crate::tools::Tool::needed_for)
    /// with nothing done: the calculator for `12 + 7 + 30 + 41`), the first such need's, each call whose
    /// one required value is a string given `expression` as its only value: left free, a small model
    /// copies the unit its answer wrote after a number into the call (`8080 + 42000 EUR`), which the
    /// calculator refuses.
    pub(super) fn grammar_computing(&self, expression: &str) -> Option<StepGrammar> {
        let mut need = self.needs(expression, &[]).into_iter().find(|n| !n.calls.is_empty())?;
        for spec in &mut need.calls {
            let name = match spec.parameters.get("required").and_then(|r| r.as_array()).map(Vec::as_slice) {
                Some([serde_json::Value::String(name)]) => name.clone(),
                _ => continue,
            };
            let pointer = format!("/properties/{name}");
            let Some(p) = spec.parameters.pointer_mut(&pointer).and_then(|p| p.as_object_mut()) else { continue };
            if p.get("type").and_then(|t| t.as_str()) == Some("string") {
                p.insert("enum".into(), serde_json::json!([expression]));
            }
        }
        self.need_grammar(&need)
    }

    /// A step's grammar over `specs`, where it builds and the driver compiles it.
    fn checked_grammar(&self, specs: &[ToolSpec], choice: &ToolChoice) -> Option<StepGrammar> {
        let g = StepGrammar::new(specs, choice, &self.config, &self.syntax).ok()?;
        self.driver.check_grammar(&g.grammar).ok()?;
        Some(g)
    }

    /// The grammars of the step after the last step's failed calls whose errors named no other tool
    /// ([`AgentConfig::retry_failed_tool`](crate::agent::AgentConfig::retry_failed_tool), under `auto`;
    /// taken from `run` whether `wanted` or not): the step's (calls of those tools, with their live
    /// parameters, or an answer; `None` where the step must call, `forced_call`) and its call-only one.
    pub(super) fn retry_grammars(
        &self,
        run: &mut RunState,
        forced_call: bool,
        wanted: bool,
    ) -> (Option<StepGrammar>, Option<StepGrammar>) {
        let failed = std::mem::take(&mut run.failed_tools);
        let on = self.config.retry_failed_tool && self.config.tool_choice == ToolChoice::Auto;
        if !wanted || !on || failed.is_empty() || run.force_answer {
            return (None, None);
        }
        let specs: Vec<ToolSpec> = self
            .grammar_specs
            .iter()
            .filter(|s| failed.contains(&s.name))
            .map(|s| {
                let live = self.executor.tools().get(&s.name).and_then(|t| t.live_parameters());
                ToolSpec { parameters: live.unwrap_or_else(|| s.parameters.clone()), ..s.clone() }
            })
            .collect();
        if specs.is_empty() {
            return (None, None);
        }
        let step = (!forced_call).then(|| self.checked_grammar(&specs, &ToolChoice::Auto)).flatten();
        (step, self.checked_grammar(&specs, &ToolChoice::Required))
    }

    /// Whether the first decision must call ([`AgentConfig::first_call`]), and what the request needs
    /// where it says; a call the request itself asks for is announced as an event.
    pub(super) fn first_call_required(&mut self, task: &str) -> (bool, Option<Need>) {
        if self.config.tool_choice != ToolChoice::Auto || self.executor.tools().is_empty() {
            return (false, None);
        }
        match self.config.first_call {
            FirstCall::Never => (false, None),
            FirstCall::Always => (true, None),
            FirstCall::WhenNeeded => {
                let Some(need) = self.needs(task, &[]).into_iter().next() else { return (false, None) };
                let tool = need.calls.first().map(|c| c.name.clone()).unwrap_or_default();
                self.emit(AgentEvent::CallRequired { step: 1, tool, reason: need.reason.clone() });
                (true, Some(need))
            }
        }
    }
}
