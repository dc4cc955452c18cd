//! Whether a call's argument values come from the conversation: the abstention signal of the first
//! decision.
//!
//! A small model asked something no listed tool can do still calls the nearest tool, and fills its
//! arguments with values it made up ("Do you know the muffin man?" → `requests_get` on an invented URL).
//! When the request fits a tool, the values are mostly words the user wrote. [`Evidence::grounding`] measures that
//! share; under `auto`, a first decision whose first call scores below [`AgentConfig::abstain_below`]
//! becomes an answer (see `Agent::run_conversation`). On BFCL's development split this separates
//! irrelevant from relevant requests better than the model's own call/answer margin (AUC 0.86 against
//! 0.76 for qwen2.5-coder-0.5b).
//!
//! [`AgentConfig::abstain_below`]: super::AgentConfig::abstain_below

use std::collections::HashSet;

use serde_json::Value;

use crate::text::chat::{ChatMessage, Role};
use crate::tools::ToolCall;

mod provenance;
mod reading;

pub use provenance::chosen_by_tool_output;

use reading::{
    leaf_text, leaf_words, leaves, name_words, words, written_numbers, CURRENCIES, FUNCTION_WORDS, GENERIC_ACTIONS,
    MONTHS, NUMBER_WORDS,
};

/// What the user and tool turns of a conversation say: their text (lower case), its words, and the numbers
/// it writes. Built once per step ([`Evidence::of`]) and asked about each call of the step's decision.
pub struct Evidence {
    text: String,
    known: HashSet<String>,
    numbers: Vec<f64>,
    /// Numbers the turns name in words ("zero", "twice").
    named_numbers: Vec<f64>,
    /// Months the turns name, as numbers ("March" is 3).
    months: Vec<f64>,
    /// The initials of each run of two or three capitalised words ("New York" → "ny").
    initials: HashSet<String>,
    /// The ISO codes of the currencies the turns name ("yen" → "jpy"; "$" → "usd").
    currencies: HashSet<&'static str>,
}

impl Evidence {
    /// The evidence of `conversation`'s user and tool turns.
    pub fn of(conversation: &[ChatMessage]) -> Self {
        let original: String = conversation
            .iter()
            .filter(|m| matches!(m.role, Role::User | Role::Tool))
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let text = original.to_lowercase();
        let known: HashSet<String> = words(&text).map(str::to_string).collect();
        let numbers = written_numbers(&text);
        let named = |table: &[(&str, f64)]| table.iter().filter(|(w, _)| known.contains(*w)).map(|&(_, n)| n).collect();
        let (named_numbers, months) = (named(&NUMBER_WORDS), named(&MONTHS));
        let capitalised: Vec<&str> = words(&original).collect();
        let mut initials = HashSet::new();
        for n in [2, 3] {
            for run in capitalised.windows(n) {
                if run.iter().all(|w| w.starts_with(|c: char| c.is_uppercase())) {
                    initials.insert(run.iter().filter_map(|w| w.chars().next()).flat_map(char::to_lowercase).collect());
                }
            }
        }
        let mut currencies: HashSet<&str> = CURRENCIES
            .iter()
            .filter(|(_, names)| names.iter().any(|words| words.iter().all(|w| known.contains(*w))))
            .map(|&(code, _)| code)
            .collect();
        if text.contains('$') {
            currencies.insert("usd");
        }
        Self { text, known, numbers, named_numbers, months, initials, currencies }
    }

    /// Whether the turns name the tool: one of their words of four letters or more is a part of the tool's
    /// name or of one of its parameters' names (split at `_`, `-`, `.` and case changes), or a longer or
    /// shorter form of one ("files" for `file`, "prices" for `price`). A call whose values the user did not
    /// write but whose tool the user named ("the weather in the capital of Japan": `get_weather`) derives
    /// its values; one that names nothing the user said is a guess at a tool that does not fit.
    pub fn names_tool(&self, name: &str, parameters: &Value) -> bool {
        let params = parameters.get("properties").and_then(Value::as_object);
        let parts: Vec<String> = std::iter::once(name)
            .chain(params.into_iter().flat_map(|p| p.keys().map(String::as_str)))
            .flat_map(name_words)
            .filter(|p| p.chars().count() >= 4)
            .collect();
        let related = |w: &str, p: &str| w == p || (w.starts_with(p) || p.starts_with(w)) && w.len().min(p.len()) >= 4;
        self.known.iter().filter(|w| w.chars().count() >= 4).any(|w| parts.iter().any(|p| related(w, p)))
    }

    /// The share of `call`'s argument values found in the user and tool turns, averaged over the values:
    /// a number scores 1 when it equals one written there ("$1,000,000", "5%" as 5 or 0.05) or named in
    /// words ("zero", "twice"); other values the fraction of their words (alphanumeric runs) that the turns
    /// give, leniently: as written, as a longer or shorter form ("strengths" for "strength"), a run of
    /// digits as a number written or named there ("2022-03-07" from "March 7, 2022"), a word in capitals
    /// as the initials or the start of words there ("NY" from "New York", "EUR" from "euros") or as the code
    /// of a currency named there ("JPY" from "Japanese yen").
    /// Booleans, nulls and empty strings carry no evidence and are skipped; `None` when nothing is left (a
    /// call without arguments is as grounded as its request).
    pub fn grounding(&self, call: &ToolCall) -> Option<f32> {
        let scores: Vec<f32> = leaves(&call.args).iter().filter_map(|leaf| self.leaf_grounding(leaf)).collect();
        (!scores.is_empty()).then(|| scores.iter().sum::<f32>() / scores.len() as f32)
    }

    /// [`Self::grounding`] of one scalar value: 1 for a number written or named in the turns, else the share
    /// of its words the turns give; `None` for a value without words.
    fn leaf_grounding(&self, leaf: &Value) -> Option<f32> {
        if let Some(x) = leaf.as_f64() {
            if self.is_written_number(leaf) || self.names_number(x) {
                return Some(1.0);
            }
        }
        let s = leaf_text(leaf);
        let ws: Vec<&str> = words(&s).collect();
        let found = ws.iter().filter(|w| self.gives(w)).count();
        (!ws.is_empty()).then(|| found as f32 / ws.len() as f32)
    }

    /// [`Self::grounding`] of what `call` keeps once its optional arguments the turns do not state are left
    /// out ([`Self::drop_unstated_options`] under `schema`): those are dropped before the call runs, so
    /// they say nothing about whether it fits. A call that loses every value it had scores 0.
    pub fn grounding_of_stated(&self, call: &ToolCall, schema: &Value) -> Option<f32> {
        let mut kept = call.clone();
        self.drop_unstated_options(&mut kept, schema);
        match self.grounding(&kept) {
            None if !leaves(&call.args).is_empty() => Some(0.0),
            g => g,
        }
    }

    /// Whether the turns give a word of a value (as written; see [`Self::grounding`]).
    fn gives(&self, word: &str) -> bool {
        let w = word.to_lowercase();
        // An identifier written in mixed case ("pointB", "userId") is a name, not a form of a word: only
        // as written.
        let identifier = word.chars().skip_while(|c| !c.is_lowercase()).any(char::is_uppercase);
        if self.found(&w) || (!identifier && self.has_form_of(&w)) {
            return true;
        }
        if w.bytes().all(|b| b.is_ascii_digit()) {
            return w.parse::<f64>().is_ok_and(|x| self.numbers.contains(&x) || self.names_number(x));
        }
        let capitals = (2..=4).contains(&word.len()) && word.chars().all(|c| c.is_ascii_uppercase());
        capitals
            && (self.initials.contains(&w)
                || self.currencies.contains(w.as_str())
                || self
                    .known
                    .iter()
                    .any(|k| k.len() > w.len() && k.starts_with(&w) && k.chars().all(char::is_alphabetic)))
    }

    /// Whether the turns name `x` in words or as a month.
    fn names_number(&self, x: f64) -> bool {
        self.named_numbers.contains(&x) || self.months.contains(&x)
    }

    /// Whether a word of four letters or more occurs in a longer or shorter form ("chronological" for
    /// "chronologically").
    fn has_form_of(&self, w: &str) -> bool {
        let alpha = |w: &str| w.chars().all(char::is_alphabetic);
        alpha(w) && self.known.iter().any(|k| alpha(k) && forms_of_one_word(k, w))
    }

    /// Whether `call`, proposed after `earlier` calls of the same decision, is a new item the request asked
    /// for. It is judged as it will run: with `schema` (the tool's parameters, given when unstated optional
    /// arguments are dropped before calls run), its optional arguments the turns do not state left out (see
    /// [`Self::drop_unstated_options`]). It must not repeat an earlier
    /// call; it brings a value no earlier call used, or calls a tool no earlier call did whose name has a
    /// word of the request that no earlier tool's name has ("temperature and humidity forecast for Boston":
    /// `forecast_humidity` after `forecast_temperature`, with the same arguments); every new value is given by
    /// the turns, leniently as for [`Self::grounding`]; and against each earlier call of the same tool it
    /// changes an argument both give (not a refinement that only adds arguments), without replacing a value
    /// that was itself made up, less than half of its words occurring in the turns (a correction, not a new
    /// item; "San Francisco, CA" is not made up).
    ///
    /// Small models stop after the first of several requested calls ("weather in New York, Los Angeles, London
    /// and Tokyo" → one call); proposing one more and keeping it only when it passes this test recovers the
    /// others without adding calls the request does not support.
    pub fn is_new_requested_item(&self, call: &ToolCall, earlier: &[ToolCall], schema: Option<&Value>) -> bool {
        if earlier.iter().any(|e| e == call) {
            return false;
        }
        let mut call = call.clone();
        if let Some(schema) = schema {
            self.drop_unstated_options(&mut call, schema);
        }
        let used: HashSet<String> = earlier.iter().flat_map(|e| leaves(&e.args)).flat_map(|l| leaf_words(&l)).collect();
        let new: Vec<Value> = leaves(&call.args)
            .into_iter()
            .filter(|l| {
                let ws = leaf_words(l);
                !ws.is_empty() && !ws.iter().all(|w| used.contains(w))
            })
            .collect();
        if !new.iter().all(|l| self.leaf_grounding(l) == Some(1.0)) {
            return false;
        }
        if new.is_empty() && !self.names_new_tool(&call.tool, earlier) {
            return false;
        }
        earlier.iter().filter(|e| e.tool == call.tool).all(|e| {
            let (Some(before), Some(now)) = (e.args.as_object(), call.args.as_object()) else { return false };
            let changed: Vec<&Value> =
                before.iter().filter(|(k, v)| now.get(*k).is_some_and(|n| n != *v)).map(|(_, v)| v).collect();
            !changed.is_empty() && changed.iter().all(|v| leaves(v).iter().all(|l| self.mostly_grounds(l)))
        })
    }

    /// Whether `tool` is none of the `earlier` calls' tools and its name has a word of four letters or more,
    /// other than a generic action ("get", "search", "calculate"), that the turns give (as written or in
    /// another form: "prep" for "prepare") and that no earlier tool's name has in any form.
    fn names_new_tool(&self, tool: &str, earlier: &[ToolCall]) -> bool {
        if earlier.iter().any(|e| e.tool == tool) {
            return false;
        }
        let before: Vec<String> = earlier.iter().flat_map(|e| name_words(&e.tool)).collect();
        name_words(tool).iter().any(|w| {
            w.len() >= 4
                && !GENERIC_ACTIONS.contains(&w.as_str())
                && !before.iter().any(|b| b == w || forms_of_one_word(b, w))
                && (self.found(w) || self.has_form_of(w))
        })
    }

    /// Leaves out of `call` its optional arguments (those `schema` does not list as `required`) whose values
    /// the user and tool turns do not state, and says whether it left any out.
    ///
    /// A value is stated, leniently, when each of its scalars has a word that occurs in the turns (also as a
    /// longer or shorter form of a word: "chronological" for "chronologically"; a currency's code for its
    /// name: "JPY" for "yen"), other than a function word
    /// ("the" does not state "The Great Gatsby"), or is a number written there (with separators, as a
    /// percentage, or in words: "three", "twice"). A boolean carries no evidence of its own: it is kept when
    /// it is the parameter's default or the turns name the parameter (a word of its name, or one sharing its
    /// first four letters: "details" names `detailed`); nulls and empty strings are kept. A small model either
    /// leaves out optional arguments the request does state ("vegan", "5 players", "settled") or, left to add
    /// them, fills others with made-up values (`"z": 0`, `"season": "2019-2020"`); letting it write them and
    /// keeping only the stated ones gets the first without the second.
    pub fn drop_unstated_options(&self, call: &mut ToolCall, schema: &Value) -> bool {
        let Some(args) = call.args.as_object_mut() else { return false };
        let required: HashSet<&str> =
            schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let before = args.len();
        args.retain(|name, value| {
            required.contains(name.as_str())
                || match value {
                    Value::Bool(_) => {
                        let default = schema.get("properties").and_then(|p| p.get(name)).and_then(|p| p.get("default"));
                        default == Some(value) || self.names(name)
                    }
                    _ => leaves(value).iter().all(|l| self.states(l)),
                }
        });
        args.len() < before
    }

    /// Leaves out of a decision's `calls` each one after the first that brings a value the user and tool turns
    /// do not state (leniently, as for [`drop_unstated_options`](Self::drop_unstated_options); a value an earlier kept call has is not new),
    /// or that repeats an earlier kept call of the same tool but for booleans; says whether it left any out.
    ///
    /// Pushed to make one more call (the more-calls bias), a small model adds calls the request does not ask
    /// for: a fourth forecast for a city with a made-up number of days, the same recipe search again with
    /// `isHomemade` flipped.
    pub fn drop_unstated_calls(&self, calls: &mut Vec<ToolCall>) -> bool {
        let before = calls.len();
        let mut kept: Vec<ToolCall> = Vec::with_capacity(before);
        for call in calls.drain(..) {
            if !kept.is_empty() {
                let earlier: Vec<Value> = kept.iter().flat_map(|c| leaves(&c.args)).collect();
                let made_up =
                    leaves(&call.args).iter().any(|l| !earlier.iter().any(|e| same_leaf(e, l)) && !self.states(l));
                let repeat = kept
                    .iter()
                    .any(|k| k.tool == call.tool && without_booleans(&k.args) == without_booleans(&call.args));
                if made_up || repeat {
                    continue;
                }
            }
            kept.push(call);
        }
        *calls = kept;
        calls.len() < before
    }

    /// How many of a leaf value's words occur in the text, and of how many. Scripts without spaces
    /// between words (Chinese, Japanese) make one long "word" of a sentence: their words count when they
    /// occur anywhere in the text.
    fn words_found(&self, leaf: &Value) -> (usize, usize) {
        let ws = leaf_words(leaf);
        (ws.iter().filter(|w| self.found(w)).count(), ws.len())
    }

    /// Whether at least half of a leaf value's words occur in the text (a number: whether it is written
    /// there).
    fn mostly_grounds(&self, leaf: &Value) -> bool {
        let (found, all) = self.words_found(leaf);
        2 * found >= all && found > 0 || self.is_written_number(leaf)
    }

    /// Whether a leaf is stated, leniently (see [`drop_unstated_options`]).
    fn states(&self, leaf: &Value) -> bool {
        if let Some(x) = leaf.as_f64() {
            return self.named_numbers.contains(&x) || self.is_written_number(leaf) || self.words_found(leaf).0 > 0;
        }
        let words = leaf_words(leaf);
        let content: Vec<&String> = words.iter().filter(|w| !FUNCTION_WORDS.contains(&w.as_str())).collect();
        // A value made only of function words ("to be") is judged by them.
        let judged = if content.is_empty() { words.iter().collect() } else { content };
        judged.iter().any(|w| self.found(w) || self.has_form_of(w) || self.currencies.contains(w.as_str()))
    }

    /// Whether a word occurs in the text (see [`Self::words_found`]).
    fn found(&self, w: &str) -> bool {
        self.known.contains(w) || (!w.is_ascii() && self.text.contains(w))
    }

    /// Whether the text names a parameter: a word of its name (`include_player_stats`: include, player,
    /// stats) occurs there, or one of at least four letters shares its first four with a word there.
    fn names(&self, parameter: &str) -> bool {
        let lower = parameter.to_lowercase();
        let named = words(&lower).any(|w| {
            self.found(w)
                || (w.len() >= 4
                    && w.is_char_boundary(4)
                    && self.known.iter().any(|k| k.len() >= 4 && k.is_char_boundary(4) && k[..4] == w[..4]))
        });
        named
    }

    /// Whether a leaf is a number that equals one written in the text.
    fn is_written_number(&self, leaf: &Value) -> bool {
        leaf.as_f64().is_some_and(|x| self.numbers.iter().any(|&n| (x - n).abs() <= 1e-9 * n.abs().max(1.0)))
    }
}

/// Whether two words of four letters or more are forms of one word, one the start of the other
/// ("chronological", "chronologically").
fn forms_of_one_word(a: &str, b: &str) -> bool {
    a.len() >= 4 && b.len() >= 4 && (a.starts_with(b) || b.starts_with(a))
}

/// Whether two scalars are the same value (numbers by value: 5000 and 5000.0).
fn same_leaf(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// An object of arguments without its booleans (other values as they are).
fn without_booleans(args: &Value) -> Value {
    match args {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(_, v)| !v.is_boolean()).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(args: Value) -> ToolCall {
        ToolCall { tool: "t".into(), args }
    }

    #[test]
    fn values_from_the_request_score_high_and_invented_ones_low() {
        let conv = [
            ChatMessage::system("You are in Paris."),
            ChatMessage::user("Find rock and jazz concerts in San Francisco on 2024-05-01, 3 tickets."),
        ];
        let g = |args| Evidence::of(&conv).grounding(&call(args));
        assert_eq!(g(json!({"city": "San Francisco", "genre": "Rock", "date": "2024-05-01", "n": 3})), Some(1.0));
        assert_eq!(g(json!({"url": "https://muffin.example.com/api"})), Some(0.0));
        // Half the words of one value, all of the other: the mean of the values.
        assert_eq!(g(json!({"city": "San Jose", "genre": "jazz"})), Some(0.75));
        // Only user and tool turns count: the system prompt's city is not the user's.
        assert_eq!(g(json!({"city": "Paris"})), Some(0.0));
        // Nested values are values too; booleans, nulls and empty strings are no evidence either way.
        assert_eq!(g(json!({"q": {"genres": ["rock", "opera"]}, "flag": true, "x": null, "e": ""})), Some(0.5));
        assert_eq!(g(json!({"flag": false})), None);
        assert_eq!(g(json!({})), None);
    }

    #[test]
    fn tool_results_ground_later_calls_and_numbers_match_as_written() {
        let conv = [ChatMessage::user("Add 0.5 to the total."), ChatMessage::new(Role::Tool, "total: 41")];
        assert_eq!(Evidence::of(&conv).grounding(&call(json!({"a": 41, "b": 0.5}))), Some(1.0));
        // 0.05 is not 0.5: "05" is not a word of the conversation.
        assert_eq!(Evidence::of(&conv).grounding(&call(json!({"b": 0.05}))), Some(0.5));
        // Numbers as written, with separators or as a percentage, or in words, count whole.
        let conv = [ChatMessage::user("Net income $1,000,000 at 5%, twice.")];
        assert_eq!(
            Evidence::of(&conv).grounding(&call(json!({"income": 1000000, "rate": 0.05, "times": 2, "n": 3}))),
            Some(0.75)
        );
    }

    #[test]
    fn values_rewritten_from_the_request_are_grounded() {
        let conv = [ChatMessage::user(
            "From New York to California on March 7, 2024: convert 300 euros, list strength traits, from zero.",
        )];
        let g = |args| Evidence::of(&conv).grounding(&call(args));
        // State codes as initials or the start of a word, a currency code, a date with the month named, a
        // plural of a word, a number in words.
        assert_eq!(
            g(json!({"from": "NY", "to": "CA", "cur": "EUR", "date": "2024-03-07", "traits": ["strengths"], "v0": 0})),
            Some(1.0)
        );
        // Not lower-case abbreviations, capitals that start no word, other dates, short words' forms.
        assert_eq!(g(json!({"a": "ny", "b": "TX", "c": "2024-04-07", "d": "mar"})), Some(2.0 / 12.0));
    }

    #[test]
    fn a_currency_named_grounds_its_code() {
        let g = |text: &str, args| Evidence::of(&[ChatMessage::user(text)]).grounding(&call(args));
        let codes = json!({"from": "USD", "to": "JPY"});
        assert_eq!(g("Convert 5000 US dollars into Japanese Yen", codes.clone()), Some(1.0));
        assert_eq!(g("How many yen is $20?", codes.clone()), Some(1.0));
        // Another currency, or a name that is also a common word without its country, is not the code.
        assert_eq!(g("Convert 5000 pesos into euros", codes), Some(0.0));
        assert_eq!(g("Who won the game?", json!({"c": "KRW"})), Some(0.0));
        assert_eq!(g("Send 10 Korean won", json!({"c": "KRW"})), Some(1.0));
        // A later call with a code is as stated as one with the currency's name.
        let ev = Evidence::of(&[ChatMessage::user("Weigh 75 kg on Mars, then convert 5000 US dollars to yen")]);
        let mut calls = vec![call(json!({"kg": 75})), call(json!({"amount": 5000, "from": "USD", "to": "JPY"}))];
        assert!(!ev.drop_unstated_calls(&mut calls));
    }

    #[test]
    fn unstated_optional_arguments_do_not_count_against_a_call() {
        let conv = [ChatMessage::user("Weather in Oslo, please.")];
        let schema = json!({"required": ["city"], "properties": {"city": {}, "days": {}, "units": {}}});
        let evidence = Evidence::of(&conv);
        let stated = call(json!({"city": "Oslo", "days": 7, "units": "imperial"}));
        assert_eq!(evidence.grounding(&stated), Some(1.0 / 3.0));
        assert_eq!(evidence.grounding_of_stated(&stated, &schema), Some(1.0));
        // A made-up required value still counts; a call that keeps nothing of what it said scores 0.
        assert_eq!(evidence.grounding_of_stated(&call(json!({"city": "Rome", "days": 3})), &schema), Some(0.0));
        assert_eq!(evidence.grounding_of_stated(&call(json!({"days": 3})), &schema), Some(0.0));
        assert_eq!(evidence.grounding_of_stated(&call(json!({})), &schema), None);
    }

    #[test]
    fn a_proposed_call_is_kept_only_as_a_new_requested_item() {
        let conv = [ChatMessage::user(
            "Weather in New York, Los Angeles and Tokyo? Also a loan of $1,500,000 at 5%. Book near Manhattan.",
        )];
        let c = |tool: &str, args: Value| ToolCall { tool: tool.into(), args };
        let ny = c("weather", json!({"city": "New York", "units": "metric"}));
        let schema = json!({"required": ["city", "near", "amount", "rate"]});
        let new = |call: &ToolCall, earlier: &[ToolCall]| {
            Evidence::of(&conv).is_new_requested_item(call, earlier, Some(&schema))
        };
        let after_ny = std::slice::from_ref(&ny);
        // Another city of the list: a new item.
        assert!(new(&c("weather", json!({"city": "Los Angeles", "units": "metric"})), after_ny));
        // A repeat, a made-up city, a refinement that only adds an argument: not new items.
        assert!(!new(&ny, after_ny));
        assert!(!new(&c("weather", json!({"city": "Paris", "units": "metric"})), after_ny));
        assert!(!new(&c("weather", json!({"city": "New York", "units": "metric", "days": 3})), after_ny));
        // Replacing a value the model made up is a correction, not a second item.
        let made_up = c("hotel", json!({"near": "Times Square"}));
        assert!(!new(&c("hotel", json!({"near": "Manhattan"})), &[made_up]));
        // An earlier value mostly from the request (a state abbreviated) is not made up: the next city is new.
        let abbreviated = c("weather", json!({"city": "New York, NY", "units": "metric"}));
        assert!(new(&c("weather", json!({"city": "Tokyo", "units": "metric"})), &[abbreviated]));
        // Numbers count as written: separators and percentages.
        assert!(new(&c("loan", json!({"amount": 1_500_000, "rate": 0.05})), after_ny));
        assert!(!new(&c("loan", json!({"amount": 1_400_000, "rate": 0.05})), after_ny));
        // Judged as it will run: a made-up optional value is left out first, a rewritten one counts ("LA").
        assert!(new(&c("weather", json!({"city": "Tokyo", "units": "metric", "days": 3})), after_ny));
        assert!(new(&c("weather", json!({"city": "LA", "units": "metric"})), after_ny));
        // A mixed-case identifier is not another form of a word of the request ("pointB" for "point").
        let point = |name: &str| c("set_point", json!({"point_name": name}));
        let conv = [ChatMessage::user("Change the point 'pointA' to 2,3,4")];
        let required = json!({"required": ["point_name"]});
        assert!(!Evidence::of(&conv).is_new_requested_item(&point("pointB"), &[point("pointA")], Some(&required)));
        assert_eq!(written_numbers("pay $1,500,000 at 5% for 10.5 years, id b12"), [1_500_000.0, 5.0, 0.05, 10.5]);
        assert_eq!(written_numbers("1.25 billion people, 3 millionaires"), [1.25, 1.25e9, 3.0]);
    }

    #[test]
    fn another_tool_the_request_names_is_a_new_item_with_the_same_arguments() {
        let conv =
            [ChatMessage::user("Get the temperature and humidity forecast for Boston, and find its top scorer.")];
        let schema = json!({"required": ["location"]});
        let c = |tool: &str| ToolCall { tool: tool.into(), args: json!({"location": "Boston"}) };
        let new = |call: &ToolCall, earlier: &[ToolCall]| {
            Evidence::of(&conv).is_new_requested_item(call, earlier, Some(&schema))
        };
        let temperature = [c("weather_forecast_temperature")];
        assert!(new(&c("weather_forecast_humidity"), &temperature));
        assert!(new(&c("TeamStats_getTopScorer"), &temperature));
        // A tool the request does not name, or names only by a generic action or a word an earlier tool has.
        assert!(!new(&c("weather_forecast_precipitation"), &temperature));
        assert!(!new(&c("find_forecasts"), &temperature));
        assert!(!new(&c("humidity_forecasts"), &[c("weather_forecast_humidity")]));
        // A short word of an earlier tool's name ("to") is not another form of a longer one ("tomorrow").
        let conv = [ChatMessage::user("Convert it, then the forecast for tomorrow.")];
        let later =
            Evidence::of(&conv).is_new_requested_item(&c("forecast_tomorrow"), &[c("convert_to_x")], Some(&schema));
        assert!(later);
        assert_eq!(name_words("violation_api_ViolationApi_get"), ["violation", "api", "violation", "api", "get"]);
    }

    #[test]
    fn optional_arguments_are_kept_only_when_stated() {
        let conv = [ChatMessage::user("Twice a week, top 5 chess players near São Paulo; include stats.")];
        let schema = json!({"required": ["city"]});
        let mut c = call(json!({
            "city": "Lisbon", "times": 2, "top": 5, "game": "Chess", "region": "são paulo", "stats": true,
            "rating": 2500, "season": "2019-2020", "tags": ["chess", "blitz"], "count": 7, "note": ""
        }));
        assert!(Evidence::of(&conv).drop_unstated_options(&mut c, &schema));
        let kept: Vec<&str> = c.args.as_object().unwrap().keys().map(String::as_str).collect();
        // Required (even made up), a number in words, a written number, a word, a non-ASCII word, a boolean,
        // an empty string; not a made-up number, a made-up string, a list with a made-up item.
        assert_eq!(kept, ["city", "times", "top", "game", "region", "stats", "note"]);
        assert!(!Evidence::of(&conv).drop_unstated_options(&mut c, &schema), "nothing more to leave out");
        let mut c = call(json!({"order": "chronological", "size": "larger"}));
        let conv = [ChatMessage::user("Sorted chronologically, the large one")];
        assert!(
            !Evidence::of(&conv).drop_unstated_options(&mut c, &json!({})),
            "longer and shorter forms of a word count"
        );
    }

    #[test]
    fn function_words_state_nothing_and_booleans_need_their_parameter_named_or_their_default() {
        let conv = [ChatMessage::user("Find a historical fiction book at the New York library, with details.")];
        let schema = json!({"required": ["genre"], "properties": {
            "verbose": {"type": "boolean", "default": false}, "available": {"type": "boolean", "default": true},
            "detailed": {"type": "boolean"}, "kids": {"type": "boolean"}
        }});
        let mut c = call(json!({
            "genre": "Poetry", "title": "The Great Gatsby", "branch": "the New York Public", "of": "at",
            "detailed": true, "verbose": true, "available": true, "kids": false
        }));
        assert!(Evidence::of(&conv).drop_unstated_options(&mut c, &schema));
        let kept: Vec<&str> = c.args.as_object().unwrap().keys().map(String::as_str).collect();
        // Required (made up); a value with a content word; one of function words only, judged by them; a
        // boolean named by a word sharing its first four letters, one at its default. Not a title whose
        // only word in the request is "the", a boolean off its default or one the request does not name.
        assert_eq!(kept, ["genre", "branch", "of", "detailed", "available"]);
    }

    #[test]
    fn later_calls_are_kept_only_when_stated_and_not_repeats_but_for_booleans() {
        let conv = [ChatMessage::user("Forecast for Seattle for 5 days and San Francisco; a gluten free recipe.")];
        let c = |tool: &str, args| ToolCall { tool: tool.into(), args };
        let mut calls = vec![
            c("forecast", json!({"city": "Seattle", "days": 5})),
            c("forecast", json!({"city": "San Francisco", "days": 5.0})),
            c("forecast", json!({"city": "San Francisco", "days": 4})),
            c("recipe", json!({"diet": "gluten free", "homemade": true})),
            c("recipe", json!({"diet": "gluten free", "homemade": false})),
            c("forecast", json!({"city": "Boston", "days": 5})),
        ];
        assert!(Evidence::of(&conv).drop_unstated_calls(&mut calls));
        // A value of an earlier call counts as stated (5.0 as 5); a made-up number, a repeat but for a
        // boolean and a made-up city go.
        let kept: Vec<String> = calls.iter().map(|c| format!("{} {}", c.tool, c.args)).collect();
        assert_eq!(
            kept,
            [
                r#"forecast {"city":"Seattle","days":5}"#,
                r#"forecast {"city":"San Francisco","days":5.0}"#,
                r#"recipe {"diet":"gluten free","homemade":true}"#
            ]
        );
        assert!(!Evidence::of(&conv).drop_unstated_calls(&mut calls), "nothing more to leave out");
        // The first call is the decision's own: kept even when made up (abstention judges it).
        let mut calls = vec![c("forecast", json!({"city": "Oslo"}))];
        assert!(!Evidence::of(&conv).drop_unstated_calls(&mut calls));
    }

    #[test]
    fn numbers_are_found_next_to_their_units() {
        let conv = [ChatMessage::user("A cuboid 10m high; charges of 5C and 7C, gate B12.")];
        assert_eq!(Evidence::of(&conv).grounding(&call(json!({"h": 10, "q": [5, 7], "gate": "b12"}))), Some(1.0));
        assert_eq!(words("x10m 2.5kg").collect::<Vec<_>>(), ["x", "10", "m", "2", "5", "kg"]);
    }

    #[test]
    fn unspaced_scripts_match_inside_the_text() {
        let conv = [ChatMessage::user("请帮我查询北京的天气")];
        assert_eq!(Evidence::of(&conv).grounding(&call(json!({"city": "北京"}))), Some(1.0));
        assert_eq!(Evidence::of(&conv).grounding(&call(json!({"city": "上海"}))), Some(0.0));
    }
}
