//! The `outputSchema` of each `veris mcp` tool: the shape of its structured
//! result, which clients check a result against (the MCP Python SDK does,
//! for every result that is not an error). Every result, an error
//! included, has `verdict` and `exit_code`; an error has `error` (and
//! `veris_run`'s its command's `output`), so one schema per tool covers
//! both. A receipt is the object `veris receipt --json` prints, described
//! in docs/receipt.md, not repeated here.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{json, Value};

/// `veris_baseline`.
pub fn baseline() -> Arc<JsonObject> {
    schema(json!({
        "baseline": {"type": "string", "description": "The token to pass as `since` to veris_receipt."},
        "ledger_id": {"type": ["string", "null"], "description": "The ledger the baseline was taken on."},
        "seq": {"type": "integer", "minimum": 0, "description": "The ledger's last seq at the baseline."},
        "twin": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "The twin's newest request id per service at the baseline."},
    }))
}

/// `veris_receipt`.
pub fn receipt() -> Arc<JsonObject> {
    schema(json!({
        "failures": failures(),
        "run": {"type": ["string", "null"], "description": "The run of the state dir read, when one was named."},
        "note": {"type": ["string", "null"], "description": "Why a finished run read from its file is not `verified`."},
        "receipt": receipt_object(),
    }))
}

/// `veris_runs`.
pub fn runs() -> Arc<JsonObject> {
    schema(json!({
        "runs": {
            "type": "array",
            "description": "Newest first, as `veris runs --json` lists them.",
            "items": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
        },
    }))
}

/// `veris_run`.
pub fn run() -> Arc<JsonObject> {
    schema(json!({
        "command_exit": {"description": "The command's exit code (null when it was killed by a signal)."},
        "failures": failures(),
        "timed_out": {"type": "boolean"},
        "ledger": {"type": "string", "description": "The run's ledger file."},
        "seal_key": {"type": "string", "description": "The fingerprint of the key that sealed it."},
        "receipt": receipt_object(),
        "output": {
            "type": "object",
            "description": "The tails of the command's stdout and stderr: its words, not veris's.",
            "properties": {"stdout_tail": {"type": "string"}, "stderr_tail": {"type": "string"}},
        },
    }))
}

/// `veris_check`.
pub fn check() -> Arc<JsonObject> {
    let nullable_string = json!({"type": ["string", "null"]});
    schema(json!({
        "live": {"type": "boolean"},
        "probe": {"type": "string", "description": "The path the probe took."},
        "run_id": nullable_string,
        "sandbox_id": nullable_string,
        "listener": {"description": "The tier that answered the probe."},
        "mode": {"description": "The proxy's mode."},
    }))
}

fn failures() -> Value {
    json!({
        "type": "array",
        "items": {"type": "string"},
        "description": "Each requirement or check that failed, in words.",
    })
}

fn receipt_object() -> Value {
    json!({"type": "object", "description": "The receipt, as `veris receipt --json` prints it."})
}

/// An object schema with `properties` and the fields every result has.
fn schema(properties: Value) -> Arc<JsonObject> {
    let mut props = json!({
        "verdict": {
            "type": "string",
            "enum": ["pass", "fail", "error"],
            "description": "`pass` and `fail` judge what the tool looked at; `error`: the tool could not run (see `error`).",
        },
        "exit_code": {
            "type": "integer",
            "minimum": 0,
            "description": "What the matching veris command would exit with.",
        },
        "error": {"type": "string", "description": "Why the tool could not run, and what to do next."},
    });
    if let (Some(all), Value::Object(more)) = (props.as_object_mut(), properties) {
        all.extend(more);
    }
    let schema = json!({
        "type": "object",
        "properties": props,
        "required": ["verdict", "exit_code"],
    });
    match schema {
        Value::Object(o) => Arc::new(o),
        _ => Arc::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_an_object_requiring_the_verdict_and_exit_code() {
        for s in [baseline(), receipt(), runs(), run(), check()] {
            assert_eq!(s["type"], "object");
            assert_eq!(s["required"], json!(["verdict", "exit_code"]));
            for field in ["verdict", "exit_code", "error"] {
                assert!(s["properties"].get(field).is_some(), "{field}: {s:?}");
            }
        }
    }
}
