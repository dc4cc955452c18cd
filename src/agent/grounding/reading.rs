//! How the turns and argument values are read: words (letter and digit runs), written and named numbers,
//! the words of tool names, and the word tables the evidence consults.

use serde_json::Value;

/// Words that carry no value of their own: a made-up title is not stated by its "the".
pub(super) const FUNCTION_WORDS: [&str; 29] = [
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "and", "or", "by", "with", "from", "is", "are", "be", "as",
    "it", "its", "this", "that", "my", "me", "i", "you", "your", "we", "our",
];

/// Numbers written as words.
pub(super) const NUMBER_WORDS: [(&str, f64); 25] = [
    ("zero", 0.0),
    ("one", 1.0),
    ("two", 2.0),
    ("three", 3.0),
    ("four", 4.0),
    ("five", 5.0),
    ("six", 6.0),
    ("seven", 7.0),
    ("eight", 8.0),
    ("nine", 9.0),
    ("ten", 10.0),
    ("eleven", 11.0),
    ("twelve", 12.0),
    ("thirteen", 13.0),
    ("fourteen", 14.0),
    ("fifteen", 15.0),
    ("sixteen", 16.0),
    ("seventeen", 17.0),
    ("eighteen", 18.0),
    ("nineteen", 19.0),
    ("twenty", 20.0),
    ("once", 1.0),
    ("twice", 2.0),
    ("thrice", 3.0),
    ("dozen", 12.0),
];

/// Months, as the numbers dates write them with.
pub(super) const MONTHS: [(&str, f64); 12] = [
    ("january", 1.0),
    ("february", 2.0),
    ("march", 3.0),
    ("april", 4.0),
    ("may", 5.0),
    ("june", 6.0),
    ("july", 7.0),
    ("august", 8.0),
    ("september", 9.0),
    ("october", 10.0),
    ("november", 11.0),
    ("december", 12.0),
];

/// Currencies by ISO 4217 code, each with the words that name it (all words of one alternative present):
/// a code a request never writes is still the user's when the request names the currency ("US dollars" →
/// `USD`, "Japanese yen" → `JPY`). Codes whose names are common words ("won", "real") need their country.
pub(super) const CURRENCIES: [(&str, &[&[&str]]); 20] = [
    ("usd", &[&["dollar"], &["dollars"], &["usd"]]),
    ("eur", &[&["euro"], &["euros"]]),
    ("jpy", &[&["yen"]]),
    ("gbp", &[&["pound", "sterling"], &["pounds"], &["british", "pound"], &["gbp"]]),
    ("cny", &[&["yuan"], &["renminbi"], &["rmb"]]),
    ("inr", &[&["rupee"], &["rupees"]]),
    ("chf", &[&["franc"], &["francs"]]),
    ("cad", &[&["canadian", "dollar"], &["canadian", "dollars"]]),
    ("aud", &[&["australian", "dollar"], &["australian", "dollars"]]),
    ("nzd", &[&["zealand", "dollar"], &["zealand", "dollars"]]),
    ("hkd", &[&["hong", "kong", "dollar"], &["hong", "kong", "dollars"]]),
    ("sgd", &[&["singapore", "dollar"], &["singapore", "dollars"]]),
    ("krw", &[&["korean", "won"]]),
    ("mxn", &[&["peso"], &["pesos"]]),
    ("brl", &[&["brazilian", "real"], &["brazilian", "reais"], &["reais"]]),
    ("rub", &[&["ruble"], &["rubles"], &["rouble"], &["roubles"]]),
    ("sek", &[&["swedish", "krona"], &["swedish", "kronor"]]),
    ("nok", &[&["norwegian", "krone"], &["norwegian", "kroner"]]),
    ("zar", &[&["rand"]]),
    ("try", &[&["lira"], &["turkish", "lira"]]),
];

/// Words that scale the number before them.
const SCALE_WORDS: [(&str, f64); 4] = [("thousand", 1e3), ("million", 1e6), ("billion", 1e9), ("trillion", 1e12)];

/// The numbers written in `text`, with thousands separators (`1,000,000`) and decimals; a percentage
/// also as its fraction (`5%` is 5 and 0.05), a number before a scale word also scaled (`2.5 million`).
pub(super) fn written_numbers(text: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() || (i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.')) {
            i += 1;
            continue;
        }
        let mut digits = String::new();
        while i < b.len() {
            match b[i] {
                c if c.is_ascii_digit() => digits.push(c as char),
                // A thousands separator: a comma before exactly three digits.
                b',' if b.len() > i + 3
                    && b[i + 1..i + 4].iter().all(u8::is_ascii_digit)
                    && b.get(i + 4).is_none_or(|c| !c.is_ascii_digit()) => {}
                b'.' if b.get(i + 1).is_some_and(u8::is_ascii_digit) && !digits.contains('.') => digits.push('.'),
                _ => break,
            }
            i += 1;
        }
        if let Ok(x) = digits.parse::<f64>() {
            out.push(x);
            let after = text[i..].trim_start();
            if after.starts_with('%') || after.starts_with("percent") {
                out.push(x / 100.0);
            }
            // A scale word: "1.267 billion" is also 1 267 000 000.
            for (word, scale) in SCALE_WORDS {
                let rest = after.strip_prefix(word);
                if rest.is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric())) {
                    out.push(x * scale);
                }
            }
        }
    }
    out
}

pub(super) use crate::tools::name_words;

/// Words of tool names that name an action any tool may do, not the thing a request asks about.
pub(super) const GENERIC_ACTIONS: [&str; 16] = [
    "calc",
    "calculate",
    "check",
    "compute",
    "create",
    "data",
    "details",
    "fetch",
    "find",
    "info",
    "information",
    "list",
    "lookup",
    "query",
    "retrieve",
    "search",
];

/// The scalar values inside `v` (strings and numbers; booleans and nulls carry no evidence).
pub(super) fn leaves(v: &Value) -> Vec<Value> {
    match v {
        Value::Object(m) => m.values().flat_map(leaves).collect(),
        Value::Array(a) => a.iter().flat_map(leaves).collect(),
        Value::Null | Value::Bool(_) => Vec::new(),
        Value::String(s) if s.is_empty() => Vec::new(),
        other => vec![other.clone()],
    }
}

/// The words of a scalar value, lower-cased.
pub(super) fn leaf_words(v: &Value) -> Vec<String> {
    words(&leaf_text(v).to_lowercase()).map(str::to_string).collect()
}

/// A scalar value as text: a string as it is, a number as JSON writes it.
pub(super) fn leaf_text(v: &Value) -> std::borrow::Cow<'_, str> {
    match v {
        Value::String(s) => s.into(),
        other => other.to_string().into(),
    }
}

/// Runs of letters and runs of digits: `10m` is `10` and `m`, so a value of 10 is found in "10m".
pub(super) fn words(s: &str) -> impl Iterator<Item = &str> {
    #[derive(PartialEq, Clone, Copy)]
    enum Kind {
        Gap,
        Digit,
        Letter,
    }
    let kind = |c: char| match c {
        c if c.is_numeric() => Kind::Digit,
        c if c.is_alphanumeric() => Kind::Letter,
        _ => Kind::Gap,
    };
    let mut start = 0;
    let mut last = Kind::Gap;
    let mut bounds = Vec::new();
    for (i, c) in s.char_indices().chain(std::iter::once((s.len(), ' '))) {
        let k = kind(c);
        if k != last {
            if last != Kind::Gap {
                bounds.push((start, i));
            }
            start = i;
            last = k;
        }
    }
    bounds.into_iter().map(move |(a, b)| &s[a..b])
}
