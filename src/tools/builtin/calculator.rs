//! The `calculator` built-in: arithmetic only (evalexpr on an empty context), needed when the request
//! itself writes arithmetic.

use serde_json::{json, Value};

use crate::tools::{Done, Need, Tool, ToolError, ToolSpec};

/// The calculator: arithmetic only, and needed when the request itself writes arithmetic.
pub(super) struct Calculator {
    pub(super) spec: ToolSpec,
}

impl Tool for Calculator {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        calculate(args["expression"].as_str().unwrap_or_default())
    }
    fn read_only(&self) -> bool {
        true
    }
    fn needed_for(&self, request: &str, done: &[Done]) -> Option<Need> {
        if done.iter().any(|d| d.call.tool == self.spec.name) {
            return None;
        }
        let (at, a) = arithmetic_in(request)?;
        Some(Need { reason: format!("the request computes with numbers ({a})"), at, calls: vec![self.spec.clone()] })
    }
}

/// Arithmetic the request writes, with where it starts: an operator between two numbers (`37 * 43`,
/// `2 ^ 10`, `98765 - 12345`, `144/12`). Numbers alone force nothing (`2 cats and 3 dogs`, `top 10 films of
/// 2023`): whether to compute is the model's choice. `-`, `x` and `/` between spaces or, for `/`, between
/// digits alone; a date, a version or a size (`12/25/2024`, `1.2-3`, `1920x1080`) is no expression.
fn arithmetic_in(request: &str) -> Option<(usize, String)> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(
            r"(?:^|[^\w.:/-])(\d+(?:\.\d+)?(?:\s*[+*×÷^]\s*|\s+[-/x]\s+|/)\(?\d+(?:\.\d+)?)(?:$|[^\w.:/-])",
        )
        .expect("a valid regex")
    });
    let m = re.captures(request)?.get(1)?;
    Some((m.start(), m.as_str().to_string()))
}

/// Arithmetic only: evalexpr on an empty context, so no variables, assignments or user functions.
pub(crate) fn calculate(expr: &str) -> std::result::Result<Value, ToolError> {
    if expr.len() > 1000 {
        return Err(ToolError("expression too long".into()));
    }
    // Spellings models write for a power and a square root (Python's `**`, `sqrt(169)`, `√169`).
    let expr = expr.replace("**", "^").replace('√', "sqrt ");
    let ok = |c: char| c.is_ascii_digit() || c.is_whitespace() || "+-*/%^().eE".contains(c);
    if let Some(bad) = expr.replace("sqrt", "").chars().find(|&c| !ok(c)) {
        return Err(ToolError(format!("only numbers and + - * / % ^ ( ) sqrt are allowed, found `{bad}`")));
    }
    // Integers would divide as integers (7/2 = 3): evaluate in floating point.
    let v = evalexpr::eval_number(&float_literals(&percents(&expr)).replace("sqrt", "math::sqrt"))
        .map_err(|e| ToolError(format!("cannot evaluate: {e}")))?;
    if !v.is_finite() {
        return Err(ToolError("the result is not a finite number".into()));
    }
    Ok(if v.fract() == 0.0 && v.abs() < 9.0e15 { json!(v as i64) } else { json!(v) })
}

/// Writes a percent sign that ends an operand (`15% * 2340`, `2340 * 15%`) as a hundredth: `(15/100)`. A `%`
/// between two operands (`17 % 5`) stays the remainder.
fn percents(expr: &str) -> String {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::with_capacity(expr.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        let remainder = || {
            chars[i + 1..].iter().find(|c| !c.is_whitespace()).is_some_and(|n| n.is_ascii_digit() || "(.".contains(*n))
        };
        if c != '%' || remainder() {
            out.push(c);
            continue;
        }
        out.truncate(out.trim_end().len());
        let start = out.rfind(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(0, |p| p + 1);
        if start < out.len() {
            let number = out.split_off(start);
            out.push('(');
            out.push_str(&number);
            out.push_str("/100)");
        } else {
            out.push_str("/100");
        }
    }
    out
}

/// Writes every integer literal as a float (`7` → `7.0`).
fn float_literals(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len() + 8);
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() || (chars[i] == '.' && chars.get(i + 1).is_some_and(|c| c.is_ascii_digit())) {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let lit: String = chars[start..i].iter().collect();
            out.push_str(if lit.starts_with('.') { "0" } else { "" });
            out.push_str(&lit);
            if !lit.contains('.') {
                out.push_str(".0");
            } else if lit.ends_with('.') {
                out.push('0');
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}
