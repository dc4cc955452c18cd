//! Whether a JSON schema has a finite instance: a required property that can only be written by writing
//! itself again (`{"properties": {"next": {"$ref": "#"}}, "required": ["next"]}`) makes every instance
//! infinite, so generation under it could never end. Such a schema is refused before anything is
//! generated, naming the property.
//!
//! Satisfiability is the least fixed point over the schema's `$ref` targets: a target counts as writable
//! only once some finite instance of it is shown, so a cycle through required properties never is.
//! Keywords that only narrow a value (`pattern`, `minimum`, formats) are not judged here: the grammar
//! compiler refuses what matches nothing of those.

use std::collections::HashMap;

use serde_json::Value;

/// Schema nodes visited at most per pass (schemas come from untrusted files and requests).
const MAX_NODES: usize = 100_000;
/// Passes at most (each settles at least one `$ref` target; more targets than this are not judged).
const MAX_PASSES: usize = 256;

/// Why `schema` has no finite instance, naming the required property at fault (`None` where it has one,
/// or is too large to judge, which the grammar compiler then bounds).
pub fn no_finite_instance(schema: &Value) -> Option<String> {
    let at = required_without_finite_instance(schema)?;
    Some(match at.as_str() {
        "/" => {
            "it is unsatisfiable: it matches no text (its `$ref`s lead only back to themselves, or it allows no value)"
                .into()
        }
        _ => format!("required property `{at}` has no finite value (it requires itself, or allows no value)"),
    })
}

/// The JSON pointer of the first required property under `schema` that has no finite instance (`/`: the
/// schema itself), or `None` where the schema has one (or is too large to judge).
pub fn required_without_finite_instance(schema: &Value) -> Option<String> {
    let mut known: HashMap<String, bool> = HashMap::new();
    for _ in 0..MAX_PASSES {
        let mut walk = Walk { root: schema, known: &known, found: HashMap::new(), nodes: 0 };
        let root = walk.writable(schema, "");
        if walk.nodes > MAX_NODES {
            return None;
        }
        let found = walk.found;
        let changed = found.iter().any(|(k, v)| known.get(k) != Some(v));
        known.extend(found);
        if !changed {
            if root {
                return None;
            }
            let mut walk = Walk { root: schema, known: &known, found: HashMap::new(), nodes: 0 };
            return Some(walk.culprit(schema, "").unwrap_or_else(|| "/".into()));
        }
    }
    None
}

struct Walk<'a> {
    root: &'a Value,
    /// `$ref` targets judged so far (absent: not yet shown writable).
    known: &'a HashMap<String, bool>,
    /// What this pass found for the targets it met.
    found: HashMap<String, bool>,
    nodes: usize,
}

impl Walk<'_> {
    /// Whether `v` has a finite instance, with the `$ref` targets as `known` says.
    fn writable(&mut self, v: &Value, at: &str) -> bool {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return true;
        }
        let Some(o) = v.as_object() else { return v != &Value::Bool(false) };
        if let Some(Value::String(r)) = o.get("$ref") {
            if !self.target(r) {
                return false;
            }
        }
        if let Some(Value::Array(alts)) = o.get("anyOf").or_else(|| o.get("oneOf")) {
            let mut any = false;
            for (i, alt) in alts.iter().enumerate() {
                // Every alternative is walked, so every target under it is judged.
                any |= self.writable(alt, &format!("{at}/anyOf/{i}"));
            }
            if !any {
                return false;
            }
        }
        if let Some(Value::Array(all)) = o.get("allOf") {
            let mut every = true;
            for (i, part) in all.iter().enumerate() {
                every &= self.writable(part, &format!("{at}/allOf/{i}"));
            }
            if !every {
                return false;
            }
        }
        if let Some(Value::Array(values)) = o.get("enum") {
            return !values.is_empty();
        }
        if o.contains_key("const") {
            return true;
        }
        let required = self.required_unwritable(o, at).is_none();
        let items = match o.get("minItems").and_then(Value::as_u64) {
            Some(n) if n > 0 => o.get("items").is_none_or(|items| self.writable(items, &format!("{at}/items"))),
            _ => {
                // Walked for the targets under them; an empty array is an instance.
                if let Some(items) = o.get("items") {
                    self.writable(items, &format!("{at}/items"));
                }
                true
            }
        };
        // Optional properties are walked too, for the targets only they reach.
        if let Some(Value::Object(props)) = o.get("properties") {
            for (name, p) in props {
                self.writable(p, &format!("{at}/properties/{name}"));
            }
        }
        required && items
    }

    /// The first required property of object schema `o` with no finite instance: its pointer.
    fn required_unwritable(&mut self, o: &serde_json::Map<String, Value>, at: &str) -> Option<String> {
        let required = o.get("required")?.as_array()?;
        let props = o.get("properties").and_then(Value::as_object);
        for name in required.iter().filter_map(Value::as_str) {
            let Some(p) = props.and_then(|p| p.get(name)) else { continue };
            let here = format!("{at}/properties/{name}");
            if !self.writable(p, &here) {
                return Some(here);
            }
        }
        None
    }

    /// Whether `$ref` target `r` is writable as far as known; its own finding recorded for the next pass.
    fn target(&mut self, r: &str) -> bool {
        if let Some(&w) = self.found.get(r) {
            return w;
        }
        let Some(v) = resolve(self.root, r) else { return true };
        let before = self.known.get(r).copied().unwrap_or(false);
        // Met again while being judged (a cycle): what the last pass knew.
        self.found.insert(r.to_string(), before);
        let w = self.writable(v, r.trim_start_matches('#'));
        self.found.insert(r.to_string(), w);
        w
    }

    /// Where the schema rooted at `v` first fails: the deepest required property found unwritable.
    fn culprit(&mut self, v: &Value, at: &str) -> Option<String> {
        let o = v.as_object()?;
        if let Some(Value::String(r)) = o.get("$ref") {
            if !self.known.get(r.as_str()).copied().unwrap_or(true) {
                // A cycle: the property that leads back into it is the one to name.
                return None;
            }
        }
        let here = self.required_unwritable(o, at)?;
        let name_of = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
        let props = o.get("properties").and_then(Value::as_object)?;
        let inner = props.get(&name_of(&here)).and_then(|p| self.culprit(p, &here));
        Some(inner.unwrap_or(here))
    }
}

/// The subschema a local `$ref` points to (`#`, `#/$defs/x`, any JSON pointer); `None` for remote ones.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let pointer = r.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_required_property_that_recurses_into_itself_is_named() {
        let s = json!({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]});
        assert_eq!(required_without_finite_instance(&s).as_deref(), Some("/properties/next"));
        let through_defs = json!({
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/node"}},
            "required": ["tree"],
            "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}, "required": ["child"]}}
        });
        assert_eq!(required_without_finite_instance(&through_defs).as_deref(), Some("/properties/tree"));
        let array = json!({"type": "object", "properties": {"kids": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}}, "required": ["kids"]});
        assert!(required_without_finite_instance(&array).is_some());
    }

    #[test]
    fn recursion_with_a_way_out_is_finite() {
        for s in [
            // Optional recursion.
            json!({"type": "object", "properties": {"next": {"$ref": "#"}}}),
            // An alternative that ends it.
            json!({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]}),
            // An array that may be empty.
            json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}),
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "undeclared"]}),
            json!({"type": "object", "properties": {"r": {"$ref": "http://elsewhere/schema"}}, "required": ["r"]}),
        ] {
            assert_eq!(required_without_finite_instance(&s), None, "{s}");
        }
    }

    #[test]
    fn an_empty_enum_or_anyof_has_no_instance() {
        let s = json!({"type": "object", "properties": {"e": {"enum": []}}, "required": ["e"]});
        assert_eq!(required_without_finite_instance(&s).as_deref(), Some("/properties/e"));
        let s = json!({"type": "object", "properties": {"e": {"anyOf": []}}, "required": ["e"]});
        assert_eq!(required_without_finite_instance(&s).as_deref(), Some("/properties/e"));
    }
}
