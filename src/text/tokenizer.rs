//! The tokenizer, built from GGUF metadata the way llama.cpp builds it (or from a `tokenizer.json`).
//!
//! Encoding has two stages, as in llama.cpp: first the text is partitioned around special tokens
//! (user-defined tokens always; control tokens only when `parse_special` is on, so text that comes from
//! users or tools can never produce `<|im_end|>`), then each plain fragment goes through the model:
//! byte-level BPE (the `tokenizers` crate, with the pre-tokenizer regexes llama.cpp uses for the file's
//! `tokenizer.ggml.pre`) or SentencePiece-style merging by score (`text::spm`).
//!
//! Every token also has its exact byte string (`token_bytes`), used for streaming decode and for the
//! grammar engine, which needs to know what bytes each token contributes.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::spm::Spm;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// GGUF `tokenizer.ggml.token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i64) -> Self {
        match v {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }
}

enum Engine {
    /// Byte-level BPE; the `tokenizers` pipeline holds only the model and pre-tokenizer: special tokens
    /// are handled by [`Tokenizer::encode`] itself.
    Bpe(Box<tokenizers::Tokenizer>),
    Spm(Box<Spm>),
    /// A user-supplied tokenizer.json, used as is.
    HfJson(Box<tokenizers::Tokenizer>),
}

/// A tokenizer with llama.cpp-compatible encoding and exact per-token bytes.
pub struct Tokenizer {
    engine: Engine,
    texts: Vec<String>,
    kinds: Vec<TokenKind>,
    bytes: Vec<Vec<u8>>,
    /// Control, unknown and user-defined tokens, longest text first (llama.cpp's partition order).
    specials: Vec<u32>,
    lookup: HashMap<String, u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

// llama.cpp's pre-tokenizer regexes (applied in order, each splitting the pieces of the previous one).
const GPT2_WORDS: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)";
/// GPT-4o's (o200k: Phi-4-mini, Llama 4), as its tokenizer.json writes it.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)";

fn pre_regexes(pre: &str) -> std::result::Result<&'static [&'static str], String> {
    Ok(match pre {
        "qwen2" | "deepseek-r1-qwen" => &[QWEN2],
        "llama3" | "llama-bpe" | "smaug-bpe" => &[LLAMA3],
        "gpt-4o" | "llama4" => &[GPT4O],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            &[r"\p{N}", GPT2_WORDS]
        }
        "gpt2" | "gpt-2" | "default" | "phi-2" | "jina-es" | "jina-de" => &[GPT2_WORDS],
        other => {
            return Err(format!(
                "`{other}` is not a supported BPE pre-tokenizer (supported: qwen2, llama3, gpt-4o, smollm, \
                 starcoder, gpt2, default)"
            ))
        }
    })
}

/// GPT-2's reversible byte ↔ printable-char table.
fn byte_level_decode_table() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    printable.into_iter().zip(chars).map(|(b, c)| (char::from_u32(c).expect("valid char"), b as u8)).collect()
}

fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let model = gguf.str("tokenizer.ggml.model")?.to_string();
        let (texts, kinds) = gguf_vocab(gguf)?;
        let opt_id = |key: &str| -> Result<Option<u32>> {
            match gguf.get(key) {
                None => Ok(None),
                Some(_) => match gguf.u64(key)? {
                    id if id < texts.len() as u64 => Ok(Some(id as u32)),
                    id => {
                        Err(meta_error(gguf, key, format!("is {id}, outside the vocabulary of {} tokens", texts.len())))
                    }
                },
            }
        };
        let bos = opt_id("tokenizer.ggml.bos_token_id")?;
        let eos = opt_id("tokenizer.ggml.eos_token_id")?;
        let unk = opt_id("tokenizer.ggml.unknown_token_id")?;
        let add_bos = gguf.bool_or("tokenizer.ggml.add_bos_token", model == "llama")?;
        let lookup: HashMap<String, u32> = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let (engine, bytes) = match model.as_str() {
            "gpt2" => gguf_bpe(gguf, &texts, &kinds)?,
            "llama" => gguf_spm(gguf, &texts, &kinds, lookup.clone(), unk)?,
            other => {
                let problem = format!("`{other}` is not supported (supported: gpt2, llama)");
                return Err(meta_error(gguf, "tokenizer.ggml.model", problem));
            }
        };
        let mut specials: Vec<u32> = (0..texts.len() as u32)
            .filter(|&i| {
                matches!(kinds[i as usize], TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown)
                    && !texts[i as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));
        Ok(Self { engine, texts, kinds, bytes, specials, lookup, bos, eos, add_bos })
    }

    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_json_file(path: &Path) -> Result<Self> {
        let tok = tokenizers::Tokenizer::from_file(path)
            .map_err(|source| Error::Tokenizer { context: path.display().to_string(), source })?;
        let size = tok.get_vocab_size(true);
        let added = tok.get_added_tokens_decoder();
        let mut texts = vec![String::new(); size];
        for (t, id) in tok.get_vocab(true) {
            if let Some(slot) = texts.get_mut(id as usize) {
                *slot = t;
            }
        }
        let byte_level = texts.iter().any(|t| t.starts_with('\u{120}'));
        let table = byte_level_decode_table();
        let mut kinds = vec![TokenKind::Normal; size];
        let mut bytes = Vec::with_capacity(size);
        for (i, t) in texts.iter().enumerate() {
            if let Some(a) = added.get(&(i as u32)) {
                kinds[i] = if a.special { TokenKind::Control } else { TokenKind::UserDefined };
                bytes.push(t.as_bytes().to_vec());
            } else if let Some(b) = parse_byte_token(t) {
                kinds[i] = TokenKind::Byte;
                bytes.push(vec![b]);
            } else if byte_level {
                bytes.push(t.chars().map(|c| table.get(&c).copied().unwrap_or(b'?')).collect());
            } else {
                bytes.push(t.replace('\u{2581}', " ").into_bytes());
            }
        }
        let lookup = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        Ok(Self {
            engine: Engine::HfJson(Box::new(tok)),
            texts,
            kinds,
            bytes,
            specials: Vec::new(),
            lookup,
            bos: None,
            eos: None,
            add_bos: false,
        })
    }

    /// Number of token ids (the logits width).
    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token from the metadata.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether raw (non-chat) prompts should start with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The id of a token given its exact text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup.get(text).copied()
    }

    /// The vocabulary text of a token.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The kind of a token.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The exact bytes a token stands for (its text for special tokens).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether a token is a control/special token (not plain text).
    pub fn is_special(&self, id: u32) -> bool {
        matches!(self.token_kind(id), Some(TokenKind::Control | TokenKind::Unknown | TokenKind::Unused))
    }

    /// Encodes text. With `parse_special`, control-token texts such as `<|im_start|>` become their ids;
    /// without it they are tokenized as ordinary text. User-defined tokens are always matched, as in
    /// llama.cpp. No BOS is added.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        if let Engine::HfJson(tok) = &self.engine {
            let mut tok = (**tok).clone();
            tok.set_encode_special_tokens(!parse_special);
            let enc = tok.encode(text, false).map_err(encode_error)?;
            return Ok(enc.get_ids().to_vec());
        }
        let mut out = Vec::new();
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(s) => self.encode_text(s, &mut out)?,
            }
        }
        Ok(out)
    }

    /// Encodes a text made of spans, each with its own special-token parsing (a chat template's own text
    /// with it on, a message's content with it off), as one text: each span's special tokens are found
    /// in that span alone, and the text between special tokens is encoded across span boundaries, as
    /// the whole rendered text is (a span boundary inside `: {"` splits no token).
    pub fn encode_spans(&self, spans: &[(&str, bool)]) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if let Engine::HfJson(_) = &self.engine {
            for (text, parse_special) in spans {
                out.extend(self.encode(text, *parse_special)?);
            }
            return Ok(out);
        }
        let mut run = String::new();
        for (text, parse_special) in spans {
            for frag in self.partition(text, *parse_special) {
                match frag {
                    Fragment::Token(id) => {
                        self.encode_text(&run, &mut out)?;
                        run.clear();
                        out.push(id);
                    }
                    Fragment::Text(s) => run.push_str(s),
                }
            }
        }
        self.encode_text(&run, &mut out)?;
        Ok(out)
    }

    /// Encodes text that holds no special token (the text between them).
    fn encode_text(&self, s: &str, out: &mut Vec<u32>) -> Result<()> {
        if s.is_empty() {
            return Ok(());
        }
        match &self.engine {
            Engine::Bpe(tok) => {
                let enc = tok.encode(s, false).map_err(encode_error)?;
                out.extend_from_slice(enc.get_ids());
            }
            Engine::Spm(spm) => spm.encode(s, out),
            Engine::HfJson(_) => unreachable!("tokenizer.json texts are encoded whole"),
        }
        Ok(())
    }

    /// Splits text around special tokens, longest token first, as llama.cpp's `tokenizer_st_partition`.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.specials {
            let kind = self.kinds[id as usize];
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            let needle = self.texts[id as usize].as_str();
            if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(needle))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(mut t) => {
                        while let Some(pos) = t.find(needle) {
                            if pos > 0 {
                                next.push(Fragment::Text(&t[..pos]));
                            }
                            next.push(Fragment::Token(id));
                            t = &t[pos + needle.len()..];
                        }
                        if !t.is_empty() {
                            next.push(Fragment::Text(t));
                        }
                    }
                    tok => next.push(tok),
                }
            }
            frags = next;
        }
        frags
    }

    /// Decodes ids to text. Special tokens are rendered as their text only when `special` is set.
    /// Invalid UTF-8 (a character split across the end) is replaced.
    pub fn decode(&self, ids: &[u32], special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            if id as usize >= self.texts.len() {
                return Err(Error::TokenOutOfRange { id, vocab_size: self.texts.len() });
            }
            if !special && self.is_special(id) {
                continue;
            }
            bytes.extend_from_slice(self.token_bytes(id));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn encode_error(source: tokenizers::Error) -> Error {
    Error::Tokenizer { context: "encoding".into(), source }
}

fn meta_error(gguf: &GgufFile, key: &str, problem: String) -> Error {
    Error::Metadata { path: gguf.path().into(), key: key.into(), problem }
}

/// The token texts and kinds (`tokenizer.ggml.tokens`, `token_type`), checked to be as long as each other.
fn gguf_vocab(gguf: &GgufFile) -> Result<(Vec<String>, Vec<TokenKind>)> {
    let texts: Vec<String> = gguf.str_array("tokenizer.ggml.tokens")?.into_iter().map(String::from).collect();
    if texts.is_empty() {
        return Err(meta_error(gguf, "tokenizer.ggml.tokens", "is empty".into()));
    }
    let kinds: Vec<TokenKind> = if gguf.get("tokenizer.ggml.token_type").is_some() {
        gguf.i64_array("tokenizer.ggml.token_type")?.into_iter().map(TokenKind::from_gguf).collect()
    } else {
        vec![TokenKind::Normal; texts.len()]
    };
    if kinds.len() != texts.len() {
        let problem = format!("has {} entries for {} tokens", kinds.len(), texts.len());
        return Err(meta_error(gguf, "tokenizer.ggml.token_type", problem));
    }
    Ok((texts, kinds))
}

/// A byte-level BPE (`tokenizer.ggml.model = gpt2`): merges and pre-tokenizer from the metadata, and each
/// token's bytes through GPT-2's byte ↔ character table.
fn gguf_bpe(gguf: &GgufFile, texts: &[String], kinds: &[TokenKind]) -> Result<(Engine, Vec<Vec<u8>>)> {
    let pre = gguf.str_opt("tokenizer.ggml.pre")?.unwrap_or("default").to_string();
    let merges: Vec<(String, String)> = gguf
        .str_array("tokenizer.ggml.merges")?
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| {
                meta_error(gguf, "tokenizer.ggml.merges", format!("entry {i} `{m}` has no space separator"))
            })
        })
        .collect::<Result<_>>()?;
    let regexes = pre_regexes(&pre).map_err(|e| meta_error(gguf, "tokenizer.ggml.pre", e))?;
    let bpe = build_bpe(texts, merges, regexes).map_err(|e| match e {
        Error::Tokenizer { context, source } => {
            meta_error(gguf, "tokenizer.ggml.merges", format!("{context}: {source}"))
        }
        e => e,
    })?;
    let table = byte_level_decode_table();
    let bytes = texts
        .iter()
        .zip(kinds)
        .map(|(t, k)| match k {
            TokenKind::Normal | TokenKind::Byte => t.chars().map(|c| table.get(&c).copied().unwrap_or(b'?')).collect(),
            _ => t.as_bytes().to_vec(),
        })
        .collect();
    Ok((Engine::Bpe(Box::new(bpe)), bytes))
}

/// A SentencePiece unigram vocabulary (`tokenizer.ggml.model = llama`): scores, `<0xXX>` byte tokens and
/// `▁` for spaces.
fn gguf_spm(
    gguf: &GgufFile,
    texts: &[String],
    kinds: &[TokenKind],
    lookup: HashMap<String, u32>,
    unk: Option<u32>,
) -> Result<(Engine, Vec<Vec<u8>>)> {
    let scores = if gguf.get("tokenizer.ggml.scores").is_some() {
        gguf.f32_array("tokenizer.ggml.scores")?
    } else {
        vec![0.0; texts.len()]
    };
    if scores.len() != texts.len() {
        let problem = format!("has {} entries for {} tokens", scores.len(), texts.len());
        return Err(meta_error(gguf, "tokenizer.ggml.scores", problem));
    }
    let mut byte_tokens = [None; 256];
    for (i, (t, k)) in texts.iter().zip(kinds).enumerate() {
        if *k == TokenKind::Byte {
            if let Some(b) = parse_byte_token(t) {
                byte_tokens[b as usize] = Some(i as u32);
            }
        }
    }
    let bytes = texts
        .iter()
        .zip(kinds)
        .map(|(t, k)| match k {
            TokenKind::Byte => parse_byte_token(t).map(|b| vec![b]).unwrap_or_default(),
            TokenKind::Normal => t.replace('\u{2581}', " ").into_bytes(),
            _ => t.as_bytes().to_vec(),
        })
        .collect();
    Ok((Engine::Spm(Box::new(Spm { lookup, scores, byte_tokens, unk })), bytes))
}

enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

fn build_bpe(texts: &[String], merges: Vec<(String, String)>, pre: &[&str]) -> Result<tokenizers::Tokenizer> {
    let vocab: tokenizers::models::bpe::Vocab = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|source| Error::Tokenizer { context: "building the BPE model".into(), source })?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in pre {
        let split = Split::new(SplitPattern::Regex((*re).to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|source| Error::Tokenizer { context: "pre-tokenizer regex".into(), source })?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tok)
}

/// Incremental decoder for streaming: feeds token bytes and yields only complete UTF-8 text.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds a token's bytes and returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // An invalid sequence (not just an incomplete tail) is flushed lossily so nothing stalls.
                let cut = if e.error_len().is_some() { self.pending.len() } else { valid };
                let out = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
                self.pending.drain(..cut);
                out
            }
        }
    }

    /// Flushes whatever is left (lossily).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod pre_tokenizer_tests {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    use super::*;

    /// The pieces `pre`'s regexes split `text` into.
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let mut s = PreTokenizedString::from(text);
        for re in pre_regexes(pre).unwrap() {
            let split =
                Split::new(SplitPattern::Regex((*re).to_string()), SplitDelimiterBehavior::Isolated, false).unwrap();
            split.pre_tokenize(&mut s).unwrap();
        }
        s.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(p, _, _)| p.to_string()).collect()
    }

    #[test]
    fn gpt4o_splits_case_runs_contractions_and_digit_triples() {
        // As Python's `regex` module splits it with the same pattern.
        let want = ["Hello", "World's", " CAT'S", " ", "123", "456", "7", " naïve", " ", " x", "\n\n", "/path", " ok"];
        assert_eq!(pieces("gpt-4o", "HelloWorld's CAT'S 1234567 naïve  x\n\n/path ok"), want);
    }
}
