//! Entry points for the fuzz targets in `fuzz/` (and the regression tests
//! that replay what they found). Not an API: thin wrappers over the twin's
//! private parsers, so the fuzzer reaches them without widening the crate.

use std::collections::BTreeMap;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::HeaderMap;
use serde_json::Value;

use crate::template::{Context, Node};

/// The request body parser (JSON or Stripe-style form) for a body sent with
/// `content_type`: the value the fixtures see, or the 400's message.
pub fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, String> {
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        headers.insert(CONTENT_TYPE, v);
    }
    crate::twin::parse_body(&headers, body)
}

/// The query string parser (`a=1&b=x+y`, last value wins).
pub fn parse_query(query: &str) -> BTreeMap<String, String> {
    crate::twin::parse_query(Some(query))
}

/// Compiles `template` (a JSON value whose strings may hold `{{…}}`) as a
/// fixture body and renders it against a request with `body` and `query`.
pub fn render(template: &Value, body: &Value, query: &str) -> Result<Value, String> {
    let node = Node::compile(template)?;
    let params = BTreeMap::from([("id".to_string(), "obj_1".to_string())]);
    let query = parse_query(query);
    let headers = HeaderMap::new();
    let ids = crate::twin::IdGen::new();
    let cx = Context {
        params: &params,
        body,
        query: &query,
        headers: &headers,
        method: "POST",
        path: "/v1/x",
        service: "svc",
        sandbox: "sbx",
        list: None,
        ids: &ids,
    };
    Ok(node.render(&cx))
}
