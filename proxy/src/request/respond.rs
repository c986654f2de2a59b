//! Answers the proxy makes itself: JSON bodies, always marked `X-Veris-Proxy: 1`
//! so a client (and a person reading a transcript) can tell them from the twin's.

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use crate::body::{full, ProxyBody};

/// A JSON answer from the proxy itself.
pub fn json(status: StatusCode, body: Value) -> Response<ProxyBody> {
    json_text(status, body.to_string())
}

/// [`json`] of a body already serialized.
pub fn json_text(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert("x-veris-proxy", HeaderValue::from_static("1"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `{error, message, ...extra}` with a status.
pub fn error(status: StatusCode, code: &str, message: String, extra: Value) -> Response<ProxyBody> {
    let mut body = json!({"error": code, "message": message});
    if let (Some(obj), Value::Object(more)) = (body.as_object_mut(), extra) {
        obj.extend(more);
    }
    json(status, body)
}
