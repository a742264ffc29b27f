//! A tool's input schema, checked outside the jail before a call is
//! forwarded (with the `jsonschema` crate: no schema is fetched over the
//! network, no format is asserted beyond what the schema says).

use serde_json::Value;

/// Errors listed for one call, at most.
const MAX_LISTED: usize = 5;

/// Why an upstream's input schema cannot be used (the validator's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("its input schema cannot be used: {0}")]
pub struct UnusableSchema(pub String);

/// What is wrong with a call's arguments: the first few problems, each
/// with where (`at /timezone: 3 is not of type "string"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}", .problems.join("; "), if *.more { "; and more" } else { "" })]
pub struct BadArguments {
    pub problems: Vec<String>,
    /// More problems than listed.
    pub more: bool,
}

/// A compiled input schema.
#[derive(Debug)]
pub struct InputSchema {
    validator: jsonschema::Validator,
}

impl InputSchema {
    /// Compile an upstream's schema; an error makes the tool uncallable
    /// (its message says why).
    pub fn new(schema: &Value) -> Result<InputSchema, UnusableSchema> {
        jsonschema::validator_for(schema)
            .map(|validator| InputSchema { validator })
            .map_err(|e| UnusableSchema(e.to_string()))
    }

    /// Check a call's arguments: the first few problems, each with where.
    pub fn check(&self, arguments: &Value) -> Result<(), BadArguments> {
        let mut problems: Vec<String> = self
            .validator
            .iter_errors(arguments)
            .take(MAX_LISTED + 1)
            .map(|e| {
                let at = e.instance_path.to_string();
                let at = if at.is_empty() { "/".to_string() } else { at };
                format!("at {at}: {e}")
            })
            .collect();
        let more = problems.len() > MAX_LISTED;
        problems.truncate(MAX_LISTED);
        match problems.is_empty() {
            true => Ok(()),
            false => Err(BadArguments { problems, more }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> InputSchema {
        InputSchema::new(&json!({
            "type": "object",
            "properties": {"timezone": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
            "required": ["timezone"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn arguments_are_checked_with_where_each_problem_is() {
        let s = schema();
        assert_eq!(s.check(&json!({"timezone": "UTC"})), Ok(()));
        let e = s.check(&json!({"timezone": 3})).unwrap_err().to_string();
        assert!(
            e.starts_with("at /timezone:") && e.contains("string"),
            "{e}"
        );
        let e = s.check(&json!({})).unwrap_err().to_string();
        assert!(e.starts_with("at /:") && e.contains("timezone"), "{e}");
        let e = s
            .check(&json!({"timezone": "UTC", "n": -1, "x": 1}))
            .unwrap_err();
        assert_eq!((e.problems.len(), e.more), (2, false), "{e}");
        let e = e.to_string();
        assert!(e.contains("/n") && e.contains("x"), "{e}");
    }

    #[test]
    fn an_unusable_schema_is_said_so() {
        let e = InputSchema::new(&json!({"type": "no-such-type"})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("its input schema cannot be used: "),
            "{e}"
        );
    }
}
