//! GBNF (llama.cpp's grammar format) read into llguidance's Lark dialect, for clients written for
//! llama.cpp's server, which send a grammar as `grammar`: rules (`name ::= …`, over several lines where
//! they continue), literals, character classes and ranges, `.`, groups, `?`, `*`, `+`, `{m}`, `{m,}`,
//! `{m,n}`, comments. Lexing is then llguidance's: a literal and a class that both match at a point are
//! told apart by what follows, as llguidance lexes (its longest match), which a few GBNF grammars written
//! for character-by-character matching do not expect.

use std::fmt::Write as _;

use crate::error::{Error, Result};

/// Groups nested deeper than this are refused (an untrusted grammar bounds no recursion).
const MAX_DEPTH: usize = 64;

/// The Lark grammar of the GBNF grammar `text`, whose `root` is its start.
pub fn to_lark(text: &str) -> Result<String> {
    let chars: Vec<char> = strip_comments(text).chars().collect();
    let mut p = Parser { c: &chars, i: 0 };
    let mut out = String::new();
    let mut names = Vec::new();
    p.skip();
    while p.i < chars.len() {
        let name = p.name().ok_or_else(|| p.error("a rule name"))?;
        p.skip();
        if !p.eat("::=") {
            return Err(p.error("`::=` after the rule's name"));
        }
        let body = p.alternatives(0)?;
        let _ = writeln!(out, "{}: {body}", lark_name(&name));
        names.push(name);
        p.skip();
    }
    if !names.iter().any(|n| n == "root") {
        return Err(Error::param("grammar", "the GBNF grammar has no `root` rule"));
    }
    Ok(out)
}

/// The text without its `#` comments (outside literals and classes).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_lit, mut in_class, mut escaped, mut comment) = (false, false, false, false);
    for c in text.chars() {
        if comment {
            if c == '\n' {
                comment = false;
                out.push(c);
            }
            continue;
        }
        if escaped {
            escaped = false;
        } else if c == '\\' && (in_lit || in_class) {
            escaped = true;
        } else if c == '"' && !in_class {
            in_lit = !in_lit;
        } else if c == '[' && !in_lit {
            in_class = true;
        } else if c == ']' && in_class {
            in_class = false;
        } else if c == '#' && !in_lit && !in_class {
            comment = true;
            continue;
        }
        out.push(c);
    }
    out
}

/// A GBNF rule name as a Lark rule's (lower case): `root` is `start`; dashes and capitals spelled out.
fn lark_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    let mut out = String::from("g_");
    for c in name.chars() {
        match c {
            '-' => out.push_str("_d"),
            c if c.is_ascii_uppercase() => {
                out.push_str("_u");
                out.push(c.to_ascii_lowercase());
            }
            c => out.push(c),
        }
    }
    out
}

struct Parser<'a> {
    c: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn error(&self, wanted: &str) -> Error {
        let line = self.c[..self.i.min(self.c.len())].iter().filter(|&&c| c == '\n').count() + 1;
        Error::param("grammar", format!("GBNF, line {line}: expected {wanted}"))
    }

    fn skip(&mut self) {
        while self.c.get(self.i).is_some_and(|c| c.is_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        let here = self.c.get(self.i..self.i + n).is_some_and(|w| w.iter().copied().eq(s.chars()));
        if here {
            self.i += n;
        }
        here
    }

    fn name(&mut self) -> Option<String> {
        let start = self.i;
        while self.c.get(self.i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_') {
            self.i += 1;
        }
        (self.i > start).then(|| self.c[start..self.i].iter().collect())
    }

    /// Whether a rule's definition starts at the cursor (a name, then `::=`).
    fn at_rule(&self) -> bool {
        let mut j = self.i;
        while self.c.get(j).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_') {
            j += 1;
        }
        if j == self.i {
            return false;
        }
        while self.c.get(j).is_some_and(|c| c.is_whitespace()) {
            j += 1;
        }
        self.c.get(j..j + 3).is_some_and(|w| w == [':', ':', '='])
    }

    fn alternatives(&mut self, depth: usize) -> Result<String> {
        if depth > MAX_DEPTH {
            return Err(self.error(&format!("groups nested at most {MAX_DEPTH} deep")));
        }
        let mut alts = vec![self.sequence(depth)?];
        loop {
            self.skip();
            if !self.eat("|") {
                break;
            }
            alts.push(self.sequence(depth)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, depth: usize) -> Result<String> {
        let mut items = Vec::new();
        loop {
            self.skip();
            let item = match self.c.get(self.i) {
                None | Some('|') | Some(')') => break,
                Some(_) if self.at_rule() => break,
                Some('"') => {
                    self.i += 1;
                    let mut s = String::new();
                    while self.c.get(self.i) != Some(&'"') {
                        if self.i >= self.c.len() {
                            return Err(self.error("the literal's closing quote"));
                        }
                        s.push(self.char()?);
                    }
                    self.i += 1;
                    serde_json::to_string(&s)?.replace('\u{7f}', "\\u007f")
                }
                Some('[') => {
                    self.i += 1;
                    let mut class = String::from("/[");
                    if self.eat("^") {
                        class.push('^');
                    }
                    loop {
                        match self.c.get(self.i) {
                            None => return Err(self.error("the class's closing `]`")),
                            Some(']') => break,
                            _ => {}
                        }
                        let a = self.char()?;
                        let _ = write!(class, "\\x{{{:X}}}", a as u32);
                        if self.c.get(self.i) == Some(&'-') && self.c.get(self.i + 1).is_some_and(|c| *c != ']') {
                            self.i += 1;
                            let b = self.char()?;
                            let _ = write!(class, "-\\x{{{:X}}}", b as u32);
                        }
                    }
                    self.i += 1;
                    class.push_str("]/");
                    class
                }
                Some('.') => {
                    self.i += 1;
                    "/(?s:.)/".into()
                }
                Some('(') => {
                    self.i += 1;
                    let inner = self.alternatives(depth + 1)?;
                    self.skip();
                    if !self.eat(")") {
                        return Err(self.error("the group's closing `)`"));
                    }
                    format!("({inner})")
                }
                Some(c) if c.is_ascii_alphanumeric() || *c == '-' || *c == '_' => {
                    let name = self.name().ok_or_else(|| self.error("a rule name"))?;
                    lark_name(&name)
                }
                Some(c) => return Err(self.error(&format!("an item, not `{c}`"))),
            };
            let q = self.quantifier()?;
            items.push(format!("{item}{q}"));
        }
        Ok(if items.is_empty() { "\"\"".into() } else { items.join(" ") })
    }

    fn quantifier(&mut self) -> Result<String> {
        Ok(match self.c.get(self.i) {
            Some(q @ ('?' | '*' | '+')) => {
                self.i += 1;
                q.to_string()
            }
            Some('{') => {
                let close = self.c[self.i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| self.error("the repetition's closing `}`"))?;
                let inner: String = self.c[self.i + 1..self.i + close].iter().filter(|c| !c.is_whitespace()).collect();
                let valid = !inner.is_empty() && inner.chars().all(|c| c.is_ascii_digit() || c == ',') && {
                    let parts: Vec<&str> = inner.split(',').collect();
                    parts.len() <= 2 && !parts[0].is_empty()
                };
                if !valid {
                    return Err(self.error("a repetition `{m}`, `{m,}` or `{m,n}`"));
                }
                self.i += close + 1;
                format!("{{{inner}}}")
            }
            _ => String::new(),
        })
    }

    /// One character of a literal or a class, its escape read.
    fn char(&mut self) -> Result<char> {
        let c = *self.c.get(self.i).ok_or_else(|| self.error("a character"))?;
        self.i += 1;
        if c != '\\' {
            return Ok(c);
        }
        let e = *self.c.get(self.i).ok_or_else(|| self.error("an escape"))?;
        self.i += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char> {
            let s: String = p.c.get(p.i..p.i + n).ok_or_else(|| p.error("hex digits"))?.iter().collect();
            p.i += n;
            u32::from_str_radix(&s, 16).ok().and_then(char::from_u32).ok_or_else(|| p.error("a character's hex code"))
        };
        Ok(match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_over_lines_comments_and_names() {
        let g = to_lark("# a comment\nroot ::= item-list\n  | \"x#y\" # trailing\nitem-list ::= [a-z]{1,3} (\",\" Item)*\nItem ::= .\n").unwrap();
        assert_eq!(
            g,
            "start: g_item_dlist | \"x#y\"\ng_item_dlist: /[\\x{61}-\\x{7A}]/{1,3} (\",\" g__uitem)*\ng__uitem: /(?s:.)/\n"
        );
    }

    #[test]
    fn malformed_grammars_are_errors_naming_the_line() {
        for (bad, line) in [("root ::= \"a", 1), ("root ::= a\nb ::= [x", 2), ("root ::= x{a}", 1), ("a ::= \"x\"", 1)]
        {
            let e = to_lark(bad).unwrap_err().to_string();
            assert!(e.contains("grammar"), "{bad}: {e}");
            if !bad.starts_with("a ::=") {
                assert!(e.contains(&format!("line {line}")), "{bad}: {e}");
            }
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(200), ")".repeat(200));
        assert!(to_lark(&deep).is_err(), "nesting is bounded");
    }
}
