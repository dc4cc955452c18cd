//! The answer in the model's own words: once a decision chose to answer (before any call, or after calls
//! that all succeeded), its reply as a plain chat turn, kept after calls only where it is grounded.

use super::checks::{copied_failure, echoes_request};
use super::{Decision, DecisionFormat, RunState};
use crate::agent::events::{CallRecord, DecisionStats};
use crate::agent::Agent;
use crate::error::Result;
use crate::text::chat::{ChatMessage, Role};
use crate::tools::CallOutcome;

/// The system turn of an answer in the model's own words where the caller gave none. A template's own
/// default can be a narrow role: Qwen 2.5 Coder's refuses "who painted the Mona Lisa?" under it, and
/// answers under this one.
const ANSWER_SYSTEM: &str = "You are a helpful assistant.";

impl Agent {
    /// The answer in the model's own words ([`AgentConfig::answer_in_own_words`](crate::agent::AgentConfig)):
    /// the model's reply to the conversation as a plain chat turn (after calls, with their results before
    /// the request); `None` where the decision's text stays the answer ([`Self::answers_in_own_words`] is
    /// false, or the reply fails: empty, a tool's error, the request written back, or after calls a
    /// number it was not given or a wrong equation). The reply's tokens and time join the step's `stats`.
    pub(super) fn own_words(&mut self, run: &mut RunState, stats: &mut DecisionStats) -> Result<Option<String>> {
        if !self.answers_in_own_words(run) {
            return Ok(None);
        }
        let messages = self.plain_turns(run);
        // After calls the reply is checked against their results before it is the answer: it is shown
        // once it passes, not as it comes (a reply that is then not used would have been shown).
        let checked = self.called(run);
        let sink = &mut self.answer_text;
        let mut on_text = |t: &str| {
            if !checked {
                sink.as_mut().map_or((), |f| f(t))
            }
        };
        let out = match self.driver.answer(&messages, self.config.answer_tokens, &mut on_text) {
            Ok(Some(out)) => out,
            Ok(None) => return Ok(None),
            Err(e) if crate::limits::interrupted() => return Err(e),
            // The decision's answer stands where the reply could not be had (a remote server that failed).
            Err(_) => return Ok(None),
        };
        stats.generated_tokens += out.stats.generated_tokens;
        stats.prompt_tokens += out.stats.prompt_tokens;
        stats.reused_tokens += out.stats.reused_tokens;
        stats.seconds += out.stats.seconds;
        run.stats.count(&out.stats);
        // A reply cut at the bound is kept up to its last full sentence: a long reply, shortened, answers
        // better than a one-line JSON answer decoded again.
        let text = match out.complete {
            true => out.text.trim(),
            false => whole_sentences(&out.text),
        };
        let own = Decision::FinalAnswer { thought: String::new(), answer: text.to_string() };
        if text.is_empty() || copied_failure(&own, &run.failures).is_some() || echoes_request(&own, &run.task) {
            return Ok(None);
        }
        // After calls, the reply is grounded in what they returned or it is not the answer: a number the
        // model was not given (a sum redone in its head, a value made up) or a wrong equation leaves the
        // decision's answer, written with the results in view.
        let given: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        let grounded = || numbers_given(text, &given) && crate::agent::arithmetic::slips(text).is_empty();
        if checked && !grounded() {
            return Ok(None);
        }
        // After a call made to correct a wrong sum, the reply gives what it returned, or the decision's
        // answer, written with that result in view, stays (a small model's reply restates the operands).
        if corrected_result(run).is_some_and(|result| !numbers_given(&result, &[text])) {
            return Ok(None);
        }
        if let (true, Some(show)) = (checked, self.answer_text.as_mut()) {
            show(text);
        }
        Ok(Some(text.to_string()))
    }

    /// Whether a call was made in this run or the conversation before it.
    fn called(&self, run: &RunState) -> bool {
        run.steps.iter().any(|s| !s.calls.is_empty()) || called_in(&run.request)
    }

    /// Whether an answer decided now would be replaced by the model's own reply: ReAct decisions, the
    /// setting on, and no call yet in the conversation, or (with `own_words_after_calls`) none of this
    /// run's calls failed.
    pub(super) fn answers_in_own_words(&self, run: &RunState) -> bool {
        let called = self.called(run);
        let failed = calls_made(run).any(|c| !c.outcome.is_ok());
        self.config.answer_in_own_words
            && self.config.format == DecisionFormat::React
            && (!called || (self.config.own_words_after_calls && !failed))
    }

    /// The request as a plain chat: the caller's system text (or a plain helpful-assistant one), then its
    /// other turns.
    pub(super) fn plain_turns(&self, run: &RunState) -> Vec<ChatMessage> {
        let given = self.config.system_prompt.iter().map(String::as_str);
        let given: Vec<&str> =
            given.chain(run.request.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str())).collect();
        let system = if given.is_empty() { ANSWER_SYSTEM.to_string() } else { given.join("\n") };
        let mut messages = vec![ChatMessage::system(system)];
        // What the conversation's tools returned, before the request they answer.
        let mut results = String::new();
        for m in run.request.iter().filter(|m| m.role != Role::System) {
            // An earlier answer of a conversation as the text the person was given; earlier calls are
            // not shown, their results join this run's.
            match (m.role, answer_of(&m.content), observation_of(m)) {
                (Role::Assistant, Some(answer), _) => messages.push(ChatMessage::assistant(answer)),
                (_, _, Some(seen)) => results.push_str(&format!("A tool returned:\n{seen}\n\n")),
                (Role::Assistant, None, _) if called_in(std::slice::from_ref(m)) => {}
                _ => messages.push(m.clone()),
            }
        }
        results.push_str(&call_results(run));
        if let (false, Some(last)) = (results.is_empty(), messages.last_mut().filter(|m| m.role == Role::User)) {
            last.content = format!("{results}\nUsing these results, answer briefly: {}", last.content);
        }
        messages
    }
}

/// Whether a call was made in `conversation`: a tool turn, an assistant turn with calls (native), or a
/// ReAct decision that calls.
pub(super) fn called_in(conversation: &[ChatMessage]) -> bool {
    conversation.iter().any(|m| {
        let react_call = || {
            serde_json::from_str::<serde_json::Value>(&m.content)
                .is_ok_and(|v| v.get("type").and_then(|t| t.as_str()).is_some_and(|t| t.starts_with("call_tool")))
        };
        m.role == Role::Tool || !m.tool_calls.is_empty() || (m.role == Role::Assistant && react_call())
    })
}

/// What a turn of the conversation says a tool returned: a tool turn, or a ReAct observation (without
/// its closing advice).
fn observation_of(m: &ChatMessage) -> Option<&str> {
    if m.role == Role::Tool {
        return Some(m.content.trim_end());
    }
    let seen = m.content.strip_prefix("Observation: ").filter(|_| m.role == Role::User)?;
    Some(seen.split("\nIf this answers the task").next().unwrap_or(seen).trim_end())
}

/// The run's calls that ran, without its refused repeats: a repeat ran nothing and adds nothing to the
/// result it repeats (a repeat of a failed call has that failure before it).
fn calls_made(run: &RunState) -> impl Iterator<Item = &CallRecord> {
    run.steps.iter().flat_map(|s| &s.calls).filter(|c| !matches!(c.outcome, CallOutcome::Repeated { .. }))
}

/// What the last step's call returned where it was made to correct a wrong sum
/// ([`Step::corrects_arithmetic`](crate::agent::Step)) and it succeeded with a number.
fn corrected_result(run: &RunState) -> Option<String> {
    let step = run.steps.last().filter(|s| s.corrects_arithmetic)?;
    match &step.calls.first()?.outcome {
        CallOutcome::Ok { output } if output.trim().parse::<f64>().is_ok() => Some(output.trim().to_string()),
        _ => None,
    }
}

/// The run's calls and what each returned (or its error), as the plain chat's context.
fn call_results(run: &RunState) -> String {
    let mut text = String::new();
    for record in calls_made(run) {
        let args = serde_json::to_string(&record.call.args).unwrap_or_default();
        let outcome = record.outcome.observation();
        text.push_str(&format!("{} {args} returned:\n{}\n\n", record.call.tool, outcome.trim_end()));
    }
    text
}

/// Whether every number `reply` writes is one of those in `given` (the texts the model answered from),
/// compared as numbers (`140` is `140.0`; `1,603` is `1603`). Not the grounding's `written_numbers`: that
/// reader skips digits inside words (an identifier is no quantity), where a reply's `Q3` or `B14` must
/// come from the results too.
fn numbers_given(reply: &str, given: &[&str]) -> bool {
    static NUMBER: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let number =
        NUMBER.get_or_init(|| regex::Regex::new(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?").expect("a valid regex"));
    let values = |text: &str| -> Vec<f64> {
        number.find_iter(text).filter_map(|m| m.as_str().replace(',', "").parse().ok()).collect()
    };
    // What the reply derives by a right equation from what it was given (`85 * 3 = 255`) is grounded too:
    // its operands are numbers of the reply, checked like the rest.
    let mut known: Vec<f64> = given.iter().flat_map(|t| values(t)).collect();
    known.extend(crate::agent::arithmetic::derived(reply));
    values(reply).iter().all(|v| known.contains(v))
}

/// `text` up to the end of its last full sentence or line (a full stop, question or exclamation mark
/// followed by white space, or a line break), outside an unclosed code block; empty where there is none.
fn whole_sentences(text: &str) -> &str {
    let mut text = text;
    // A code block the cut left open is dropped whole.
    if text.matches("```").count() % 2 == 1 {
        text = &text[..text.rfind("```").unwrap_or(0)];
    }
    let mut ends = text.char_indices().filter(|&(i, c)| {
        let next = text[i + c.len_utf8()..].chars().next();
        // `2.` opening a line is a list's number.
        let line = &text[text[..i].rfind('\n').map_or(0, |j| j + 1)..i];
        let numbered = c == '.' && line.trim().chars().all(|d| d.is_ascii_digit());
        c == '\n' || (matches!(c, '.' | '!' | '?') && next.is_some_and(char::is_whitespace) && !numbered)
    });
    match ends.next_back() {
        Some((i, c)) => text[..i + c.len_utf8()].trim(),
        None => "",
    }
}

/// The ReAct decision that keeps `answer` in the conversation.
pub(super) fn answer_text(answer: &str) -> String {
    serde_json::json!({"thought": "", "type": "final_answer", "answer": answer}).to_string()
}

/// The answer of a ReAct final-answer decision's text.
fn answer_of(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    (v.get("type")?.as_str()? == "final_answer").then(|| v.get("answer")?.as_str().map(str::to_string))?
}

#[cfg(test)]
mod tests {
    use super::{numbers_given, observation_of, whole_sentences};
    use crate::text::chat::{ChatMessage, Role};

    #[test]
    fn a_conversations_tool_results_are_read_from_tool_turns_and_react_observations() {
        let react = ChatMessage::user(
            "Observation: read_file {\"path\":\"a.txt\"} returned: hello\nIf this answers the task, give the final answer now.",
        );
        assert_eq!(observation_of(&react), Some("read_file {\"path\":\"a.txt\"} returned: hello"));
        assert_eq!(observation_of(&ChatMessage::new(Role::Tool, "42\n")), Some("42"));
        // A person's turn is not a result, even one that starts like an observation in another role.
        assert_eq!(observation_of(&ChatMessage::user("What did the file say?")), None);
        assert_eq!(observation_of(&ChatMessage::assistant("Observation: made up")), None);
    }

    #[test]
    fn a_reply_after_calls_writes_only_numbers_it_was_given() {
        let given = ["calculator {\"expression\":\"0.75 * 60\"} returned:\n45", "What is three quarters of 60?"];
        assert!(numbers_given("Three quarters of sixty is 45.", &given));
        assert!(numbers_given("0.75 * 60 = 45.0", &given));
        assert!(numbers_given("No numbers at all.", &given));
        // A sum redone in the model's head.
        assert!(!numbers_given("60 / 4 = 15, so the answer is 15.", &given));
        // A result the reply derives by a right equation from numbers it was given.
        let given = ["read_file {\"path\":\"travel.md\"} returned:\nhotel: 85 EUR a night, 3 nights"];
        assert!(numbers_given("85 * 3 = 255, so the hotel costs 255 EUR.", &given));
        // Not by a wrong one, nor from an operand it was not given.
        assert!(!numbers_given("85 * 3 = 245, so the hotel costs 245 EUR.", &given));
        assert!(!numbers_given("85 * 4 = 340, so the hotel costs 340 EUR.", &given));
        assert!(numbers_given("That is 1,603 in all.", &["returned: 1603"]));
        assert!(!numbers_given("That is 1,603 in all.", &["returned: 1 and 603"]));
    }

    #[test]
    fn a_cut_reply_keeps_its_whole_sentences() {
        assert_eq!(whole_sentences("Water boils at 100 C. At altitude it boils at less th"), "Water boils at 100 C.");
        assert_eq!(whole_sentences("Tips:\n1. Sleep well\n2. Take brea"), "Tips:\n1. Sleep well");
        // A number's point is not a sentence's end; a reply with no end keeps nothing.
        assert_eq!(whole_sentences("Pi is 3.14159 and e is 2.71"), "");
        // An open code block is dropped with what follows it.
        assert_eq!(whole_sentences("Like this.\n```python\nprint(1)\n"), "Like this.");
        assert_eq!(whole_sentences("Done! ```a``` then. And mo"), "Done! ```a``` then.");
    }
}
