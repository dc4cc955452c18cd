//! Native decisions on a remote model whose file is here: the prompt rendered and tokenized here, sent
//! to `/completions` under the native grammar (Lark, or GBNF for llama.cpp's servers), the call bias and
//! the more-calls bias as `logit_bias`, a decision that may make several calls made a call a request, and
//! proposed calls continuing the last decision.

use std::time::Instant;

use serde_json::{json, Value};

use super::{gbnf, RemoteConstraint, RemoteDriver};
use crate::agent::driver::{DecisionRequest, DriverOutput};
use crate::agent::native::CallSyntax;
use crate::decode::constraint::Grammar;
use crate::error::{Error, Result};

/// What native decisions on a remote model need from its file: the prompt rendered and tokenized here,
/// as the model in process would have it, and sent to `/completions` as token ids.
pub(super) struct Local {
    template: crate::text::chat::ChatTemplate,
    tok: crate::text::tokenizer::Tokenizer,
    pub(super) syntax: Option<CallSyntax>,
    /// The tokens that start a call in that syntax (its open marker), where the call bias goes.
    call_starts: Vec<u32>,
    /// The tokens that end the model's turn, where the more-calls bias goes; none where the syntax has
    /// no token that ends a call (in process, the bias goes after such a token).
    stops: Vec<u32>,
}

impl RemoteDriver {
    /// Reads the served model's chat template and tokenizer from its GGUF file at `path` (the weights
    /// are not read), so that decisions can be made in the model's own call syntax: under `--constraint
    /// grammar`, each is rendered here and sent to `/completions` as token ids with the native grammar
    /// (as `reagent serve` and vLLM take it), the call bias as a `logit_bias` on the call marker.
    pub fn with_template(mut self, path: &std::path::Path) -> Result<Self> {
        let (tok, template, stops) = crate::text::template_of_file(path)?;
        let syntax = CallSyntax::of(&template, &tok);
        let tokens = syntax.as_ref().map(|s| crate::agent::native::NativeTokens::of(&tok, s));
        let (call_starts, stops) = match tokens {
            Some(t) if !t.call_ends.is_empty() => (t.call_starts, stops),
            Some(t) => (t.call_starts, Vec::new()),
            None => (Vec::new(), Vec::new()),
        };
        self.local = Some(std::sync::Arc::new(Local { template, tok, syntax, call_starts, stops }));
        Ok(self)
    }

    /// A native decision: the prompt rendered here with the tools, continued at `/completions` under the
    /// decision's grammar, with its control tokens' texts (the call markers) kept.
    pub(super) fn native(&mut self, req: &DecisionRequest<'_>) -> Result<DriverOutput> {
        let started = Instant::now();
        self.last = None;
        let Some(local) = self.local.clone().filter(|l| l.syntax.is_some()) else {
            return Err(Error::param(
                "decision format",
                "native decisions on a remote model need its chat template here (--model naming its file); use react",
            ));
        };
        let Grammar::Lark(lark) = req.grammar else {
            return Err(Error::param("decision format", "a native decision's grammar is a Lark grammar"));
        };
        let prompt = local.template.render_tokens(&local.tok, req.messages, true, req.tools)?;
        // The call bias where a call starts: the first call's, and any after it (in the continuation, if
        // any, none is sent there).
        // With the more-calls bias, a decision that may make several calls is made a call a request, so
        // that the stop after each call is the server's choice under the bias.
        let one_a_request = req.biases.more_calls != 0.0 && !local.stops.is_empty();
        let first = one_a_request.then(|| crate::agent::native::native_first_call_grammar(lark)).flatten();
        let body = self.completion(
            &local,
            &prompt,
            first.as_deref().unwrap_or(lark),
            req.max_tokens,
            &local.call_starts,
            req.biases.call,
        )?;
        let resp = self.post_to("completions", &body)?;
        let (mut out, _) = self.first_choice(&resp, "/text", started)?;
        out.stats.prompt_tokens = prompt.len();
        let mut tokens = prompt;
        tokens.extend(local.tok.encode(&out.text, true)?);
        if first.is_some() {
            self.more_calls(req, &local, lark, &mut tokens, &mut out)?;
        }
        self.last = out.complete.then_some(tokens);
        Ok(out)
    }

    /// A `/completions` request continuing `prompt` under `lark` (as the constraint sends it), its
    /// control tokens' texts kept, each of `biased` given `bias`.
    fn completion(
        &self,
        local: &Local,
        prompt: &[u32],
        lark: &str,
        max_tokens: usize,
        biased: &[u32],
        bias: f32,
    ) -> Result<Value> {
        let mut body = json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens.max(1),
            "temperature": 0,
            "skip_special_tokens": false,
        });
        match self.constraint {
            // llama.cpp's servers take a prompt as text only (llama-cpp-python's reads its special
            // tokens' texts as those tokens).
            RemoteConstraint::Gbnf => {
                body["prompt"] = json!(local.tok.decode(prompt, true)?);
                body["grammar"] = json!(gbnf::lark(lark, &local.tok)?);
            }
            _ => body["structured_outputs"] = json!({"grammar": lark}),
        }
        if bias != 0.0 && !biased.is_empty() {
            let bias = json!(bias.clamp(-100.0, 100.0));
            body["logit_bias"] = Value::Object(biased.iter().map(|t| (t.to_string(), bias.clone())).collect());
        }
        Ok(body)
    }

    /// The rest of a native decision whose first call was made alone, with the stop after each call
    /// taking the more-calls bias, as in process: the decision's text sent back after its prompt, under
    /// the grammar of its remaining calls, where the stop tokens are allowed only after a call, so that a
    /// `logit_bias` on them (which a server applies at every position) biases that choice alone.
    fn more_calls(
        &self,
        req: &DecisionRequest<'_>,
        local: &Local,
        lark: &str,
        tokens: &mut Vec<u32>,
        out: &mut DriverOutput,
    ) -> Result<()> {
        let Some(syntax) = local.syntax.as_ref().filter(|_| out.complete) else { return Ok(()) };
        let made = crate::agent::native::parse_native(&out.text, syntax).map(|d| d.calls().len()).unwrap_or(0);
        let Some(grammar) = crate::agent::native::native_continuation_grammar(lark, made) else { return Ok(()) };
        let started = Instant::now();
        let left = req.max_tokens.saturating_sub(out.stats.generated_tokens);
        let body = self.completion(local, tokens, &grammar, left, &local.stops, -req.biases.more_calls)?;
        let resp = self.post_to("completions", &body)?;
        let (more, _) = self.first_choice(&resp, "/text", started)?;
        tokens.extend(local.tok.encode(&more.text, true)?);
        out.text.push_str(&more.text);
        out.complete = more.complete;
        out.stats.add_generation(&more.stats);
        Ok(())
    }

    /// [`Driver::extend`](crate::agent::driver::Driver::extend): goes on from the last native decision
    /// (and what was added to it), its prompt and text sent again as tokens, under `req.grammar` (one
    /// more call).
    pub(super) fn go_on(&mut self, req: &DecisionRequest<'_>) -> Result<Option<DriverOutput>> {
        let (Some(local), Some(tokens), Grammar::Lark(lark)) = (self.local.clone(), self.last.as_ref(), req.grammar)
        else {
            return Ok(None);
        };
        let body = self.completion(&local, tokens, lark, req.max_tokens, &[], 0.0)?;
        let started = Instant::now();
        let resp = self.post_to("completions", &body)?;
        let (out, _) = self.first_choice(&resp, "/text", started)?;
        if let Some(tokens) = self.last.as_mut() {
            tokens.extend(local.tok.encode(&out.text, true)?);
        }
        Ok(Some(out))
    }
}
