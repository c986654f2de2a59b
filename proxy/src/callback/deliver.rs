//! One delivery attempt: dial (and for `https://` the TLS handshake,
//! [`super::tls`]), POST the signed event, read the answer head and at most
//! [`MAX_ANSWER`] bytes of its body, all before one deadline.
//! The app's answer body is the workload's text: it is read only to let the
//! app finish its answer and never kept.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCEPT, CACHE_CONTROL, CONTENT_TYPE, HOST, USER_AGENT,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use veris_twin::webhook::{sign, Event, Secret, SIGNATURE_HEADER};

use super::{Dialer, Webhook, WebhookTls};

/// How an attempt reaches the app: the dial, and the TLS an `https://` URL
/// is delivered over.
#[derive(Clone, Default)]
pub struct Reach {
    pub dialer: Dialer,
    pub tls: WebhookTls,
}

/// Answer body bytes read at most; an app that sends more is cut off.
pub const MAX_ANSWER: usize = 64 * 1024;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The app's status, when its answer head arrived.
    pub status: Option<u16>,
    /// What went wrong: no status (`connect: …`, `timeout`, …), or an
    /// answer cut after its head (`timeout reading the answer body`, …).
    pub error: Option<String>,
    pub duration: Duration,
}

/// Delivers `event` to `webhook` once through `reach`, signed with
/// `secrets` as of `backdate` ago (zero but for a `stale-signature` fault).
pub async fn attempt(
    reach: &Reach,
    webhook: &Webhook,
    event: &Event,
    secrets: &[Secret],
    backdate: Duration,
    timeout: Duration,
) -> Outcome {
    let now = std::time::SystemTime::now()
        .checked_sub(backdate)
        .unwrap_or(std::time::UNIX_EPOCH)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let signature = sign::stripe_signature(secrets, now, &event.payload);
    let mut headers = vec![
        (
            CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        ),
        (
            USER_AGENT,
            HeaderValue::from_static("Stripe/1.0 (+https://stripe.com/docs/webhooks)"),
        ),
        (
            ACCEPT,
            HeaderValue::from_static("*/*; q=0.5, application/xml"),
        ),
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    // Hex and digits only: always a valid header value.
    if let Ok(v) = HeaderValue::from_str(&signature) {
        headers.push((HeaderName::from_static(SIGNATURE_HEADER), v));
    }
    post(reach, webhook, event.payload.clone(), headers, timeout).await
}

/// POSTs `body` with `headers` (and `Host`) to `webhook` once through
/// `reach`, bounded by `timeout`: what the app answered.
pub async fn post(
    reach: &Reach,
    webhook: &Webhook,
    body: Bytes,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
) -> Outcome {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let (status, error) = match exchange(reach, webhook, body, headers, deadline).await {
        Ok((status, None)) => (Some(status), None),
        Ok((status, Some(cut))) => (Some(status), Some(cut)),
        Err(e) => (None, Some(e)),
    };
    Outcome {
        status,
        error,
        duration: started.elapsed(),
    }
}

/// The attempt's status and what cut its answer body short, if anything;
/// or why no answer head arrived.
async fn exchange(
    reach: &Reach,
    webhook: &Webhook,
    body: Bytes,
    headers: Vec<(HeaderName, HeaderValue)>,
    deadline: tokio::time::Instant,
) -> Result<(u16, Option<String>), String> {
    let stream = tokio::time::timeout_at(deadline, reach.dialer.connect(&webhook.authority))
        .await
        .map_err(within("connecting"))?
        .map_err(|e| format!("connect: {e}"))?;
    if !webhook.tls {
        return send(stream, webhook, body, headers, deadline).await;
    }
    let stream = tokio::time::timeout_at(deadline, reach.tls.handshake(stream, webhook.host()))
        .await
        .map_err(within("the TLS handshake"))??;
    send(stream, webhook, body, headers, deadline).await
}

fn within(what: &'static str) -> impl Fn(tokio::time::error::Elapsed) -> String {
    move |_| format!("timeout ({what})")
}

/// The request and its answer over a connected `stream`.
async fn send<S>(
    stream: S,
    webhook: &Webhook,
    body: Bytes,
    headers: Vec<(HeaderName, HeaderValue)>,
    deadline: tokio::time::Instant,
) -> Result<(u16, Option<String>), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = tokio::time::timeout_at(
        deadline,
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)),
    )
    .await
    .map_err(within("connecting"))?
    .map_err(|e| format!("http: {e}"))?;
    // The connection's task ends with this attempt, whatever happens.
    let conn = AbortOnDrop(tokio::spawn(conn));
    let target = match &webhook.query {
        Some(q) => format!("{}?{q}", webhook.path),
        None => webhook.path.clone(),
    };
    let mut request = http::Request::post(target)
        .header(HOST, &webhook.authority)
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    for (name, value) in headers {
        request.headers_mut().append(name, value);
    }
    let response = tokio::time::timeout_at(deadline, sender.send_request(request))
        .await
        .map_err(within("waiting for the answer"))?
        .map_err(|e| format!("http: {e}"))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_ANSWER).collect();
    let cut = match tokio::time::timeout_at(deadline, body).await {
        Ok(Ok(_)) => None,
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Some(format!(
                "answer body longer than {MAX_ANSWER} bytes; cut off"
            ))
        }
        Ok(Err(e)) => Some(format!("answer body: {e}")),
        Err(_) => Some("timeout (reading the answer body)".into()),
    };
    drop(conn);
    Ok((status, cut))
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
