//! A GBNF recognizer for the tests: whether a grammar in llama.cpp's format matches a whole text. It reads
//! what the GBNF writer emits (literals with escapes, classes with ranges, `.`, rule names, groups, `?`,
//! `*`, `+`, `{m}`, `{m,}`, `{m,n}`), and is written from llama.cpp's grammar README, not its code. Sets of
//! end positions, memoized by rule and start: no backtracking blow-up on the short texts tested.

use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Clone)]
enum Node {
    Lit(Vec<char>),
    Class { negated: bool, ranges: Vec<(char, char)> },
    Any,
    Ref(String),
    Group(Vec<Vec<Item>>),
}

#[derive(Debug, Clone)]
struct Item {
    node: Node,
    min: usize,
    max: Option<usize>,
}

/// End positions by rule and start.
type Memo = HashMap<(String, usize), BTreeSet<usize>>;

pub struct Gbnf {
    rules: HashMap<String, Vec<Vec<Item>>>,
}

impl Gbnf {
    /// Parses `text`; a panic names what it cannot read (the writer's output is under test).
    pub fn parse(text: &str) -> Self {
        let mut rules = HashMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')) {
            let (name, body) = line.split_once("::=").unwrap_or_else(|| panic!("not a rule: {line}"));
            let chars: Vec<char> = body.chars().collect();
            let mut p = Parser { c: &chars, i: 0 };
            let alts = p.alternatives();
            assert!(p.i == chars.len(), "unread at {} in {line}", p.i);
            rules.insert(name.trim().to_string(), alts);
        }
        for alts in rules.values() {
            for item in alts.iter().flatten() {
                check_refs(&item.node, &rules);
            }
        }
        assert!(rules.contains_key("root"), "no root rule");
        Self { rules }
    }

    /// Whether the whole of `text` is a match of `root`.
    pub fn accepts(&self, text: &str) -> bool {
        let t: Vec<char> = text.chars().collect();
        let mut memo = HashMap::new();
        self.rule("root", &t, 0, &mut memo).contains(&t.len())
    }

    fn rule(&self, name: &str, t: &[char], at: usize, memo: &mut Memo) -> BTreeSet<usize> {
        let key = (name.to_string(), at);
        if let Some(done) = memo.get(&key) {
            return done.clone();
        }
        memo.insert(key.clone(), BTreeSet::new());
        let ends = self.alternatives(&self.rules[name], t, at, memo);
        memo.insert(key, ends.clone());
        ends
    }

    fn alternatives(&self, alts: &[Vec<Item>], t: &[char], at: usize, memo: &mut Memo) -> BTreeSet<usize> {
        let mut ends = BTreeSet::new();
        for seq in alts {
            let mut here = BTreeSet::from([at]);
            for item in seq {
                let mut next = BTreeSet::new();
                for &p in &here {
                    next.extend(self.repeated(item, t, p, memo));
                }
                here = next;
                if here.is_empty() {
                    break;
                }
            }
            ends.extend(here);
        }
        ends
    }

    fn repeated(&self, item: &Item, t: &[char], at: usize, memo: &mut Memo) -> BTreeSet<usize> {
        let mut ends = BTreeSet::new();
        let mut frontier = BTreeSet::from([at]);
        let mut count = 0;
        loop {
            if count >= item.min {
                ends.extend(frontier.iter().copied());
            }
            if item.max.is_some_and(|m| count >= m) || frontier.is_empty() || count > t.len() + item.min {
                break;
            }
            let mut next = BTreeSet::new();
            for &p in &frontier {
                next.extend(self.once(&item.node, t, p, memo).into_iter().filter(|&e| e > p || count < item.min));
            }
            frontier = next;
            count += 1;
        }
        ends
    }

    fn once(&self, node: &Node, t: &[char], at: usize, memo: &mut Memo) -> BTreeSet<usize> {
        match node {
            Node::Lit(l) => match t.get(at..at + l.len()) {
                Some(s) if s == l.as_slice() => BTreeSet::from([at + l.len()]),
                _ => BTreeSet::new(),
            },
            Node::Class { negated, ranges } => match t.get(at) {
                Some(&c) if ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated => BTreeSet::from([at + 1]),
                _ => BTreeSet::new(),
            },
            Node::Any => match t.get(at) {
                Some(_) => BTreeSet::from([at + 1]),
                None => BTreeSet::new(),
            },
            Node::Ref(r) => self.rule(r, t, at, memo),
            Node::Group(alts) => self.alternatives(alts, t, at, memo),
        }
    }
}

fn check_refs(node: &Node, rules: &HashMap<String, Vec<Vec<Item>>>) {
    match node {
        Node::Ref(r) => assert!(rules.contains_key(r), "undefined rule {r}"),
        Node::Group(alts) => alts.iter().flatten().for_each(|i| check_refs(&i.node, rules)),
        _ => {}
    }
}

struct Parser<'a> {
    c: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn skip(&mut self) {
        while self.c.get(self.i).is_some_and(|c| c.is_whitespace()) {
            self.i += 1;
        }
    }

    fn alternatives(&mut self) -> Vec<Vec<Item>> {
        let mut alts = vec![self.sequence()];
        while self.c.get(self.i) == Some(&'|') {
            self.i += 1;
            alts.push(self.sequence());
        }
        alts
    }

    fn sequence(&mut self) -> Vec<Item> {
        let mut seq = Vec::new();
        loop {
            self.skip();
            let node = match self.c.get(self.i) {
                None | Some('|') | Some(')') => return seq,
                Some('"') => {
                    self.i += 1;
                    let mut lit = Vec::new();
                    while self.c[self.i] != '"' {
                        lit.push(self.char());
                    }
                    self.i += 1;
                    Node::Lit(lit)
                }
                Some('[') => {
                    self.i += 1;
                    let negated = self.c[self.i] == '^';
                    if negated {
                        self.i += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.c[self.i] != ']' {
                        let a = self.char();
                        let b = if self.c[self.i] == '-' && self.c[self.i + 1] != ']' {
                            self.i += 1;
                            self.char()
                        } else {
                            a
                        };
                        ranges.push((a, b));
                    }
                    self.i += 1;
                    Node::Class { negated, ranges }
                }
                Some('.') => {
                    self.i += 1;
                    Node::Any
                }
                Some('(') => {
                    self.i += 1;
                    let alts = self.alternatives();
                    assert_eq!(self.c.get(self.i), Some(&')'), "unclosed group");
                    self.i += 1;
                    Node::Group(alts)
                }
                Some(c) if c.is_ascii_alphanumeric() || *c == '-' => {
                    let start = self.i;
                    while self.c.get(self.i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '-') {
                        self.i += 1;
                    }
                    Node::Ref(self.c[start..self.i].iter().collect())
                }
                Some(c) => panic!("unexpected `{c}` at {}", self.i),
            };
            let (min, max) = self.quantifier();
            seq.push(Item { node, min, max });
        }
    }

    fn quantifier(&mut self) -> (usize, Option<usize>) {
        match self.c.get(self.i) {
            Some('?') => (self.bump(0), Some(1)),
            Some('*') => (self.bump(0), None),
            Some('+') => (self.bump(1), None),
            Some('{') => {
                let close = self.c[self.i..].iter().position(|&c| c == '}').expect("unclosed repeat") + self.i;
                let inner: String = self.c[self.i + 1..close].iter().collect();
                self.i = close + 1;
                let num = |s: &str| s.trim().parse::<usize>().expect("a repeat count");
                match inner.split_once(',') {
                    None => (num(&inner), Some(num(&inner))),
                    Some((m, n)) if n.trim().is_empty() => (num(m), None),
                    Some((m, n)) => (num(m), Some(num(n))),
                }
            }
            _ => (1, Some(1)),
        }
    }

    fn bump(&mut self, v: usize) -> usize {
        self.i += 1;
        v
    }

    /// One character of a literal or a class, escapes read.
    fn char(&mut self) -> char {
        let c = self.c[self.i];
        self.i += 1;
        if c != '\\' {
            return c;
        }
        let e = self.c[self.i];
        self.i += 1;
        let hex = |p: &mut Self, n: usize| {
            let s: String = p.c[p.i..p.i + n].iter().collect();
            p.i += n;
            char::from_u32(u32::from_str_radix(&s, 16).expect("hex")).expect("a char")
        };
        match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            other => other,
        }
    }
}
