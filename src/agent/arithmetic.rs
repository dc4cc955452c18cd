//! Arithmetic a decision writes, checked: `12 + 7 + 30 + 41 = 120` is a slip a small model makes when it
//! sums numbers it has read instead of calling the calculator, or when its thought commits to a result
//! before the call. The agent recomputes each `expression = result` (or `expression equals result`) of an
//! answer or thought and, where the result is wrong, asks again with the right one (see
//! [`AgentConfig::check_arithmetic`](super::AgentConfig::check_arithmetic)).

use std::sync::OnceLock;

use regex::Regex;

/// An equation an answer writes whose result is wrong.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Slip {
    /// The left side, as written.
    pub expression: String,
    /// The left side as the calculator takes it: no thousands commas, money signs or currency codes,
    /// `×` and `÷` as `*` and `/` (`8080 + 42000 EUR` is `8080 + 42000`).
    pub evaluated: String,
    /// The result as written.
    pub written: String,
    /// The left side's value.
    pub value: f64,
}

impl std::fmt::Display for Slip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is {}, not {}", self.expression, format_number(self.value), self.written)
    }
}

/// A number as a person writes it: integers without a fraction, others to at most 6 decimals.
fn format_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn equation() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        // A number: digits with optional thousands commas and decimals, money signs allowed.
        let num = r"\$?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)";
        // An operand may carry a currency after it, as a code or a sign (`42000 EUR`, `30 €`).
        let operand = format!(r"\(*\s*-?{num}(?:\s?(?:[A-Z]{{3}}\b|€|£))?\s*\)*");
        // `x` is a times sign only with spaces around it (`7 x 12.50`; `3x-2` is algebra).
        let operator = r"\s*[-+*/×÷^]\s*|\s+x\s+";
        let pattern = format!(
            r"(?P<lhs>{operand}(?:(?:{operator}){operand})+)\s*(?:=|\bequals\b|\bis equal to\b)\s*(?P<rhs>-?{num})"
        );
        Regex::new(&pattern).expect("the equation pattern compiles")
    })
}

/// Whether the text around an equation found at `start..end` makes it part of something else: a longer
/// expression or word before it (`π × 5^2`, `10:30 + 15`, `v2 + 3`), or a result that goes on after it
/// (`= 15%`, `= 3/4`, `= 10:45`, `= 6 million`, `= 18k`).
fn embedded(text: &str, start: usize, end: usize) -> bool {
    let before = text[..start].chars().next_back();
    if before.is_some_and(|c| c.is_alphanumeric() || "$€£.:/^_".contains(c)) {
        return true;
    }
    if text[..start].trim_end().chars().next_back().is_some_and(|c| "+-*/×÷^=<>".contains(c)) {
        return true;
    }
    let after = &text[end..];
    let mut chars = after.chars();
    match chars.next() {
        None => false,
        Some(c) if c.is_alphanumeric() || "%/:^_".contains(c) => true,
        Some('.' | ',') => chars.next().is_some_and(|c| c.is_ascii_digit()),
        Some(c) if c.is_whitespace() => {
            let word: String = after.trim_start().chars().take_while(|c| c.is_alphabetic()).collect();
            matches!(word.to_lowercase().as_str(), "thousand" | "million" | "billion" | "trillion" | "k" | "m" | "bn")
        }
        Some(_) => false,
    }
}

/// The equations `text` writes whose result is wrong. A result is right when it equals the expression's
/// value, rounded or cut to the decimals it is written with (`10 / 3 = 3.33`, `2 / 3 = 0.666`); an
/// expression that does not evaluate (unbalanced parentheses, division by zero), a range or date
/// (`5-8`, `2024-03-07`) or an equation inside a longer one is no evidence either way.
pub fn slips(text: &str) -> Vec<Slip> {
    equations(text).filter(|e| !e.right).map(|e| e.slip).collect()
}

/// The results of the equations `text` writes that are right (`85 * 3 = 255` gives 255), as written:
/// values the text derived from its operands rather than made up.
pub fn derived(text: &str) -> Vec<f64> {
    equations(text).filter(|e| e.right).map(|e| e.claimed).collect()
}

/// An equation `text` writes, checked.
struct Checked {
    slip: Slip,
    claimed: f64,
    right: bool,
}

/// Every equation `text` writes that evaluates, with whether its result is right (see [`slips`]).
fn equations(text: &str) -> impl Iterator<Item = Checked> + '_ {
    equation().captures_iter(text).filter_map(move |c| {
        let whole = c.get(0).expect("a match has a whole");
        // An operand may start with spaces: the equation starts at its first other character.
        let start = whole.end() - whole.as_str().trim_start().len();
        if embedded(text, start, whole.end()) {
            return None;
        }
        let (lhs, rhs) = (c["lhs"].trim(), &c["rhs"]);
        if range().is_match(lhs) {
            return None;
        }
        let expr: String = lhs
            .replace([',', '$', '€', '£'], "")
            .chars()
            .filter(|ch| !ch.is_ascii_uppercase())
            .map(|ch| match ch {
                '×' | 'x' => '*',
                '÷' => '/',
                c => c,
            })
            .collect();
        let expr = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let value = evaluate(&expr)?;
        let written = rhs.replace([',', '$'], "");
        let claimed = written.parse::<f64>().ok()?;
        let decimals = written.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
        let unit = 10f64.powi(-decimals);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
        let rounded = (value / unit).round() * unit;
        let cut = (value / unit).trunc() * unit;
        let right = close(claimed, value) || close(claimed, rounded) || (decimals > 0 && close(claimed, cut));
        let slip = Slip { expression: lhs.to_string(), evaluated: expr, written: rhs.to_string(), value };
        Some(Checked { slip, claimed, right })
    })
}

/// Digits joined to digits by a hyphen without spaces: a range or a date (`5-8`, `2024-03-07`), not a
/// subtraction.
fn range() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\d-\d").expect("the range pattern compiles"))
}

/// The value of an arithmetic expression (`+ - * / % ^`, parentheses), as the calculator tool gives it;
/// `None` when it does not parse or is not finite.
fn evaluate(expr: &str) -> Option<f64> {
    crate::tools::calculate(expr).ok()?.as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_results_are_found_and_right_ones_pass() {
        let s = slips("The numbers are 12, 7, 30 and 41, so 12 + 7 + 30 + 41 = 120.");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].to_string(), "12 + 7 + 30 + 41 is 90, not 120");
        assert_eq!(slips("(1234 + 5678) / 2 equals 7892").len(), 1);
        assert_eq!(slips("(1234 + 5678) / 2 = 3456").len(), 0);
        // Rounded as written, thousands separators, times signs, money.
        assert!(slips("10 / 3 = 3.33, 2,000 × 3 = 6,000, 7 x 12.50 = $87.50, 2^10 - 24 = 1000").is_empty());
        assert_eq!(slips("10 / 3 = 3.5").len(), 1);
        // Truncated decimals, money on every number, a result at the end of a sentence.
        assert!(slips("2 / 3 = 0.666 and $1,200 + $350 = $1,550.").is_empty());
        assert_eq!(slips("$100 + $50 + 25 = $185.").len(), 1);
        assert_eq!(slips("Total: 3 * 4 = 13, then (3 + 4) x 2 = 14").len(), 1);
        // A currency after an operand (a 0.5B's answer after reading a port and a budget).
        let s = slips("8080 + 42000 EUR = 42800 EUR.");
        assert_eq!(s.iter().map(ToString::to_string).collect::<Vec<_>>(), ["8080 + 42000 EUR is 50080, not 42800"]);
        // The calculator is given the expression without the currency.
        assert_eq!(s[0].evaluated, "8080 + 42000");
        assert_eq!(slips("1,200 × 3 € = 3000")[0].evaluated, "1200 * 3");
        assert!(slips("100 USD + 50 USD = 150 USD, and 20 € + 5 € = 25 €").is_empty());
    }

    #[test]
    fn text_without_an_equation_or_that_does_not_evaluate_is_no_slip() {
        for text in [
            "The budget is 42000.",
            "Version 1.2 = stable",
            "See section 3-4 = details",
            "5 / 0 = 7",
            "2024-03-07 is the date",
            "x = 5",
            "π × 5^2 = 78.54",
            "351 / 2340 = 15%",
            "1/2 + 1/4 = 3/4",
            "1,200 × 5,000 = 6 million",
            "Pages 5-8 = 4 pages",
            "2024-03-07 - 2024-03-01 = 6 days",
            "3x-2 = 7",
            "10:30 + 15 = 10:45",
            "v2 + 3 = 4",
            "3 + 4 = 7k",
        ] {
            assert!(slips(text).is_empty(), "{text}");
        }
    }
}
