//! `--constraint tools`: a ReAct decision asked for through OpenAI function calling, for engines that take
//! neither grammars nor schemas. The decision's schema gives the request's `tools` (each call alternative's
//! tool with its argument schema) and `tool_choice` (`required` where the schema offers no answer, the one
//! tool by name where it offers one call, `auto` otherwise); the reply's `tool_calls` come back as the
//! ReAct decision's text, which is then parsed and validated here as any other.

use serde_json::{json, Map, Value};

use super::{alternatives, type_of};

/// Each tool the schema lets a decision call, with its argument schema, in order.
fn callable(schema: &Value) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut add = |call: &Value| {
        let name = call.pointer("/properties/tool/const").and_then(Value::as_str);
        let args = call.pointer("/properties/args");
        if let (Some(name), Some(args)) = (name, args) {
            if !out.iter().any(|(n, _)| n == name) {
                out.push((name.to_string(), args.clone()));
            }
        }
    };
    for a in alternatives(schema) {
        match type_of(a) {
            Some("call_tool") => add(a),
            Some("call_tools") => {
                let calls = a.pointer("/properties/calls/items/anyOf").and_then(Value::as_array);
                calls.into_iter().flatten().for_each(&mut add);
            }
            _ => {}
        }
    }
    out
}

/// The request's `tools` and `tool_choice` for a decision under `schema`; none where it offers no call.
pub(crate) fn request_tools(schema: &Value) -> Option<(Value, Value)> {
    let tools = callable(schema);
    if tools.is_empty() {
        return None;
    }
    let defs = schema.get("$defs").cloned();
    let functions: Vec<Value> = tools
        .iter()
        .map(|(name, args)| {
            let mut parameters = args.clone();
            // The tools' shared definitions go with each, where its `$ref`s point.
            if let (Some(d), Some(p)) = (&defs, parameters.as_object_mut()) {
                p.insert("$defs".into(), d.clone());
            }
            json!({"type": "function", "function": {"name": name, "parameters": parameters}})
        })
        .collect();
    let answers = alternatives(schema).iter().any(|a| type_of(a) == Some("final_answer"));
    let choice = match (answers, tools.as_slice()) {
        (true, _) => json!("auto"),
        (false, [(only, _)]) => json!({"type": "function", "function": {"name": only}}),
        (false, _) => json!("required"),
    };
    Some((Value::Array(functions), choice))
}

/// The ReAct decision a reply's `message` makes under `schema`: its `tool_calls` as a call (several where
/// the schema takes several), else its content (a ReAct decision the model wrote, or an answer in words).
pub(crate) fn decision_text(message: &Value, schema: &Value) -> String {
    let calls: Vec<Value> = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let f = c.get("function")?;
            let name = f.get("name")?.as_str()?;
            // Arguments come as JSON text; text that is not JSON is kept, and fails validation here.
            let args = match f.get("arguments") {
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                Some(v) => v.clone(),
                None => json!({}),
            };
            Some(json!({"tool": name, "args": args}))
        })
        .collect();
    let several = alternatives(schema).iter().any(|a| type_of(a) == Some("call_tools"));
    let content = message.get("content").and_then(Value::as_str).unwrap_or_default();
    let mut decision = Map::new();
    decision.insert("thought".into(), json!(""));
    match calls.as_slice() {
        [] => match super::super::extract_json(content) {
            // A ReAct decision the model wrote unconstrained: an answer that is not text is given as text.
            Some(mut v) if v.get("type").is_some() => {
                if let Some(a) = v.get_mut("answer").filter(|a| !a.is_string() && !a.is_null()) {
                    *a = Value::String(a.to_string());
                }
                return v.to_string();
            }
            _ => {
                decision.insert("type".into(), json!("final_answer"));
                decision.insert("answer".into(), json!(content.trim()));
            }
        },
        [_, _, ..] if several => {
            decision.insert("type".into(), json!("call_tools"));
            decision.insert("calls".into(), Value::Array(calls));
        }
        [first, ..] => {
            decision.insert("type".into(), json!("call_tool"));
            decision.insert("tool".into(), first["tool"].clone());
            decision.insert("args".into(), first["args"].clone());
        }
    }
    Value::Object(decision).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str) -> Value {
        json!({"type": "object", "properties": {"thought": {}, "type": {"const": "call_tool"}, "tool": {"const": tool},
            "args": {"type": "object", "properties": {"x": {"$ref": "#/$defs/calc.x"}}}}})
    }

    fn answer() -> Value {
        json!({"type": "object", "properties": {"thought": {}, "type": {"const": "final_answer"}, "answer": {}}})
    }

    #[test]
    fn the_schema_gives_the_tools_and_the_choice() {
        let defs = json!({"calc.x": {"type": "string"}});
        let s = json!({"$defs": defs, "anyOf": [call("calc"), call("clock"), answer()]});
        let (tools, choice) = request_tools(&s).unwrap();
        assert_eq!(choice, "auto");
        assert_eq!(tools[1]["function"]["name"], "clock");
        assert_eq!(tools[0]["function"]["parameters"]["$defs"], defs);
        // No answer: a call is required, by name where there is one tool.
        let s = json!({"anyOf": [call("calc"), call("clock")]});
        assert_eq!(request_tools(&s).unwrap().1, "required");
        assert_eq!(request_tools(&call("calc")).unwrap().1, json!({"type": "function", "function": {"name": "calc"}}));
        // No call: no tools.
        assert_eq!(request_tools(&answer()), None);
    }

    #[test]
    fn a_reply_becomes_the_react_decision_it_makes() {
        let s = json!({"anyOf": [call("calc"), answer()]});
        let m = json!({"content": null, "tool_calls": [{"id": "1", "type": "function",
            "function": {"name": "calc", "arguments": "{\"x\": \"2+3\"}"}}]});
        assert_eq!(decision_text(&m, &s), r#"{"thought":"","type":"call_tool","tool":"calc","args":{"x":"2+3"}}"#);
        let m = json!({"content": " Paris. "});
        assert_eq!(decision_text(&m, &s), r#"{"thought":"","type":"final_answer","answer":"Paris."}"#);
        // A ReAct decision written as content is taken as it is.
        let written = r#"{"thought":"","type":"final_answer","answer":"4"}"#;
        assert_eq!(decision_text(&json!({"content": written}), &s), written);
        let number = r#"{"thought":"","type":"final_answer","answer":1603}"#;
        assert_eq!(
            decision_text(&json!({"content": number}), &s),
            r#"{"thought":"","type":"final_answer","answer":"1603"}"#
        );
        // Several calls where the schema takes several; else the first.
        let two = json!({"tool_calls": [{"function": {"name": "calc", "arguments": "{}"}}, {"function": {"name": "calc", "arguments": "not json"}}]});
        let parallel = json!({"anyOf": [call("calc"), {"properties": {"type": {"const": "call_tools"}}}, answer()]});
        let text = decision_text(&two, &parallel);
        assert!(text.contains(r#""type":"call_tools""#) && text.contains(r#""args":"not json""#), "{text}");
        assert!(decision_text(&two, &s).contains(r#""type":"call_tool","tool":"calc","args":{}"#));
    }
}
