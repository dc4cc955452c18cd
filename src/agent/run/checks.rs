//! What a step's attempts check beyond a decision's validity, and why one is sent back: wrong arithmetic,
//! an answer that repeats a failed call's error, an answer given while the request still needs a tool.

use serde_json::Value;

use crate::agent::{arithmetic, Decision};
use crate::text::chat::{ChatMessage, Role};
use crate::tools::ERROR_MARK;

/// Why an attempt is sent back.
pub(super) enum Failure {
    Extraction(String),
    Validation(String, Value),
    /// A valid decision whose answer or thought writes wrong arithmetic (reported as a validation failure).
    Arithmetic(String, Value),
    /// An answer that must be a call instead: it repeats a failed call's error, or it comes while the
    /// request still needs a tool (reported as a validation failure; retried as a call, with no words
    /// added).
    CallInstead(String, Value),
}

/// A decision whose answer or thought writes wrong arithmetic ([`arithmetic::slips`]), as a failure that
/// gives the right results. Equations the conversation's user turns write (a user asking whether
/// `7 × 8 = 54`) and those already sent back this run (`flagged`, where the new ones are added) are not
/// slips.
pub(super) fn arithmetic_slips(
    decision: &Decision,
    messages: &[ChatMessage],
    flagged: &mut Vec<String>,
) -> Option<Failure> {
    let said: Vec<String> = messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| arithmetic::slips(&m.content))
        .map(|s| s.evaluated)
        .collect();
    let fresh = |text: &str| -> Vec<arithmetic::Slip> {
        let known = |s: &arithmetic::Slip| flagged.contains(&s.evaluated) || said.contains(&s.evaluated);
        arithmetic::slips(text).into_iter().filter(|s| !known(s)).collect()
    };
    let (what, slips) = match decision {
        Decision::FinalAnswer { answer, .. } => match fresh(answer) {
            s if s.is_empty() => ("thought", fresh(decision.thought())),
            s => ("answer", s),
        },
        _ => ("thought", fresh(decision.thought())),
    };
    if slips.is_empty() {
        return None;
    }
    flagged.extend(slips.iter().map(|s| s.evaluated.clone()));
    let found: Vec<String> = slips.iter().map(ToString::to_string).collect();
    let error = format!("the {what}'s arithmetic is wrong: {}", found.join("; "));
    Some(Failure::Arithmetic(error, serde_json::to_value(decision).unwrap_or(Value::Null)))
}

/// The failed call (tool, error) whose error text an answer repeats: it contains the first 40 characters
/// of the error, or of the error's message after any of its `: ` prefixes (`exited with exit status: 1:
/// no weather station …`), where those are 12 or more; or it is 12 characters or more found in the
/// error; or it writes every word of such a message of 5 to 12 words in order within a stretch one word
/// longer ("No weather station found for 'mom'"). Compared as words: without case, punctuation or quotes
/// (a program quotes `"parent's city"` where the answer writes `'parent's city'`). An answer that opens
/// as the run's observations open a failure (`Error: `) writes the last failure in other words ("Error:
/// The ticker 'Tesla' is not recognized" after `unknown ticker`).
pub(super) fn copied_failure<'f>(
    decision: &Decision,
    failures: &'f [(String, String)],
) -> Option<&'f (String, String)> {
    let Decision::FinalAnswer { answer, .. } = decision else { return None };
    if answer.trim_start().starts_with(ERROR_MARK) {
        return failures.last();
    }
    let words = |s: &str| -> Vec<String> {
        let plain: String = s.chars().map(|c| if c.is_alphanumeric() { c } else { ' ' }).collect();
        plain.to_lowercase().split_whitespace().map(str::to_string).collect()
    };
    let answer_words = words(answer);
    let answer = answer_words.join(" ");
    failures.iter().rev().find(|(_, error)| {
        let tails = std::iter::once(0).chain(error.match_indices(": ").map(|(i, _)| i + 2));
        let messages: Vec<Vec<String>> = tails.map(|i| words(&error[i..])).collect();
        let whole = messages[0].join(" ");
        let copies_head = |m: &Vec<String>| {
            let head: String = m.join(" ").chars().take(40).collect();
            head.chars().count() >= 12 && answer.contains(&head)
        };
        // Every word of the message, in order, within a stretch of the answer one word longer.
        let rewords = |m: &Vec<String>| {
            (5..=12).contains(&m.len())
                && (0..answer_words.len()).any(|i| {
                    let stretch = &answer_words[i..answer_words.len().min(i + m.len() + 1)];
                    common_words_in_order(stretch, m) == m.len()
                })
        };
        messages.iter().any(|m| copies_head(m) || rewords(m))
            || (answer.chars().count() >= 12 && whole.contains(&answer))
    })
}

/// The length of the longest sequence of words found in order in both `a` and `b`.
fn common_words_in_order(a: &[String], b: &[String]) -> usize {
    let mut row = vec![0usize; b.len() + 1];
    for x in a {
        let mut diagonal = 0;
        for (j, y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if x == y { diagonal + 1 } else { row[j + 1].max(row[j]) };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Whether an answer only writes the request back (its words, case and punctuation aside): a small
/// model with nothing to answer from (a call that failed, results that do not say) copies the question.
pub(super) fn echoes_request(decision: &Decision, task: &str) -> bool {
    let Decision::FinalAnswer { answer, .. } = decision else { return false };
    let words = |s: &str| {
        let plain: String = s.chars().map(|c| if c.is_alphanumeric() { c } else { ' ' }).collect();
        plain.to_lowercase().split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let answer = words(answer);
    !answer.is_empty() && answer == words(task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Decision {
        Decision::FinalAnswer { thought: String::new(), answer: text.into() }
    }

    #[test]
    fn an_answer_that_repeats_a_tools_error_is_found_with_or_without_its_prefixes() {
        let failures = vec![(
            "get_weather".to_string(),
            "exited with exit status: 1: no weather station for 'Canada'".to_string(),
        )];
        let copied = |a: &str| copied_failure(&answer(a), &failures).map(|(tool, _)| tool.as_str());
        assert_eq!(copied("Error: exited with exit status: 1: no weather station for 'Canada'"), Some("get_weather"));
        // The message without the program's prefix, reworded around.
        assert_eq!(copied("Error: No weather station for 'Canada'."), Some("get_weather"));
        // A part of the error that is the whole answer.
        assert_eq!(copied("no weather station"), Some("get_weather"));
        // Not the error: an answer about the same thing in other words, or too short to tell.
        assert_eq!(copied("It is -5 °C in Ottawa."), None);
        assert_eq!(copied("Canada"), None);
        assert_eq!(copied("There is no station in Canada."), None);
        // Reworded by a word, or quoted otherwise than the program quoted it.
        assert_eq!(copied("Error: No weather station found for 'Canada'"), Some("get_weather"));
        let failures = vec![("get_weather".to_string(), "no weather station for \"parent's city\"".to_string())];
        let copied = |a: &str| copied_failure(&answer(a), &failures).map(|(tool, _)| tool.as_str());
        assert_eq!(copied("Error: no weather station for 'parent's city'"), Some("get_weather"));
        // Not a rewording: the message's words far apart, one of them left out, or a short listing.
        let failures = vec![
            ("mcp".to_string(), "call failed: the server is not running".to_string()),
            ("read_file".to_string(), "`notes` is a directory; its entries: a.txt, b.txt".to_string()),
        ];
        let copied = |a: &str| copied_failure(&answer(a), &failures).map(|(tool, _)| tool.as_str());
        assert_eq!(copied("The server is running."), None);
        assert_eq!(copied("notes has a.txt and b.txt"), None);
        assert_eq!(copied("The server, as far as I know, is not running at all"), None);
        assert_eq!(copied("Sorry: the server is not running now."), Some("mcp"));
        // Written as an observation writes a failure, in words of its own: the last failure.
        assert_eq!(copied("Error: The server returned an error. Please try again later."), Some("read_file"));
        assert_eq!(copied("The error was mine: the server runs."), None);
        assert_eq!(copied_failure(&answer("Error: none"), &[]), None);
    }

    #[test]
    fn an_answer_that_writes_the_request_back_is_found() {
        let task = "weather check: tokyo and ottawa pls";
        assert!(echoes_request(&answer("Weather check - Tokyo and Ottawa, pls."), task));
        assert!(!echoes_request(&answer("Tokyo: light rain, 18 C"), task));
        // A part of the request is an answer ("Which is bigger, 3 or 5?" "5").
        assert!(!echoes_request(&answer("5"), "Which is bigger, 3 or 5?"));
        assert!(!echoes_request(&answer(""), ""));
        let call = Decision::CallTool { thought: String::new(), tool: "t".into(), args: serde_json::json!({}) };
        assert!(!echoes_request(&call, task));
    }
}
