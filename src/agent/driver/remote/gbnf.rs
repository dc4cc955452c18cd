//! GBNF, llama.cpp's grammar format, for engines that take a grammar only in it (llama.cpp's server and
//! llama-cpp-python's, as the request's `grammar`): a decision's JSON schema ([`schema`]) and a native
//! decision's Lark grammar ([`lark`], the subset [`native_grammar`](crate::agent::native::native_grammar)
//! writes) written as GBNF.
//!
//! The translation keeps the decision's shape: the tools' names, their argument keys in order, required
//! and optional ones, the value types, enums and constants, bounded strings and arrays, the separators of
//! `x-guidance`. What GBNF cannot say or what is not translated (numeric ranges, string patterns and
//! formats, `allOf`, `not`) is left to the validation here, which every remote decision goes through.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::text::tokenizer::Tokenizer;

/// Repetition bounds above this are written as unbounded (`*`): llama.cpp expands `x{0,n}` into n rules.
const MAX_REPEAT: u64 = 256;
/// Integer ranges narrower than this are written as their values.
const SMALL_RANGE: i64 = 64;
/// Nesting beyond this in a schema is refused (an untrusted schema bounds no recursion).
const MAX_DEPTH: usize = 64;

/// The GBNF of the JSON values `schema` allows, as `root`.
pub fn schema(schema: &Value) -> Result<String> {
    let mut w = Writer::new(schema);
    let root = w.value(schema, 0)?;
    w.rules.insert(0, ("root".into(), root));
    Ok(w.finish())
}

/// The GBNF of a native decision's Lark grammar (see the module's note): its rules, literals, token
/// markers (`<[id]>` and `<name>`, written as the token's text, which llama.cpp matches against each
/// token's), the
/// two regular expressions it uses and its `%json` schemas.
pub fn lark(lark: &str, tok: &Tokenizer) -> Result<String> {
    let unsupported = |what: String| Error::param("constraint", format!("gbnf: {what}"));
    let mut w = Writer::new(&Value::Null);
    let mut rules = Vec::new();
    for line in lark.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//")) {
        let (head, body) =
            line.split_once(':').ok_or_else(|| unsupported(format!("a line that is no rule: {line}")))?;
        // `answer[max_tokens=N]`: the bound is the request's.
        let name = head.split('[').next().unwrap_or(head).trim();
        let body = body.trim();
        let expr = match body.strip_prefix("%json") {
            Some(json) => {
                let s: Value =
                    serde_json::from_str(json.trim()).map_err(|e| unsupported(format!("`%json` of `{name}`: {e}")))?;
                let mut sub = Writer::new(&s);
                sub.prefix = format!("{}-", rule_name(name));
                let e = sub.value(&s, 0)?;
                w.rules.append(&mut sub.rules);
                w.primitives.extend(sub.primitives);
                w.any |= sub.any;
                e
            }
            None => lark_body(body, tok).map_err(unsupported)?,
        };
        rules.push((rule_name(name), expr));
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(unsupported("the grammar has no `start` rule".into()));
    }
    rules.append(&mut w.rules);
    w.rules = rules;
    Ok(w.finish())
}

/// A Lark rule name as a GBNF one (letters, digits and dashes): `start` is `root`; terminals (upper
/// case) apart from rules.
fn rule_name(name: &str) -> String {
    let kind = if name.chars().all(|c| !c.is_ascii_lowercase()) { "t" } else { "l" };
    match name {
        "start" => "root".into(),
        n => format!("{kind}-{}", n.to_ascii_lowercase().replace('_', "-")),
    }
}

/// A rule's body: names (with `?`, `*`, `+`), `|`, parentheses, JSON-quoted literals, token markers and
/// regular expressions.
fn lark_body(body: &str, tok: &Tokenizer) -> std::result::Result<String, String> {
    let mut out = Vec::new();
    let b = body.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        match c {
            ' ' | '\t' => i += 1,
            '|' | '(' | ')' | '?' | '*' | '+' => {
                out.push(c.to_string());
                i += 1;
            }
            '"' => {
                // A JSON string: up to the first quote not escaped.
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let quoted = body.get(i..=j).ok_or("an unclosed literal")?;
                let s: String = serde_json::from_str(quoted).map_err(|e| format!("the literal {quoted}: {e}"))?;
                out.push(literal(&s));
                i = j + 1;
            }
            '<' if body[i..].starts_with("<[") => {
                let end = body[i..].find("]>").ok_or("an unclosed token marker")? + i;
                let id: u32 =
                    body[i + 2..end].parse().map_err(|_| format!("the token marker {}", &body[i..end + 2]))?;
                let text = String::from_utf8_lossy(tok.token_bytes(id)).into_owned();
                if text.is_empty() {
                    return Err(format!("token {id} has no text"));
                }
                out.push(literal(&text));
                i = end + 2;
            }
            '<' => {
                // A special token by its text (`<tool_call>`).
                let end = body[i..].find('>').ok_or("an unclosed special token")? + i;
                out.push(literal(&body[i..=end]));
                i = end + 1;
            }
            '/' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'/' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let re = body.get(i + 1..j).ok_or("an unclosed regular expression")?;
                out.push(format!("({})", regex(re)?));
                i = j + 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let j = body[i..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(b.len(), |k| i + k);
                out.push(rule_name(&body[i..j]));
                i = j;
            }
            other => return Err(format!("`{other}` in the rule `{body}`")),
        }
    }
    // Quantifiers bind to what precedes them, with no space between.
    let mut joined = String::new();
    for part in out {
        if !joined.is_empty() && !matches!(part.as_str(), "?" | "*" | "+") {
            joined.push(' ');
        }
        joined.push_str(&part);
    }
    Ok(joined)
}

/// A regular expression of the subset the native grammar uses (characters, escapes, `\s`, classes,
/// `.` and `(?s:.)`, with `?`, `*`, `+`) as a GBNF sequence.
fn regex(re: &str) -> std::result::Result<String, String> {
    let chars: Vec<char> = re.chars().collect();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let atom = match chars[i] {
            '(' if re[char_offset(re, i)..].starts_with("(?s:.)") => {
                i += 6;
                ".".to_string()
            }
            '.' => {
                i += 1;
                "[^\\x0A]".to_string()
            }
            '[' => {
                let (class, next) = char_class(&chars, i)?;
                i = next;
                class
            }
            '\\' => {
                let e = *chars.get(i + 1).ok_or("a trailing backslash")?;
                i += 2;
                match e {
                    's' => "[ \\x09\\x0A\\x0D\\x0B\\x0C]".to_string(),
                    'n' => literal("\n"),
                    't' => literal("\t"),
                    'r' => literal("\r"),
                    c if c.is_ascii_punctuation() => literal(&c.to_string()),
                    c => return Err(format!("the escape \\{c} in /{re}/")),
                }
            }
            c if "?*+|(){}".contains(c) => return Err(format!("`{c}` in /{re}/")),
            c => {
                i += 1;
                literal(&c.to_string())
            }
        };
        let mut atom = atom;
        if let Some(q @ ('?' | '*' | '+')) = chars.get(i) {
            atom.push(*q);
            i += 1;
        }
        parts.push(atom);
    }
    Ok(parts.join(" "))
}

fn char_offset(s: &str, chars: usize) -> usize {
    s.char_indices().nth(chars).map_or(s.len(), |(o, _)| o)
}

/// The class that opens at `chars[start]` (`[` … `]`), as GBNF, and the index after it.
fn char_class(chars: &[char], start: usize) -> std::result::Result<(String, usize), String> {
    let mut out = String::from("[");
    let mut i = start + 1;
    if chars.get(i) == Some(&'^') {
        out.push('^');
        i += 1;
    }
    loop {
        match chars.get(i) {
            None => return Err("an unclosed character class".into()),
            Some(']') => break,
            Some('\\') => {
                let e = *chars.get(i + 1).ok_or("a trailing backslash")?;
                match e {
                    's' => out.push_str(" \\x09\\x0A\\x0D\\x0B\\x0C"),
                    'n' => out.push_str("\\x0A"),
                    't' => out.push_str("\\x09"),
                    'r' => out.push_str("\\x0D"),
                    c if c.is_ascii_punctuation() => class_char(&mut out, c),
                    c => return Err(format!("the escape \\{c} in a character class")),
                }
                i += 2;
            }
            Some('-') if i > start + 1 && chars.get(i + 1).is_some_and(|c| *c != ']') => {
                out.push('-');
                i += 1;
            }
            Some(&c) => {
                class_char(&mut out, c);
                i += 1;
            }
        }
    }
    out.push(']');
    Ok((out, i + 1))
}

/// A character inside a GBNF class: ASCII other than letters and digits as `\xHH`.
fn class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() || !c.is_ascii() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{:02X}", c as u32);
    }
}

/// `s` as a GBNF literal.
fn literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rules shared by every schema: JSON's primitives, written once where used.
const PRIMITIVES: &[(&str, &str)] = &[
    ("j-char", r#"[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#),
    ("j-string", r#""\"" j-char* "\"""#),
    ("j-integer", r#""-"? ([0-9] | [1-9] [0-9]{1,15})"#),
    ("j-number", r#""-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?"#),
    ("j-boolean", r#""true" | "false""#),
    ("j-null", r#""null""#),
];

struct Writer<'s> {
    /// Rules in the order written (the first is the root).
    rules: Vec<(String, String)>,
    /// The primitives used.
    primitives: std::collections::BTreeSet<&'static str>,
    /// `$defs` of the schema's root, and the rule each `$ref` became.
    defs: Option<&'s Map<String, Value>>,
    refs: HashMap<String, String>,
    item_sep: String,
    key_sep: String,
    prefix: String,
    /// Whether the generic value's rules are written.
    any: bool,
}

impl<'s> Writer<'s> {
    fn new(root: &'s Value) -> Self {
        let sep = |key: &str, default: &str| {
            root.pointer(&format!("/x-guidance/{key}")).and_then(Value::as_str).unwrap_or(default).to_string()
        };
        Self {
            rules: Vec::new(),
            primitives: Default::default(),
            defs: root.get("$defs").or_else(|| root.get("definitions")).and_then(Value::as_object),
            refs: HashMap::new(),
            item_sep: sep("item_separator", ","),
            key_sep: sep("key_separator", ":"),
            prefix: "j-".into(),
            any: false,
        }
    }

    fn finish(mut self) -> String {
        let mut out = String::new();
        if self.any {
            self.primitives.extend(["j-string", "j-char", "j-number", "j-boolean", "j-null"]);
        }
        if self.primitives.contains("j-string") {
            self.primitives.insert("j-char");
        }
        for (name, body) in &self.rules {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        for (name, body) in PRIMITIVES.iter().filter(|(n, _)| self.primitives.contains(n)) {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        if self.any {
            let (item, key) = (literal(&self.item_sep), literal(&self.key_sep));
            let _ = writeln!(out, "j-any ::= j-any-object | j-any-array | j-string | j-number | j-boolean | j-null");
            let _ =
                writeln!(out, "j-any-object ::= \"{{\" (j-string {key} j-any ({item} j-string {key} j-any)*)? \"}}\"");
            let _ = writeln!(out, "j-any-array ::= \"[\" (j-any ({item} j-any)*)? \"]\"");
        }
        out
    }

    fn rule(&mut self, body: String) -> String {
        let name = format!("{}{}", self.prefix, self.rules.len() + 1);
        self.rules.push((name.clone(), body));
        name
    }

    fn primitive(&mut self, name: &'static str) -> String {
        self.primitives.insert(name);
        name.to_string()
    }

    fn any(&mut self) -> String {
        self.any = true;
        "j-any".into()
    }

    /// An expression for the values `s` allows.
    fn value(&mut self, s: &Value, depth: usize) -> Result<String> {
        if depth > MAX_DEPTH {
            return Err(Error::param("constraint", format!("gbnf: a schema nested deeper than {MAX_DEPTH}")));
        }
        let o = match s {
            Value::Bool(true) => return Ok(self.any()),
            Value::Bool(false) => return Err(Error::param("constraint", "gbnf: a schema that allows nothing")),
            Value::Object(o) => o,
            _ => return Ok(self.any()),
        };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return self.reference(r, depth);
        }
        if let Some(c) = o.get("const") {
            return Ok(literal(&serde_json::to_string(c)?));
        }
        if let Some(Value::Array(values)) = o.get("enum") {
            let alts: Result<Vec<String>> = values.iter().map(|v| Ok(literal(&serde_json::to_string(v)?))).collect();
            return Ok(format!("({})", alts?.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alts)) = o.get(key) {
                let alts: Result<Vec<String>> = alts.iter().map(|a| self.value(a, depth + 1)).collect();
                let body = alts?.join(" | ");
                return Ok(self.rule(body));
            }
        }
        if let Some(Value::Array(all)) = o.get("allOf") {
            if let [only] = all.as_slice() {
                return self.value(only, depth + 1);
            }
            return Ok(self.any());
        }
        match o.get("type") {
            Some(Value::String(t)) => self.typed(t, o, depth),
            Some(Value::Array(ts)) => {
                let alts: Result<Vec<String>> =
                    ts.iter().filter_map(Value::as_str).map(|t| self.typed(t, o, depth)).collect();
                let body = alts?.join(" | ");
                Ok(self.rule(body))
            }
            _ if o.contains_key("properties") => self.typed("object", o, depth),
            _ if o.contains_key("items") => self.typed("array", o, depth),
            _ => Ok(self.any()),
        }
    }

    fn reference(&mut self, r: &str, depth: usize) -> Result<String> {
        if let Some(name) = self.refs.get(r) {
            return Ok(name.clone());
        }
        let key = r.strip_prefix("#/$defs/").or_else(|| r.strip_prefix("#/definitions/"));
        let target = key.and_then(|k| self.defs?.get(k));
        let Some(target) = target else {
            return Err(Error::param("constraint", format!("gbnf: the reference `{r}` names no definition")));
        };
        // The rule is named before its body is written: a definition that refers to itself ends.
        let name = format!("{}{}", self.prefix, self.rules.len() + 1);
        self.rules.push((name.clone(), String::new()));
        self.refs.insert(r.to_string(), name.clone());
        let body = self.value(target, depth + 1)?;
        if let Some(slot) = self.rules.iter_mut().find(|(n, _)| *n == name) {
            slot.1 = body;
        }
        Ok(name)
    }

    fn typed(&mut self, t: &str, o: &Map<String, Value>, depth: usize) -> Result<String> {
        let bound = |key: &str| o.get(key).and_then(Value::as_u64);
        Ok(match t {
            "string" => {
                self.primitives.insert("j-char");
                let (min, max) = (bound("minLength").unwrap_or(0), bound("maxLength"));
                let pattern = o.contains_key("pattern") || o.contains_key("format");
                match max {
                    Some(max) if !pattern && max <= MAX_REPEAT => {
                        format!("\"\\\"\" j-char{{{},{}}} \"\\\"\"", min.min(max), max)
                    }
                    _ if min > 0 && min <= MAX_REPEAT && !pattern => format!("\"\\\"\" j-char{{{min},}} \"\\\"\""),
                    _ => self.primitive("j-string"),
                }
            }
            "integer" => {
                // A small range as its values; a wide one as any integer (checked here).
                let given = |k: &str| o.get(k).and_then(Value::as_i64);
                match (given("minimum"), given("maximum")) {
                    (Some(lo), Some(hi)) if lo <= hi && hi - lo < SMALL_RANGE => {
                        let values: Vec<String> = (lo..=hi).map(|v| literal(&v.to_string())).collect();
                        format!("({})", values.join(" | "))
                    }
                    _ => self.primitive("j-integer"),
                }
            }
            "number" => self.primitive("j-number"),
            "boolean" => self.primitive("j-boolean"),
            "null" => self.primitive("j-null"),
            "array" => {
                let item = match o.get("items") {
                    Some(i) => self.value(i, depth + 1)?,
                    None => self.any(),
                };
                let sep = literal(&self.item_sep);
                let (min, max) = (bound("minItems").unwrap_or(0), bound("maxItems"));
                let more = match max {
                    Some(max) if max <= MAX_REPEAT => {
                        format!(
                            "({sep} {item}){{{},{}}}",
                            min.saturating_sub(1).min(max.saturating_sub(1)),
                            max.saturating_sub(1)
                        )
                    }
                    _ => format!("({sep} {item}){{{},}}", min.saturating_sub(1).min(MAX_REPEAT)),
                };
                let body = match (min, max) {
                    (_, Some(0)) => "\"[]\"".to_string(),
                    (0, _) => format!("\"[\" ({item} {more})? \"]\""),
                    _ => format!("\"[\" {item} {more} \"]\""),
                };
                self.rule(body)
            }
            "object" | "dict" => self.object(o, depth)?,
            _ => self.any(),
        })
    }

    /// An object: its properties in order, the required ones always, each optional one or not, commas
    /// only between those written; other keys where `additionalProperties` is not `false` and there are
    /// no properties.
    fn object(&mut self, o: &Map<String, Value>, depth: usize) -> Result<String> {
        let props: Vec<(&String, &Value)> =
            o.get("properties").and_then(Value::as_object).into_iter().flatten().collect();
        let closed = o.get("additionalProperties") == Some(&Value::Bool(false));
        if props.is_empty() {
            return Ok(if closed { "\"{}\"".to_string() } else { self.any_object() });
        }
        let required: Vec<&str> =
            o.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let (item, key) = (literal(&self.item_sep), literal(&self.key_sep));
        let mut pairs = Vec::new();
        for (name, schema) in &props {
            let v = self.value(schema, depth + 1)?;
            pairs.push((
                format!("{} {key} {v}", literal(&serde_json::to_string(name)?)),
                required.contains(&name.as_str()),
            ));
        }
        // From property i on: `after` once one is written (each then after the separator), `first` before.
        let (mut after, mut first) = ("\"\"".to_string(), "\"\"".to_string());
        for (pair, req) in pairs.iter().rev() {
            let with_after = format!("{item} {pair} {after}");
            let with_first = format!("{pair} {after}");
            let (a, f) = match req {
                true => (with_after, with_first),
                false => (format!("{with_after} | {after}"), format!("{with_first} | {first}")),
            };
            after = self.rule(a);
            first = self.rule(f);
        }
        Ok(self.rule(format!("\"{{\" {first} \"}}\"")))
    }

    fn any_object(&mut self) -> String {
        self.any = true;
        "j-any-object".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_is_written_with_its_keys_in_order_and_its_bounds() {
        let s = json!({
            "x-guidance": {"item_separator": ", ", "key_separator": ": "},
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"},
                "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": false
        });
        let g = schema(&s).unwrap();
        assert!(g.starts_with("root ::= j-"), "{g}");
        assert!(g.contains(r#""\"city\"" ": " "\"" j-char{0,20} "\"""#), "{g}");
        assert!(g.contains(r#"("\"c\"" | "\"f\"")"#), "{g}");
        assert!(g.contains("j-integer ::="), "{g}");
        assert!(!g.contains("j-any"), "no generic value where none is needed: {g}");
    }

    #[test]
    fn references_end_and_bad_ones_are_named() {
        let s = json!({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node"});
        let g = schema(&s).unwrap();
        assert_eq!(g.lines().filter(|l| l.contains("\"\\\"next\\\"\"")).count(), 2, "{g}");
        let err = schema(&json!({"$ref": "#/$defs/missing"})).unwrap_err().to_string();
        assert!(err.contains("#/$defs/missing"), "{err}");
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"type": "array", "items": deep});
        }
        assert!(schema(&deep).is_err(), "nesting is bounded");
    }

    #[test]
    fn regular_expressions_of_the_native_grammar() {
        assert_eq!(regex(r"\n\n?").unwrap(), r#""\n" "\n"?"#);
        assert_eq!(regex(r"[^<`{\s](?s:.)*").unwrap(), r"[^\x3C\x60\x7B \x09\x0A\x0D\x0B\x0C] .*");
        assert!(regex("a|b").is_err());
    }
}
