//! A decision's JSON found in free-form text (the free-form driver, a remote server's reply without a
//! constraint).

use serde_json::Value;

/// The first complete JSON object in free text: inside a ```json fence if there is one, else the first
/// `{` that starts a parsable object.
pub fn extract_json(text: &str) -> Option<Value> {
    let fenced = text.split("```").skip(1).step_by(2).map(|b| b.trim_start_matches("json").trim());
    for candidate in fenced.chain(std::iter::once(text)) {
        for (i, _) in candidate.match_indices('{') {
            let mut it = serde_json::Deserializer::from_str(&candidate[i..]).into_iter::<Value>();
            if let Some(Ok(v @ Value::Object(_))) = it.next() {
                return Some(v);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_extracted_from_fences_or_bare_text() {
        let v = extract_json("Sure!\n```json\n{\"a\": 1}\n```\nbye").unwrap();
        assert_eq!(v["a"], 1);
        let v = extract_json("I think {\"type\": \"final_answer\", \"answer\": \"x\"} is it {\"b\":2}").unwrap();
        assert_eq!(v["type"], "final_answer");
        let v = extract_json("{broken {\"ok\": true}").unwrap();
        assert_eq!(v["ok"], true);
        assert!(extract_json("no json here {").is_none());
    }
}
