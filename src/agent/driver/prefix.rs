//! The KV cache's prefix before a generation: what the cache shares with the prompt, a copy of a recent
//! conversation's KV ([`RecentPrefixes`]), or a prefix saved on disk ([`PromptCache`]); and what is kept
//! for later prompts.

use super::{DecisionRequest, ModelDriver};
use crate::agent::recent::RecentPrefixes;
use crate::model::prompt_cache::PromptCache;
use crate::model::LanguageModel;
use crate::text::chat::Role;

impl ModelDriver {
    /// Keeps a copy of the KV cache, up to `max_bytes` in all, when a prompt departs from it, and takes
    /// it back when a later prompt shares more of it than the cache does: conversations that take turns
    /// (a server's clients) are not computed again. `reagent serve` keeps 256 MiB.
    pub fn with_recent_prefixes(mut self, max_bytes: usize) -> Self {
        if self.model.export_prefix(0).is_some() {
            self.recent = Some(RecentPrefixes::new(max_bytes));
        }
        self
    }

    /// Readies the KV cache for `prompt`: keeps the prefix it shares with the cache, else a longer one
    /// from the recent conversations' copies or the prompt cache on disk. Returns the tokens of `prompt`
    /// now in the cache, and how many of them were loaded from disk. Generate after them, then say what
    /// the cache holds with [`set_cached`](Self::set_cached) (decisions do both themselves).
    pub fn prepare_prefix(&mut self, prompt: &[u32]) -> (usize, usize) {
        /// Copies of fewer diverging tokens than this are not worth their bytes.
        const MIN_KEPT: usize = 64;
        let reused =
            if self.reuse_prefix { self.cached.iter().zip(prompt).take_while(|(a, b)| a == b).count() } else { 0 };
        let in_cache = self.cached.len().min(self.model.cache_len());
        if let Some(recent) = self.recent.as_mut().filter(|_| self.reuse_prefix) {
            if in_cache >= reused + MIN_KEPT && recent.would_keep(in_cache) {
                if let Some(prefix) = self.model.export_prefix(in_cache) {
                    recent.remember(&self.cached[..in_cache], prefix);
                }
            }
        }
        // From here on the cache beyond `reused` is being overwritten: if generation fails midway, the
        // next call must not trust more than this prefix.
        self.cached.truncate(reused);
        self.model.truncate(reused);
        let mut reused = reused;
        if let Some(prefix) = self.recent.as_mut().filter(|_| self.reuse_prefix).and_then(|r| r.recall(prompt, reused))
        {
            if self.model.import_prefix(&prefix).is_ok() {
                reused = prefix.len;
                self.cached = prompt[..reused].to_vec();
            } else {
                // Whatever the failed import left is not trusted.
                reused = 0;
                self.cached.clear();
                self.model.truncate(0);
            }
        }
        let loaded = self.load_saved_prefix(prompt, reused);
        (reused.max(loaded), loaded)
    }

    /// Records that the KV cache holds `tokens` after a generation made outside a decision.
    pub fn set_cached(&mut self, mut tokens: Vec<u32>) {
        tokens.truncate(self.model.cache_len());
        self.cached = tokens;
    }

    /// Saves the KV of the system prompt (with the tools it describes) to disk after the first decision,
    /// and loads it, instead of computing it, in the next process's runs (`reagent run` does; `--no-prompt-cache`
    /// turns it off). `dir`: [`PromptCache::default_dir`] unless testing.
    pub fn with_prompt_cache(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        // Off the CPU the KV cache is not in host buffers and cannot be saved or loaded.
        if self.model.export_prefix(0).is_some() {
            self.prompt_cache = Some(PromptCache::for_model(dir, self.model.info()));
        }
        self
    }

    /// Loads the longest saved prefix of `prompt` when it is longer than the `reused` tokens the KV cache
    /// holds by enough to be worth reading; the tokens loaded (0: none). A saved prefix that cannot be
    /// read is reported and skipped.
    pub(super) fn load_saved_prefix(&mut self, prompt: &[u32], reused: usize) -> usize {
        /// Fewer new tokens than this are computed faster than an entry is read.
        const MIN_GAIN: usize = 32;
        let Some(cache) = &self.prompt_cache else { return 0 };
        let Some(hit) = cache.lookup(prompt, reused + MIN_GAIN) else { return 0 };
        let loaded = cache.load(&hit).and_then(|prefix| self.model.import_prefix(&prefix));
        match loaded {
            Ok(()) => {
                self.cached = prompt[..hit.len].to_vec();
                hit.len
            }
            Err(e) => {
                tracing::warn!("saved prompt not used: {e}");
                eprintln!("warning: {}", crate::error::one_line(&e.to_string()));
                self.cached.truncate(reused);
                self.model.truncate(reused);
                0
            }
        }
    }

    /// Saves the KV of the prompt's system turn (the part every run with these tools and settings shares)
    /// when no saved prefix holds it yet.
    pub(super) fn save_prefix(&mut self, req: &DecisionRequest<'_>, prompt: &[u32]) {
        /// Shorter prefixes are computed about as fast as they are read.
        const MIN_TOKENS: usize = 64;
        let Some(cache) = &self.prompt_cache else { return };
        if req.messages.first().is_none_or(|m| m.role != Role::System) {
            return;
        }
        let Ok(system) = self.tokens(&req.messages[..1], req.tools) else { return };
        let len = system.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if len < MIN_TOKENS || self.saved_system == prompt[..len] {
            return;
        }
        self.saved_system = prompt[..len].to_vec();
        if cache.lookup(&prompt[..len], len - 1).is_some() {
            return;
        }
        if let Some(prefix) = self.model.export_prefix(len) {
            if let Err(e) = cache.store(prompt, &prefix) {
                eprintln!("warning: the prompt was not saved: {}", crate::error::one_line(&e.to_string()));
            }
        }
    }
}
