//! A GGUF model ready to prompt: the network ([`Transformer`]) joined to its tokenizer, chat template and
//! stop tokens, all read from the same file.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::chat::{self, ChatTemplate};
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::{Arch, LanguageModel, LoadOptions, ModelInfo, Transformer};

/// A GGUF model loaded with everything needed to prompt it.
pub struct Model {
    lm: Transformer,
    tokenizer: Arc<Tokenizer>,
    chat: ChatTemplate,
    stop_tokens: Vec<u32>,
}

/// The largest chat template file read ([`LoadOptions::chat_template`]): templates are a few KB.
const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

impl Model {
    /// Loads a GGUF file: an unsupported architecture is reported first, then tokenizer errors, then
    /// weights.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Self> {
        let started = Instant::now();
        let path = path.as_ref();
        let mut g = GgufFile::open(path)?;
        let arch = Arch::of(&g)?;
        let tokenizer = match &opts.tokenizer_json {
            Some(p) => Tokenizer::from_json_file(p)?,
            None => Tokenizer::from_gguf(&g)?,
        };
        let lm = Transformer::load(&mut g, opts, started)?;
        let rows = lm.info().hparams.vocab;
        if rows < tokenizer.vocab_size() {
            return Err(Error::Tensor {
                path: path.to_path_buf(),
                tensor: "token_embd.weight".into(),
                reason: format!("{rows} rows, but the tokenizer has {} tokens", tokenizer.vocab_size()),
            });
        }
        let (template, origin) = match (&opts.chat_template, g.str_opt("tokenizer.chat_template")?) {
            (Some(p), _) => (crate::limits::read_input(p, MAX_TEMPLATE_BYTES)?, p.display().to_string()),
            (None, Some(t)) => (t.to_string(), path.display().to_string()),
            (None, None) => (chat::fallback_template(arch.as_str()).to_string(), path.display().to_string()),
        };
        let stop_tokens = chat::stop_tokens(&tokenizer, eot_of(&g));
        let chat = ChatTemplate::new(&template, &tokenizer)
            .map_err(|e| match e {
                Error::ChatTemplate { origin: None, problem, source } => {
                    Error::ChatTemplate { origin: Some(origin.clone()), problem, source }
                }
                e => e,
            })?
            .with_origin(origin);
        Ok(Self { lm, tokenizer: Arc::new(tokenizer), chat, stop_tokens })
    }

    /// The catalog entry of this file (found by its file name and size), whose settings the agent uses.
    pub fn catalog_entry(&self) -> Option<crate::catalog::CatalogEntry> {
        crate::catalog::entry_of_file(&self.info().path, self.info().file_bytes)
    }

    /// The KV cache's first `len` positions, to save ([`crate::model::prompt_cache`]).
    pub fn export_prefix(&self, len: usize) -> Option<crate::model::KvPrefix> {
        self.lm.export_prefix(len)
    }

    /// Replaces the KV cache with a saved prefix.
    pub fn import_prefix(&mut self, prefix: &crate::model::KvPrefix) -> Result<()> {
        self.lm.import_prefix(prefix)
    }

    /// The tokenizer (shared).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The chat template.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    /// Tokens that end a turn or the text (EOS, end-of-turn).
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop_tokens
    }

    /// Facts about the file and the load.
    pub fn info(&self) -> &ModelInfo {
        self.lm.info()
    }
}

impl LanguageModel for Model {
    fn vocab_size(&self) -> usize {
        self.lm.vocab_size()
    }
    fn context_length(&self) -> usize {
        self.lm.context_length()
    }
    fn cache_len(&self) -> usize {
        self.lm.cache_len()
    }
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        self.lm.forward(tokens, pos)
    }
    fn truncate(&mut self, len: usize) {
        self.lm.truncate(len)
    }
    fn forward_all(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        self.lm.forward_all(tokens, pos)
    }
    fn verify_batch(&self) -> usize {
        self.lm.verify_batch()
    }
}

/// The end-of-turn token a file names, if any.
fn eot_of(g: &GgufFile) -> Option<u32> {
    g.get("tokenizer.ggml.eot_token_id")?;
    g.u64("tokenizer.ggml.eot_token_id").ok().map(|id| id as u32)
}

/// The tokenizer, chat template and stop tokens of the GGUF file at `path`, read from its metadata (the
/// weights are not read): a model served elsewhere whose prompts are rendered here.
pub fn template_of_file(path: &Path) -> Result<(Tokenizer, ChatTemplate, Vec<u32>)> {
    let g = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(&g)?;
    let template = match g.str_opt("tokenizer.chat_template")? {
        Some(t) => t.to_string(),
        None => chat::fallback_template(Arch::of(&g)?.as_str()).to_string(),
    };
    let chat = ChatTemplate::new(&template, &tokenizer)?.with_origin(path.display().to_string());
    let stops = chat::stop_tokens(&tokenizer, eot_of(&g));
    Ok((tokenizer, chat, stops))
}
