//! Grammar-constrained decoding with llguidance.
//!
//! [`GrammarEngine`] is built once per tokenizer (it scans the whole vocabulary: ~0.5 s on Qwen's 152k
//! tokens) and shared; [`Constraint`] is one llguidance `Matcher` per generation. The generation loop
//! (`decode::generate`) drives it the way llguidance's own examples do: fast-forward forced tokens →
//! compute the mask → apply it to the logits → sample → consume.
//!
//! The token environment is reagent's own tokenizer: llguidance sees each token's exact bytes, control
//! tokens as `0xFF` + their text (so grammar text can never produce them), and reagent's llama.cpp-exact
//! encoder for the forced-text tokenization.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::error::{Error, Result};
use crate::text::tokenizer::{TokenKind, Tokenizer};

/// What a generation is constrained to.
#[derive(Debug, Clone)]
pub enum Grammar {
    /// A JSON schema (llguidance's supported subset; `x-guidance` options allowed at the root).
    JsonSchema(serde_json::Value),
    /// A Lark grammar (llguidance's dialect, with `%json { … }` for inline schemas).
    Lark(String),
    /// A regular expression the whole output must match (Rust regex syntax).
    Regex(String),
}

impl Grammar {
    fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            Grammar::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }

    /// What kind of grammar it is, for messages: `JSON schema`, `Lark grammar`, `regex`.
    /// What commonly makes a grammar of this kind match nothing, for its error.
    fn matches_nothing_hint(&self) -> &'static str {
        match self {
            Grammar::JsonSchema(_) => "a $ref cycle, an empty enum or anyOf?",
            Grammar::Lark(_) => "a rule that derives no text, an empty alternative?",
            Grammar::Regex(_) => "a character class that excludes every character?",
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonSchema(_) => "JSON schema",
            Grammar::Lark(_) => "Lark grammar",
            Grammar::Regex(_) => "regex",
        }
    }
}

/// llguidance's view of a reagent tokenizer.
struct TokenEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Forced text is grammar output, never a control token: encode with special parsing off. Bytes that
        // are not UTF-8 (a split character) fall back to the trie's greedy tokenization.
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// The longest run of ASCII digits constrained output may hold. A small model can run a number on
/// ("100000000000000.000000000…", a digit repeated) until the token limit cuts the output off, invalid;
/// past this run a digit is allowed only where the grammar allows nothing else. Twenty-four digits are
/// more than any integer a double holds exactly and any card, phone or account number.
pub const MAX_DIGIT_RUN: usize = 24;

/// The shared, per-tokenizer part of constrained decoding.
pub struct GrammarEngine {
    factory: Arc<ParserFactory>,
    vocab: usize,
    digits: Arc<DigitTable>,
    closers: Arc<Closers>,
}

/// Tokens that close what is open rather than add to it. Near the token limit constrained output is
/// steered to them ([`Constraint::prefer_closing`]).
#[derive(Debug, Default)]
struct Closers {
    /// Stop tokens and closing tags (`</tool_call>`): they end the output or a block.
    ends: Vec<u32>,
    /// Quotes, brackets and braces (with whitespace around) that start with a quote: inside a string,
    /// only these close it (a `}` there is text).
    quote_led: Vec<u32>,
    /// The other brackets and braces.
    brackets: Vec<u32>,
    /// Single letters that no JSON literal or number starts with: where the grammar allows one, the
    /// output is inside a string (or free text).
    letters: Vec<u32>,
}

impl Closers {
    fn new(words: &[Vec<u8>], stops: &[u32]) -> Self {
        let mut c = Closers::default();
        for (t, w) in words.iter().enumerate() {
            let t = t as u32;
            match w.split_first() {
                Some((&TokTrie::SPECIAL_TOKEN_MARKER, text)) if text.starts_with(b"</") => c.ends.push(t),
                Some((&TokTrie::SPECIAL_TOKEN_MARKER, _)) => {}
                _ if matches!(w.as_slice(), [b'q' | b'x' | b'z' | b'j' | b'k' | b'w']) => c.letters.push(t),
                _ if w.iter().any(|b| matches!(b, b'"' | b'}' | b']'))
                    && w.iter().all(|b| matches!(b, b'"' | b'}' | b']') || b.is_ascii_whitespace()) =>
                {
                    match w.iter().find(|b| !b.is_ascii_whitespace()) {
                        Some(b'"') => c.quote_led.push(t),
                        _ => c.brackets.push(t),
                    }
                }
                _ => {}
            }
        }
        c.ends.extend(stops.iter().filter(|&&t| (t as usize) < words.len()));
        c.ends.sort_unstable();
        c.ends.dedup();
        c
    }
}

/// Each token's digits at its two ends, to follow the run of digits at the end of the output.
#[derive(Debug, Default)]
struct DigitTable {
    /// Per token: its leading digits, its trailing digits, and whether it is all digits.
    ends: Vec<(u8, u8, bool)>,
    /// Tokens that start with a digit.
    starters: Vec<u32>,
    /// The most leading digits of any token.
    max_lead: usize,
}

impl DigitTable {
    fn new(words: &[Vec<u8>]) -> Self {
        let digits = |it: &mut dyn Iterator<Item = &u8>| it.take_while(|b| b.is_ascii_digit()).count().min(255) as u8;
        let mut table = DigitTable::default();
        for (id, w) in words.iter().enumerate() {
            let lead = digits(&mut w.iter());
            let all = !w.is_empty() && lead as usize == w.len();
            let trail = if all { lead } else { digits(&mut w.iter().rev()) };
            table.ends.push((lead, trail, all));
            if lead > 0 {
                table.starters.push(id as u32);
                table.max_lead = table.max_lead.max(lead as usize);
            }
        }
        table
    }

    /// The run of digits at the end of the output once `token` follows a run of `run`.
    fn after(&self, run: usize, token: u32) -> usize {
        match self.ends.get(token as usize) {
            Some(&(lead, _, true)) => run + lead as usize,
            Some(&(_, trail, false)) => trail as usize,
            None => 0,
        }
    }
}

impl std::fmt::Debug for GrammarEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEngine").field("vocab", &self.vocab).finish()
    }
}

impl GrammarEngine {
    /// Builds the token trie and parser factory for `tokenizer`, whose logits are `vocab` wide (at least the
    /// tokenizer's size; extra ids are never allowed). `stop_tokens` end a generation when the grammar
    /// accepts.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize, stop_tokens: &[u32]) -> Result<Self> {
        let n = tokenizer.vocab_size();
        if vocab < n {
            return Err(Error::Constraint {
                problem: format!("logits width {vocab} is smaller than the vocabulary ({n})"),
            });
        }
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(vocab);
        for id in 0..n as u32 {
            let bytes = tokenizer.token_bytes(id);
            words.push(match tokenizer.token_kind(id) {
                Some(TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.token_text(id).unwrap_or("").as_bytes());
                    w
                }
                Some(TokenKind::Unused) => Vec::new(),
                _ => bytes.to_vec(),
            });
        }
        words.resize(vocab, Vec::new());
        let digits = Arc::new(DigitTable::new(&words));
        let stops: Vec<u32> = stop_tokens.iter().copied().filter(|&t| (t as usize) < vocab).collect();
        let closers = Arc::new(Closers::new(&words, &stops));
        let eos = stops.first().copied().or(tokenizer.eos()).ok_or_else(|| Error::Constraint {
            problem: "the model has no end-of-sequence token to end constrained output".into(),
        })?;
        let mut info = TokRxInfo::new(vocab as u32, eos);
        info.tok_bos = tokenizer.bos();
        let mut trie = TokTrie::from(&info, &words);
        if !stops.is_empty() {
            trie = trie.with_eos_tokens(&stops);
        }
        let env: llguidance::toktrie::TokEnv = Arc::new(TokenEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Matcher(e.into()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits { verbose_errors: false, ..ParserLimits::default() };
        Ok(Self { factory: Arc::new(factory), vocab, digits, closers })
    }

    /// Compiles `grammar` into a fresh matcher. Invalid or unsupported grammars fail here, before any
    /// token is generated, with llguidance's message naming the offending part.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        let what = grammar.kind();
        // llguidance writes a regex into a Lark literal (`/…/`), where a trailing backslash would escape the
        // closing slash and change the pattern: check the syntax first.
        if let Grammar::Regex(r) = grammar {
            regex::Regex::new(r).map_err(|e| Error::grammar("regex", e))?;
        }
        // A schema whose every instance is infinite would never let generation end.
        if let Grammar::JsonSchema(s) = grammar {
            if let Some(why) = super::finite::no_finite_instance(s) {
                return Err(Error::grammar(what, why));
            }
        }
        // Deeply nested grammars recurse in the compiler: a big stack, not an abort.
        let (matcher, first, first_time) = crate::limits::on_big_stack(|| {
            let parser = self
                .factory
                .create_parser(grammar.to_llguidance())
                .map_err(|e| Error::grammar(what, crate::error::one_line(&format!("{e:#}"))))?;
            let mut matcher = Matcher::new(Ok(parser));
            if let Some(e) = matcher.get_error() {
                return Err(Error::grammar(what, crate::error::one_line(&e.to_string())));
            }
            // The first mask surfaces lexer/parser complexity errors now rather than mid-generation.
            let t = Instant::now();
            let first = matcher.compute_mask().map_err(|e| {
                let message = format!("{e:#}");
                // llguidance's name for "the parser allows no byte": at the start, the grammar matches nothing.
                match message.contains("NoExtensionBias") {
                    true => {
                        Error::grammar(what, format!("it matches no text at all ({})", grammar.matches_nothing_hint()))
                    }
                    false => Error::grammar(what, crate::error::one_line(&message)),
                }
            })?;
            Ok((matcher, first, t.elapsed()))
        })?;
        let mut stats = ConstraintStats::default();
        stats.mask_times.push(first_time);
        Ok(Constraint {
            matcher,
            pending_mask: Some(first),
            vocab: self.vocab,
            stats,
            branches: Vec::new(),
            last: None,
            digits: self.digits.clone(),
            runs: Vec::new(),
            chosen: false,
            closers: self.closers.clone(),
        })
    }
}

/// Per-generation statistics of constrained decoding.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ConstraintStats {
    /// Time of each mask computation.
    pub mask_times: Vec<Duration>,
    /// Tokens the grammar forced (appended without sampling).
    pub forced_tokens: usize,
    /// Tokens sampled under a mask.
    pub sampled_tokens: usize,
    /// Every place a [`BranchBias`] applied, in order.
    pub branch_margins: Vec<BranchMargin>,
}

/// Where a [`BranchBias`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchPoint {
    /// Before the first token.
    Start,
    /// Right after this token (sampled or forced).
    After(u32),
    /// Anywhere (with [`BranchBias::against`], wherever the model's best allowed token is on one of the two
    /// sides).
    Anywhere,
    /// At the first token the model chooses: the first one sampled (tokens the grammar forced before it are
    /// no choice), as a ReAct decision's `type` after an empty thought.
    FirstChoice,
}

/// A bias added to the logits of the tokens that start one side of a branch of the grammar (call a tool
/// or answer; one more call or stop): the model's choice there is then taken against a threshold set by
/// measurement, rather than by the raw argmax.
///
/// Under greedy decoding the biased side wins exactly when its margin (the best allowed logit among
/// `tokens` minus the best allowed logit outside them) exceeds `-bias`. The margins are recorded
/// ([`ConstraintStats::branch_margins`]), so thresholds can be tuned offline from one run made with a
/// large bias. A point where only one side is allowed is not a branch and is skipped.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BranchBias {
    /// What the choice is (`call`, `stop`, …): copied into the recorded margins.
    pub label: &'static str,
    pub at: BranchPoint,
    pub tokens: Vec<u32>,
    /// When set, the other side: the bias applies only where the model's best allowed token is in `tokens`
    /// or in this set, and then decides between the two sides (a closing bracket against a comma where a
    /// value ends, not inside a number or a string that goes on).
    pub against: Option<Vec<u32>>,
    pub bias: f32,
    /// A further condition on the tokens the grammar allows here (inside a JSON string, where a lone
    /// closing quote is allowed, or outside one).
    pub when: Allowed,
}

impl BranchBias {
    /// `bias` on the tokens `tokens` at `at` (one-sided, wherever the grammar allows them); `label` names the
    /// choice in the recorded margins.
    pub fn new(label: &'static str, at: BranchPoint, tokens: Vec<u32>, bias: f32) -> Self {
        Self { label, at, tokens, against: None, bias, when: Allowed::Always }
    }
    /// Decides between `tokens` and these (see [`against`](Self::against)).
    #[must_use]
    pub fn against(mut self, other: Vec<u32>) -> Self {
        self.against = Some(other);
        self
    }
    /// Applies only where the allowed tokens meet `when`.
    #[must_use]
    pub fn when(mut self, when: Allowed) -> Self {
        self.when = when;
        self
    }
}

/// A condition on the tokens the grammar allows at a point, for a [`BranchBias`] to apply there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Allowed {
    #[default]
    Always,
    /// One of these tokens is allowed.
    AnyOf(Vec<u32>),
    /// None of these tokens is allowed.
    NoneOf(Vec<u32>),
    /// Every allowed token is one of these (sorted): the point offers this choice and nothing else.
    Within(Vec<u32>),
}

impl Allowed {
    fn holds(&self, logits: &[f32]) -> bool {
        let any = |set: &[u32]| set.iter().any(|&t| logits.get(t as usize).is_some_and(|&l| l > f32::NEG_INFINITY));
        match self {
            Allowed::Always => true,
            Allowed::AnyOf(set) => any(set),
            Allowed::NoneOf(set) => !any(set),
            // Most points allow a token outside the set early in the vocabulary: the scan stops there.
            Allowed::Within(set) => logits
                .iter()
                .enumerate()
                .all(|(i, &l)| l == f32::NEG_INFINITY || set.binary_search(&(i as u32)).is_ok()),
        }
    }
}

/// One application of a [`BranchBias`]: its label and the margin before the bias.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct BranchMargin {
    pub label: &'static str,
    pub margin: f32,
}

impl ConstraintStats {
    /// Mean, median and 99th percentile of the mask times.
    pub fn mask_summary(&self) -> (Duration, Duration, Duration) {
        if self.mask_times.is_empty() {
            return (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        }
        let mut v = self.mask_times.clone();
        v.sort_unstable();
        let mean = v.iter().sum::<Duration>() / v.len() as u32;
        let pct = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        (mean, pct(0.5), pct(0.99))
    }

    /// Forced tokens as a share of all generated tokens.
    pub fn forced_share(&self) -> f64 {
        let total = self.forced_tokens + self.sampled_tokens;
        if total == 0 {
            0.0
        } else {
            self.forced_tokens as f64 / total as f64
        }
    }
}

/// One generation's grammar state.
pub struct Constraint {
    matcher: Matcher,
    pending_mask: Option<SimpleVob>,
    vocab: usize,
    stats: ConstraintStats,
    branches: Vec<BranchBias>,
    /// The last token consumed (for [`BranchPoint`]s).
    last: Option<u32>,
    digits: Arc<DigitTable>,
    /// One entry per token consumed so far (their count places [`BranchPoint::Start`]): the run of digits
    /// at the end of the output after it (see [`MAX_DIGIT_RUN`]).
    runs: Vec<usize>,
    closers: Arc<Closers>,
    /// A token has been chosen (the model's first choice is behind: [`BranchPoint::FirstChoice`]).
    chosen: bool,
}

impl Constraint {
    /// Adds branch biases (see [`BranchBias`]).
    pub fn with_branches(mut self, branches: Vec<BranchBias>) -> Self {
        self.branches = branches;
        self
    }

    /// Tokens the grammar forces next (possibly none); consumes them.
    pub fn forced_tokens(&mut self) -> Result<Vec<u32>> {
        if self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        let ff = self.matcher.consume_ff_tokens();
        self.check()?;
        ff.iter().for_each(|&t| self.push_run(t));
        if let Some(&t) = ff.last() {
            self.pending_mask = None;
            self.stats.forced_tokens += ff.len();
            self.last = Some(t);
        }
        Ok(ff)
    }

    /// Whether the grammar can take no more tokens (it forced the end, or consumed a stop token).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a complete match.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Sets every logit the grammar forbids to `-inf`.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = match self.pending_mask.take() {
            Some(m) => m,
            None => {
                let t = Instant::now();
                let m = self.matcher.compute_mask().map_err(|e| Error::Matcher(e.into()))?;
                self.stats.mask_times.push(t.elapsed());
                m
            }
        };
        let n = self.vocab.min(logits.len());
        apply_mask(&mask, &mut logits[..n]);
        self.cap_digit_run(logits);
        self.apply_branches(logits);
        Ok(())
    }

    fn apply_branches(&mut self, logits: &mut [f32]) {
        let first_choice = !std::mem::replace(&mut self.chosen, true);
        for b in &self.branches {
            let here = match b.at {
                BranchPoint::Start => self.runs.is_empty(),
                BranchPoint::After(t) => self.last == Some(t),
                BranchPoint::Anywhere => true,
                BranchPoint::FirstChoice => first_choice,
            };
            if !here || !b.when.holds(logits) {
                continue;
            }
            if let Some(against) = &b.against {
                self.stats.branch_margins.extend(apply_two_sided(b, against, logits));
                continue;
            }
            let side = |i: usize| b.tokens.contains(&(i as u32));
            let (mut inside, mut outside) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for (i, &l) in logits.iter().enumerate() {
                if l > f32::NEG_INFINITY {
                    if side(i) {
                        inside = inside.max(l);
                    } else {
                        outside = outside.max(l);
                    }
                }
            }
            if inside == f32::NEG_INFINITY || outside == f32::NEG_INFINITY {
                continue; // one side only: not a branch here
            }
            self.stats.branch_margins.push(BranchMargin { label: b.label, margin: inside - outside });
            for &t in &b.tokens {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l += b.bias;
                }
            }
        }
    }

    /// Advances the grammar by a sampled token (one the mask allowed).
    pub fn consume(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(|e| Error::Matcher(e.into()))?;
        self.stats.sampled_tokens += 1;
        self.push_run(token);
        self.last = Some(token);
        Ok(())
    }

    /// Consumes as many of `tokens` as the grammar allows, in order; returns how many it took.
    pub fn consume_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
        self.pending_mask = None;
        let n = self.matcher.try_consume_tokens(tokens).map_err(|e| Error::Matcher(e.into()))?;
        tokens[..n].iter().for_each(|&t| self.push_run(t));
        if n > 0 {
            self.last = Some(tokens[n - 1]);
        }
        Ok(n)
    }

    /// How many of `tokens`, in order, the grammar would take from here (nothing is consumed): the part of
    /// a speculative draft worth running through the model.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let n = tokens.iter().take_while(|&&t| (t as usize) < self.vocab).count();
        if n == 0 || self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(&tokens[..n]).unwrap_or(0)
    }

    /// Undoes the last `n` tokens (sampled or forced).
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        self.pending_mask = None;
        self.runs.truncate(self.runs.len().saturating_sub(n));
        self.last = None; // not known without the history; a rolled-back branch point is not re-biased
        self.matcher.rollback(n).map_err(|e| Error::Matcher(e.into()))
    }

    fn push_run(&mut self, token: u32) {
        let run = self.digits.after(self.runs.last().copied().unwrap_or(0), token);
        self.runs.push(run);
    }

    /// Forbids the digits that would take the output's run of digits past [`MAX_DIGIT_RUN`], unless the
    /// grammar allows nothing else.
    fn cap_digit_run(&self, logits: &mut [f32]) {
        let run = self.runs.last().copied().unwrap_or(0);
        if run + self.digits.max_lead <= MAX_DIGIT_RUN {
            return;
        }
        let mut removed = Vec::new();
        for &t in &self.digits.starters {
            let lead = self.digits.ends[t as usize].0 as usize;
            match logits.get_mut(t as usize) {
                Some(l) if *l > f32::NEG_INFINITY && run + lead > MAX_DIGIT_RUN => {
                    removed.push((t, *l));
                    *l = f32::NEG_INFINITY;
                }
                _ => {}
            }
        }
        if !removed.is_empty() && logits.iter().all(|&l| l == f32::NEG_INFINITY) {
            removed.into_iter().for_each(|(t, l)| logits[t as usize] = l);
        }
    }

    /// Near the token limit: where the grammar allows a token that closes what is open, only those stay
    /// allowed, so that output a model runs on ("1, 2, 3, …" in an answer) ends valid within the limit
    /// instead of being cut off: a stop token or closing tag where one is allowed (free text ends there);
    /// else, inside a string, a token that starts with its closing quote (a `}` there would be text);
    /// else a bracket or brace, else a quote. Elsewhere (inside a number, before a required field) the mask is
    /// left as it is. Call after [`Self::mask_logits`].
    pub fn prefer_closing(&self, logits: &mut [f32]) {
        let allowed = |ids: &[u32]| -> Vec<(u32, f32)> {
            ids.iter()
                .filter_map(|&t| logits.get(t as usize).map(|&l| (t, l)))
                .filter(|&(_, l)| l > f32::NEG_INFINITY)
                .collect()
        };
        let c = &self.closers;
        let mut kept = allowed(&c.ends);
        if kept.is_empty() {
            // Outside a string a quote opens one: a bracket closes, else (a string at its length limit or
            // the end of an enum's value, where no letter is allowed either) the quote.
            let in_string = !allowed(&c.letters).is_empty();
            kept = if in_string { allowed(&c.quote_led) } else { allowed(&c.brackets) };
            if kept.is_empty() && !in_string {
                kept = allowed(&c.quote_led);
            }
        }
        if kept.is_empty() {
            return;
        }
        logits.fill(f32::NEG_INFINITY);
        kept.into_iter().for_each(|(t, l)| logits[t as usize] = l);
    }

    /// The statistics so far.
    pub fn stats(&self) -> &ConstraintStats {
        &self.stats
    }

    fn check(&self) -> Result<()> {
        match self.matcher.get_error() {
            Some(e) => Err(Error::Matcher(e.into())),
            None => Ok(()),
        }
    }
}

/// A branch between `b.tokens` and `against` where other tokens are allowed too (a string may go on
/// where its closing quote could be followed by a comma or a bracket in one token): it applies only
/// when the model's best allowed token is on one of the two sides, and then the biased comparison of
/// the two sides picks the side that goes first: its tokens are raised together, so that the best of them
/// is on top and their order among themselves (a later branch between them) is kept.
fn apply_two_sided(b: &BranchBias, against: &[u32], logits: &mut [f32]) -> Option<BranchMargin> {
    let best = |set: &[u32]| {
        set.iter().filter_map(|&t| logits.get(t as usize).copied()).filter(|&l| l > f32::NEG_INFINITY).reduce(f32::max)
    };
    let (Some(inside), Some(outside)) = (best(&b.tokens), best(against)) else { return None };
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if inside < top && outside < top {
        return None; // the model goes on with something else (the value is not finished)
    }
    let (side, best) = if inside + b.bias > outside { (&b.tokens[..], inside) } else { (against, outside) };
    let raise = top + 1.0 - best;
    for &t in side {
        if let Some(l) = logits.get_mut(t as usize).filter(|l| **l > f32::NEG_INFINITY) {
            *l += raise;
        }
    }
    Some(BranchMargin { label: b.label, margin: inside - outside })
}

/// Writes `-inf` into every logit whose bit is clear in `mask`, a word (32 tokens) at a time.
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let n = logits.len().min(mask.len());
    let words = &mask.as_slice()[..n.div_ceil(32)];
    for (&w, chunk) in words.iter().zip(logits[..n].chunks_mut(32)) {
        match w {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            _ => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if (w >> b) & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    logits[n..].fill(f32::NEG_INFINITY);
}
