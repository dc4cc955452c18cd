//! The call bias on a remote ReAct decision, from the log-probabilities the server returns.
//!
//! In process, the bias is added to the scores of the tokens that start a call where the decision's
//! `type` is chosen ([`BranchBiases::call`](crate::agent::BranchBiases)). A server applies no such bias,
//! but most return each generated token's log-probability with its best alternatives (`logprobs`,
//! `top_logprobs`), before their grammar's mask: the margin between the call's start and the answer's is
//! the difference of the two. Where the server took one side and the other is not among the alternatives,
//! the same request narrowed to the other side's alternatives gives its log-probability at the same place
//! (greedy, the same prefix). The biased choice then keeps the server's decision or takes the narrowed one.

use std::sync::OnceLock;

use serde_json::Value;

/// The side of a ReAct decision's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Call,
    Answer,
}

impl Side {
    /// The side whose `type` value starts with `value` (the text from the value's first character on,
    /// maybe only part of it); none for an empty or unknown start.
    fn of(value: &str) -> Option<Side> {
        const SIDES: [(&str, Side); 3] =
            [("call_tool\"", Side::Call), ("call_tools\"", Side::Call), ("final_answer\"", Side::Answer)];
        if value.is_empty() {
            return None;
        }
        SIDES.iter().find(|(v, _)| v.starts_with(value) || value.starts_with(v)).map(|&(_, s)| s)
    }

    pub(crate) fn other(self) -> Side {
        match self {
            Side::Call => Side::Answer,
            Side::Answer => Side::Call,
        }
    }

    fn has(self, type_const: &str) -> bool {
        match self {
            Side::Call => type_const == "call_tool" || type_const == "call_tools",
            Side::Answer => type_const == "final_answer",
        }
    }
}

/// Whether a ReAct decision schema offers both sides (not a decision already narrowed, or a forced call).
pub(crate) fn offers_both(schema: &Value) -> bool {
    let types: Vec<&str> = super::alternatives(schema).into_iter().filter_map(super::type_of).collect();
    [Side::Call, Side::Answer].into_iter().all(|side| types.iter().any(|t| side.has(t)))
}

/// A ReAct decision schema narrowed to `side`'s alternatives; none where it does not offer both sides.
pub(crate) fn narrowed(schema: &Value, side: Side) -> Option<Value> {
    if !offers_both(schema) {
        return None;
    }
    let kept: Vec<Value> = super::alternatives(schema)
        .into_iter()
        .filter(|a| super::type_of(a).is_some_and(|t| side.has(t)))
        .cloned()
        .collect();
    let mut out = schema.clone();
    out["anyOf"] = Value::Array(kept);
    Some(out)
}

/// The token that starts a decision's `type` value, read from a response's `logprobs.content`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TypeToken {
    /// The side the server took, and its log-probability.
    pub(crate) side: Side,
    pub(crate) logprob: f32,
    /// The best log-probability among the token's alternatives that start the other side.
    pub(crate) other: Option<f32>,
    /// Where none does: the least of the `top` best alternatives, above the other side's.
    pub(crate) ceiling: Option<f32>,
}

/// The [`TypeToken`] of a response's tokens (`logprobs.content`: `token`, `logprob`, `top_logprobs`),
/// where `top` alternatives were asked for; none where the tokens do not write a `type` value.
pub(crate) fn type_token(content: &[Value], top: usize) -> Option<TypeToken> {
    static KEY: OnceLock<regex::Regex> = OnceLock::new();
    let key = KEY.get_or_init(|| regex::Regex::new(r#""type"\s*:\s*""#).expect("a valid pattern"));
    let mut text = String::new();
    for t in content {
        let start = text.len();
        text.push_str(t.get("token")?.as_str()?);
        let Some(m) = key.find(&text) else { continue };
        if m.end() >= text.len() {
            // The value starts with the next token.
            continue;
        }
        let at = m.end().max(start);
        let side = Side::of(&text[at..])?;
        let logprob = t.get("logprob")?.as_f64()? as f32;
        // An alternative is this token's text before the value, then another start.
        let before = &text[start..at];
        let mut listed: Vec<f32> = Vec::new();
        let mut other: Option<f32> = None;
        for alt in t.get("top_logprobs").and_then(Value::as_array).into_iter().flatten() {
            let (Some(tok), Some(lp)) =
                (alt.get("token").and_then(Value::as_str), alt.get("logprob").and_then(Value::as_f64))
            else {
                continue;
            };
            let lp = lp as f32;
            listed.push(lp);
            if tok.strip_prefix(before).and_then(Side::of) == Some(side.other()) {
                other = Some(other.map_or(lp, |o| o.max(lp)));
            }
        }
        // A server may list the token it took after the best ones: the bound is the `top`-th best.
        listed.sort_by(|a, b| b.total_cmp(a));
        let ceiling = match other {
            None if top > 0 && listed.len() >= top => Some(listed[top - 1]),
            _ => None,
        };
        return Some(TypeToken { side, logprob, other, ceiling });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A token's text, its log-probability, and its alternatives.
    type Piece<'a> = (&'a str, f64, &'a [(&'a str, f64)]);

    fn tokens(pieces: &[Piece<'_>]) -> Vec<Value> {
        pieces
            .iter()
            .map(|(t, lp, alts)| {
                let top: Vec<Value> = alts.iter().map(|(a, l)| json!({"token": a, "logprob": l})).collect();
                json!({"token": t, "logprob": lp, "top_logprobs": top})
            })
            .collect()
    }

    #[test]
    fn the_type_token_is_found_with_the_other_side_among_its_alternatives() {
        // Spaced as llama.cpp's JSON grammar writes it; the value starts inside the token after the quote.
        let c = tokens(&[
            ("{ \"", -0.1, &[]),
            ("thought", -0.2, &[]),
            ("\": \"\" , \"", -0.1, &[]),
            ("type", -0.1, &[]),
            ("\":", -0.1, &[]),
            (" \"", -0.1, &[]),
            ("call", -1.5, &[("final", -0.5), ("call", -1.5), ("text", -0.2)]),
            ("_tool\"", -0.1, &[]),
        ]);
        let t = type_token(&c, 3).unwrap();
        assert_eq!((t.side, t.logprob, t.other, t.ceiling), (Side::Call, -1.5, Some(-0.5), None));
    }

    #[test]
    fn a_token_holding_the_quote_and_the_value_is_read_after_the_quote() {
        let c = tokens(&[
            ("{\"thought\":\"\",\"type\":", -0.1, &[]),
            ("\"final", -0.25, &[("\"final", -0.25), ("\"call", -2.0), ("\"f", -3.0)]),
            ("_answer\",\"answer\":\"Paris\"}", -0.1, &[]),
        ]);
        let t = type_token(&c, 3).unwrap();
        assert_eq!((t.side, t.other), (Side::Answer, Some(-2.0)));
    }

    #[test]
    fn without_the_other_side_listed_the_ceiling_bounds_it() {
        // Four best asked for; the token taken is listed after them, below the fourth.
        let alts: &[(&str, f64)] = &[("text", -0.5), ("answer", -1.0), ("result", -2.0), ("name", -3.0), ("f", -7.0)];
        let c =
            tokens(&[("{\"thought\":\"\",\"type\":\"", -0.1, &[]), ("f", -7.0, alts), ("inal_answer\"", -0.1, &[])]);
        let t = type_token(&c, 4).unwrap();
        assert_eq!((t.side, t.logprob, t.other, t.ceiling), (Side::Answer, -7.0, None, Some(-3.0)));
        // Fewer alternatives than asked for bound nothing.
        assert_eq!(type_token(&c, 8).unwrap().ceiling, None);
        // No `type` value, or no log-probabilities: nothing.
        assert_eq!(type_token(&tokens(&[("{\"answer\":\"x\"}", -0.1, &[])]), 4), None);
        assert_eq!(type_token(&[], 4), None);
    }

    #[test]
    fn a_schema_is_narrowed_to_one_side_only_where_it_offers_both() {
        let alt = |t: &str| json!({"type": "object", "properties": {"type": {"const": t}}});
        let s = json!({"x-guidance": {}, "anyOf": [alt("call_tool"), alt("call_tool"), alt("call_tools"), alt("final_answer")]});
        let call = narrowed(&s, Side::Call).unwrap();
        assert_eq!(call["anyOf"].as_array().unwrap().len(), 3);
        assert_eq!(call["x-guidance"], json!({}));
        assert_eq!(narrowed(&s, Side::Answer).unwrap()["anyOf"], json!([alt("final_answer")]));
        assert_eq!(narrowed(&call, Side::Answer), None);
        assert_eq!(narrowed(&alt("final_answer"), Side::Call), None);
    }
}
