//! Tools the agent can call. For now: [`ToolSpec`], what the decision grammar and the prompt need to know
//! of a tool (its name, description and JSON schema of its arguments).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A tool's public description: its name, what it does, and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the `args` object.
    pub parameters: serde_json::Value,
}

impl ToolSpec {
    /// A tool description; the name must be an identifier (letters, digits, `_`, `-`, `.`).
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: serde_json::Value) -> Result<Self> {
        let spec = Self { name: name.into(), description: description.into(), parameters };
        spec.check()?;
        Ok(spec)
    }

    /// Reads the common function format: `{"type": "function", "function": {name, description,
    /// parameters}}` or the bare inner object.
    pub fn from_function_json(v: &serde_json::Value) -> Result<Self> {
        let f = if v.get("type").and_then(|t| t.as_str()) == Some("function") { v.get("function") } else { Some(v) };
        let f = f.and_then(|f| f.as_object()).ok_or_else(|| Error::Tool {
            tool: "?".into(),
            reason: "a function definition must be an object with `name` and `parameters`".into(),
        })?;
        let name = f.get("name").and_then(|n| n.as_str()).ok_or_else(|| Error::Tool {
            tool: "?".into(),
            reason: "function definition has no string `name`".into(),
        })?;
        let description = f.get("description").and_then(|d| d.as_str()).unwrap_or("");
        let parameters =
            f.get("parameters").cloned().unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        Self::new(name, description, parameters)
    }

    fn check(&self) -> Result<()> {
        let err = |reason: String| Err(Error::Tool { tool: self.name.clone(), reason });
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if self.name.is_empty() || !self.name.chars().all(ok_char) {
            return err("tool names may use only letters, digits, `_`, `-` and `.`".into());
        }
        match self.parameters.as_object() {
            None => return err("`parameters` must be a JSON schema object".into()),
            Some(p) if p.get("type").is_some_and(|t| t != "object") => {
                return err(format!("`parameters` must describe an object, not {}", p["type"]))
            }
            Some(_) => {}
        }
        jsonschema::validator_for(&self.parameters).map_err(|e| Error::Tool {
            tool: self.name.clone(),
            reason: format!("`parameters` is not a valid JSON schema: {e}"),
        })?;
        Ok(())
    }
}
