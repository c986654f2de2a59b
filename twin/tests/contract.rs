//! Contract tests over real HTTP: a twin served on 127.0.0.1:0 and a hyper client.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use veris_twin::{serve, Fixtures, Twin, TwinError, TwinOptions};

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), TwinError>>,
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task)
            .await
            .expect("serve task joins")
            .expect("serve ends cleanly");
    }
}

async fn start_with(options: TwinOptions, tls: Option<Arc<rustls::ServerConfig>>) -> Running {
    let twin = Twin::new(options).expect("twin builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, twin, tls, async move {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}

async fn start() -> Running {
    start_with(
        TwinOptions {
            fixtures: Fixtures::builtin(),
            sandbox: None,
            log: None,
            credential: None,
        },
        None,
    )
    .await
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn h1() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn h2c() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

struct Answer {
    status: StatusCode,
    version: Version,
    content_type: String,
    body: Value,
}

async fn call(
    client: &HttpClient,
    method: Method,
    url: &str,
    ctype: Option<&str>,
    body: &str,
) -> Answer {
    let mut req = Request::builder().method(method).uri(url);
    if let Some(c) = ctype {
        req = req.header("content-type", c);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request builds");
    let resp = client.request(req).await.expect("request succeeds");
    let status = resp.status();
    let version = resp.version();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("body reads")
        .to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("JSON body from {url}: {bytes:?}"));
    Answer {
        status,
        version,
        content_type,
        body,
    }
}

async fn get(client: &HttpClient, url: &str) -> Answer {
    call(client, Method::GET, url, None, "").await
}

async fn post_form(client: &HttpClient, url: &str, form: &str) -> Answer {
    call(
        client,
        Method::POST,
        url,
        Some("application/x-www-form-urlencoded"),
        form,
    )
    .await
}

fn rows(answer: &Answer) -> &Vec<Value> {
    answer.body["requests"].as_array().expect("requests array")
}

#[tokio::test]
async fn pagination_reads_2500_rows_in_pages_of_1000() {
    let twin = start().await;
    let client = h1();
    for _ in 0..2500 {
        let a = get(&client, &twin.url("/s/sbx/stripe/v1/customers")).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    let mut seen = Vec::new();
    let mut since = 0u64;
    let mut pages = 0;
    loop {
        let url = twin.url(&format!(
            "/s/sbx/stripe/veris/requests?limit=1000&order=asc&tier=handler&since_id={since}"
        ));
        let a = get(&client, &url).await;
        assert_eq!(a.status, StatusCode::OK);
        let page = rows(&a);
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 1000);
        pages += 1;
        for row in page {
            assert_eq!(row["tier"], "handler");
            assert_eq!(row["path"], "/v1/customers");
            seen.push(row["id"].as_u64().expect("numeric id"));
        }
        since = *seen.last().expect("non-empty page");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (1..=2500).collect::<Vec<u64>>());

    // The paging requests themselves are control rows with later ids.
    let a = get(&client, &twin.url("/s/sbx/stripe/veris/requests?limit=4")).await;
    let newest = rows(&a);
    assert_eq!(newest.len(), 4);
    assert!(newest
        .iter()
        .all(|r| r["tier"] == "control" && r["path"] == "/veris/requests"));
    let ids: Vec<u64> = newest
        .iter()
        .map(|r| r["id"].as_u64().expect("id"))
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] > w[1]),
        "default order is desc: {ids:?}"
    );
    assert_eq!(
        ids,
        vec![2504, 2503, 2502, 2501],
        "four page reads (the last one empty)"
    );
    let control = get(
        &client,
        &twin.url("/s/sbx/stripe/veris/requests?tier=control&limit=1000"),
    )
    .await;
    assert_eq!(
        rows(&control).len(),
        5,
        "the four page reads and the one above"
    );
    twin.stop().await;
}

#[tokio::test]
async fn malformed_query_values_answer_422_naming_the_parameter() {
    let twin = start().await;
    let client = h1();
    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("order=sideways", "order"),
        ("since_id=-1", "since_id"),
        ("since_id=x", "since_id"),
        ("tier=vendor", "tier"),
    ] {
        let a = get(
            &client,
            &twin.url(&format!("/s/sbx/stripe/veris/requests?{query}")),
        )
        .await;
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{query}");
        let detail = a.body["detail"].as_str().expect("detail string");
        assert!(detail.contains(param), "{query}: {detail}");
    }
    for ok in [
        "limit=1",
        "limit=1000",
        "order=asc",
        "order=desc",
        "since_id=0",
        "tier=delivery",
    ] {
        let a = get(
            &client,
            &twin.url(&format!("/s/sbx/stripe/veris/requests?{ok}")),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{ok}");
    }
    twin.stop().await;
}

#[tokio::test]
async fn control_rows_are_never_counted_as_handler() {
    let twin = start().await;
    let client = h1();
    let health = get(&client, &twin.url("/s/sbx/stripe/veris/health")).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body, json!({"status": "ok", "service": "stripe"}));
    assert_eq!(health.content_type, "application/json");
    let missing = get(&client, &twin.url("/s/sbx/stripe/veris/nope")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    post_form(
        &client,
        &twin.url("/s/sbx/stripe/v1/customers"),
        "email=a%40b.c",
    )
    .await;

    let all = get(&client, &twin.url("/s/sbx/stripe/veris/requests?order=asc")).await;
    let summary: Vec<(String, String, Value)> = rows(&all)
        .iter()
        .map(|r| {
            (
                r["tier"].as_str().unwrap_or("").to_string(),
                r["path"].as_str().unwrap_or("").to_string(),
                r["status"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "control".to_string(),
                "/veris/health".to_string(),
                json!(200)
            ),
            ("control".to_string(), "/veris/nope".to_string(), json!(404)),
            (
                "handler".to_string(),
                "/v1/customers".to_string(),
                json!(200)
            ),
        ]
    );
    let handler = get(
        &client,
        &twin.url("/s/sbx/stripe/veris/requests?tier=handler"),
    )
    .await;
    assert_eq!(rows(&handler).len(), 1);
    for row in rows(&all) {
        let ts = row["ts"].as_str().expect("ts");
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.',
            "RFC 3339 with ms: {ts}"
        );
        assert!(row["duration_ms"].is_u64());
        assert_eq!(
            row["method"],
            if row["path"] == "/v1/customers" {
                "POST"
            } else {
                "GET"
            }
        );
    }
    // Another service of the same sandbox has its own counter and log.
    let other = get(&client, &twin.url("/s/sbx/google-calendar/veris/requests")).await;
    assert!(rows(&other).is_empty());
    twin.stop().await;
}

#[tokio::test]
async fn fault_rows_are_tiered_fault() {
    let fixtures = Fixtures::from_json(
        r#"[{"service":"acme","method":"GET","path":"/slow","fault":{"hang_ms":1,"status":429}},
            {"service":"acme","method":"GET","path":"/slow-ok","fault":{"hang_ms":1},"body":{"ok":true}}]"#,
    )
    .expect("fixtures load");
    let mut all = Fixtures::builtin();
    all.extend(fixtures);
    let twin = start_with(
        TwinOptions {
            fixtures: all,
            sandbox: None,
            log: None,
            credential: None,
        },
        None,
    )
    .await;
    let client = h1();

    let a = post_form(&client, &twin.url("/s/sbx/stripe/v1/test/fault/503"), "").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body["error"]["type"], "api_error");
    let a = post_form(&client, &twin.url("/s/sbx/stripe/v1/test/fault/429"), "").await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.body["error"]["code"], "rate_limit");
    let a = get(&client, &twin.url("/s/sbx/acme/slow")).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.body["error"]["type"], "rate_limited");
    let a = get(&client, &twin.url("/s/sbx/acme/slow-ok")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, json!({"ok": true}));
    get(&client, &twin.url("/s/sbx/acme/nothing-here")).await;

    let stripe = get(
        &client,
        &twin.url("/s/sbx/stripe/veris/requests?tier=fault&order=asc"),
    )
    .await;
    let statuses: Vec<&Value> = rows(&stripe).iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, vec![&json!(503), &json!(429)]);
    let acme = get(&client, &twin.url("/s/sbx/acme/veris/requests?order=asc")).await;
    let tiers: Vec<(&str, u64)> = rows(&acme)
        .iter()
        .map(|r| {
            (
                r["tier"].as_str().unwrap_or(""),
                r["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        tiers,
        vec![("fault", 429), ("fault", 200), ("handler", 404)]
    );
    twin.stop().await;
}

#[tokio::test]
async fn http1_and_h2c_both_work() {
    let twin = start().await;
    let a = get(&h1(), &twin.url("/s/sbx/stripe/veris/health")).await;
    assert_eq!((a.status, a.version), (StatusCode::OK, Version::HTTP_11));
    let b = get(&h2c(), &twin.url("/s/sbx/stripe/veris/health")).await;
    assert_eq!((b.status, b.version), (StatusCode::OK, Version::HTTP_2));
    assert_eq!(b.body["service"], "stripe");
    let c = post_form(
        &h2c(),
        &twin.url("/s/sbx/stripe/v1/charges"),
        "amount=500&currency=eur",
    )
    .await;
    assert_eq!((c.status, c.version), (StatusCode::OK, Version::HTTP_2));
    assert_eq!(c.body["amount"], 500);
    twin.stop().await;
}

fn tls_pair() -> (Arc<rustls::ServerConfig>, rustls::RootCertStore) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .expect("self-signed cert");
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .expect("server config");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).expect("root added");
    (Arc::new(server), roots)
}

async fn tls_connect(
    addr: SocketAddr,
    roots: rustls::RootCertStore,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
    tls
}

fn health_request() -> Request<Full<Bytes>> {
    Request::builder()
        .uri("https://localhost/s/sbx/stripe/veris/health")
        .body(Full::new(Bytes::new()))
        .expect("request builds")
}

#[tokio::test]
async fn h2_and_http1_over_tls_with_alpn() {
    let (server, roots) = tls_pair();
    let twin = start_with(
        TwinOptions {
            fixtures: Fixtures::builtin(),
            sandbox: None,
            log: None,
            credential: None,
        },
        Some(server),
    )
    .await;

    let tls = tls_connect(twin.addr, roots.clone(), b"h2").await;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let resp = send
        .send_request(health_request())
        .await
        .expect("h2 request");
    assert_eq!(
        (resp.status(), resp.version()),
        (StatusCode::OK, Version::HTTP_2)
    );
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.expect("body").to_bytes())
            .expect("json");
    assert_eq!(body, json!({"status": "ok", "service": "stripe"}));
    drop(send);
    let _ = driver.await;

    let tls = tls_connect(twin.addr, roots, b"http/1.1").await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1 handshake");
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .uri("/s/sbx/stripe/veris/health")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .expect("request builds");
    let resp = send.send_request(req).await.expect("h1 request");
    assert_eq!(
        (resp.status(), resp.version()),
        (StatusCode::OK, Version::HTTP_11)
    );
    drop(send);
    let _ = driver.await;
    twin.stop().await;
}

#[tokio::test]
async fn fixture_templating_echoes_request_fields() {
    let fixtures = Fixtures::from_json(
        r#"{"services": {"acme": {"errors": "generic"}},
            "fixtures": [{"service": "acme", "method": "POST", "path": "/things/{id}", "status": 201,
              "headers": {"x-thing": "thing-{{param.id}}"},
              "body": {"id": "{{param.id}}", "amount": "{{int form.amount}}", "raw": "{{form.amount}}",
                       "field": "{{json.field}}", "nested": "{{json.a.b}}", "made": "{{id \"th_\"}}",
                       "label": "{{param.id}}/{{form.amount}}", "q": "{{query.mode}}", "meta": "{{form.metadata}}"}}]}"#,
    )
    .expect("fixtures load");
    let twin = start_with(
        TwinOptions {
            fixtures,
            sandbox: None,
            log: None,
            credential: None,
        },
        None,
    )
    .await;
    let client = h1();

    let url = twin.url("/s/sbx/acme/things/t%201?mode=fast");
    let a = post_form(&client, &url, "amount=1200&metadata[k]=v").await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.body["id"], "t 1");
    assert_eq!(a.body["amount"], 1200);
    assert_eq!(a.body["raw"], "1200");
    assert_eq!(a.body["label"], "t 1/1200");
    assert_eq!(a.body["q"], "fast");
    assert_eq!(a.body["meta"], json!({"k": "v"}));
    assert_eq!(a.body["field"], Value::Null);
    let made = a.body["made"].as_str().expect("generated id");
    assert!(made.starts_with("th_") && made.len() == 27, "{made}");

    let b = call(
        &client,
        Method::POST,
        &url,
        Some("application/json"),
        r#"{"field": [1, 2], "a": {"b": "deep"}, "amount": 7}"#,
    )
    .await;
    assert_eq!(b.body["field"], json!([1, 2]));
    assert_eq!(b.body["nested"], "deep");
    assert_eq!(b.body["amount"], 7);
    assert_ne!(b.body["made"], a.body["made"]);

    let raw = Request::builder()
        .method(Method::POST)
        .uri(&url)
        .body(Full::new(Bytes::from_static(b"amount=1")))
        .expect("request builds");
    let resp = client.request(raw).await.expect("request succeeds");
    assert_eq!(
        resp.headers().get("x-thing").and_then(|v| v.to_str().ok()),
        Some("thing-t 1")
    );
    twin.stop().await;
}

#[tokio::test]
async fn stripe_create_then_read_customers_and_charges() {
    let twin = start().await;
    let client = h2c();
    let base = twin.url("/s/sbx/stripe");

    let c1 = post_form(
        &client,
        &format!("{base}/v1/customers"),
        "email=jenny%40example.com&name=Jenny+Rosen",
    )
    .await;
    assert_eq!(c1.status, StatusCode::OK);
    assert_eq!(c1.content_type, "application/json");
    let cus = c1.body["id"].as_str().expect("customer id").to_string();
    assert!(cus.starts_with("cus_"));
    assert_eq!(
        (
            c1.body["object"].as_str(),
            c1.body["email"].as_str(),
            c1.body["name"].as_str()
        ),
        (
            Some("customer"),
            Some("jenny@example.com"),
            Some("Jenny Rosen")
        )
    );
    assert!(c1.body["created"]
        .as_i64()
        .is_some_and(|t| t > 1_600_000_000));
    let c2 = call(
        &client,
        Method::POST,
        &format!("{base}/v1/customers"),
        Some("application/json"),
        r#"{"email":"b@example.com"}"#,
    )
    .await;
    let cus2 = c2.body["id"].as_str().expect("customer id").to_string();

    let read = get(&client, &format!("{base}/v1/customers/{cus}")).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body, c1.body);
    let list = get(&client, &format!("{base}/v1/customers")).await;
    assert_eq!(list.body["object"], "list");
    assert_eq!(list.body["has_more"], false);
    assert_eq!(list.body["url"], "/v1/customers");
    let ids: Vec<&str> = list.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        vec![cus2.as_str(), cus.as_str()],
        "newest first, as Stripe lists"
    );

    let charge = post_form(
        &client,
        &format!("{base}/v1/charges"),
        &format!("amount=2000&currency=usd&customer={cus}&metadata[order]=42"),
    )
    .await;
    assert_eq!(charge.status, StatusCode::OK);
    let ch = charge.body["id"].as_str().expect("charge id").to_string();
    assert!(ch.starts_with("ch_"));
    assert_eq!(charge.body["object"], "charge");
    assert_eq!(charge.body["amount"], 2000);
    assert_eq!(charge.body["currency"], "usd");
    assert_eq!(charge.body["customer"], cus.as_str());
    assert_eq!(charge.body["status"], "succeeded");
    assert_eq!(charge.body["paid"], true);
    assert_eq!(charge.body["metadata"], json!({"order": "42"}));
    let read = get(&client, &format!("{base}/v1/charges/{ch}")).await;
    assert_eq!(read.body, charge.body);

    let pi = post_form(
        &client,
        &format!("{base}/v1/payment_intents"),
        "amount=99&currency=gbp",
    )
    .await;
    assert_eq!(pi.body["object"], "payment_intent");
    assert!(pi.body["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("pi_")));

    let missing = get(&client, &format!("{base}/v1/customers/cus_x")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(
        missing.body,
        json!({"error": {"type": "invalid_request_error", "code": "resource_missing", "message": "No such customer: 'cus_x'", "param": "id"}})
    );
    let missing = get(&client, &format!("{base}/v1/charges/ch_x")).await;
    assert_eq!(missing.body["error"]["message"], "No such charge: 'ch_x'");

    // Another sandbox does not see these objects.
    let other = get(
        &client,
        &twin.url(&format!("/s/other/stripe/v1/customers/{cus}")),
    )
    .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    twin.stop().await;
}

#[tokio::test]
async fn calendar_create_then_list() {
    let twin = start().await;
    let client = h1();
    let events = twin.url("/s/sbx/google-calendar/calendar/v3/calendars/primary/events");
    let body = r#"{"summary":"Standup","start":{"dateTime":"2026-01-05T09:00:00Z"},"end":{"dateTime":"2026-01-05T09:15:00Z"}}"#;
    let created = call(
        &client,
        Method::POST,
        &events,
        Some("application/json"),
        body,
    )
    .await;
    assert_eq!(created.status, StatusCode::OK);
    assert_eq!(created.body["kind"], "calendar#event");
    assert_eq!(created.body["summary"], "Standup");
    assert_eq!(
        created.body["start"],
        json!({"dateTime": "2026-01-05T09:00:00Z"})
    );
    let id = created.body["id"].as_str().expect("event id").to_string();

    let list = get(&client, &events).await;
    assert_eq!(list.body["kind"], "calendar#events");
    assert_eq!(list.body["items"], json!([created.body.clone()]));
    let one = get(&client, &format!("{events}/{id}")).await;
    assert_eq!(one.body, created.body);
    let elsewhere = get(
        &client,
        &twin.url("/s/sbx/google-calendar/calendar/v3/calendars/other/events"),
    )
    .await;
    assert_eq!(elsewhere.body["items"], json!([]));
    let missing = get(&client, &format!("{events}/nope")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["status"], "NOT_FOUND");
    twin.stop().await;
}

#[tokio::test]
async fn unknown_routes_answer_vendor_shaped_404() {
    let twin = start().await;
    let client = h1();
    let stripe = get(&client, &twin.url("/s/sbx/stripe/v1/x")).await;
    assert_eq!(stripe.status, StatusCode::NOT_FOUND);
    assert_eq!(stripe.body["error"]["type"], "invalid_request_error");
    let msg = stripe.body["error"]["message"].as_str().expect("message");
    assert!(
        msg.starts_with("Unrecognized request URL (GET: /v1/x)"),
        "{msg}"
    );
    let wrong_method = call(
        &client,
        Method::DELETE,
        &twin.url("/s/sbx/stripe/v1/charges"),
        None,
        "",
    )
    .await;
    assert_eq!(wrong_method.status, StatusCode::NOT_FOUND);

    let google = get(
        &client,
        &twin.url("/s/sbx/google-calendar/calendar/v3/nope"),
    )
    .await;
    assert_eq!(google.status, StatusCode::NOT_FOUND);
    assert_eq!(google.body["error"]["code"], 404);
    assert_eq!(google.body["error"]["status"], "NOT_FOUND");
    let generic = get(&client, &twin.url("/s/sbx/hubspot/crm/v3/objects")).await;
    assert_eq!(generic.status, StatusCode::NOT_FOUND);
    assert_eq!(generic.body["error"]["type"], "not_found");
    assert!(generic.body["error"]["message"].is_string());

    let rows_now = get(&client, &twin.url("/s/sbx/stripe/veris/requests?order=asc")).await;
    let first = &rows(&rows_now)[0];
    assert_eq!(
        (&first["tier"], &first["status"], &first["path"]),
        (&json!("handler"), &json!(404), &json!("/v1/x"))
    );
    twin.stop().await;
}

#[tokio::test]
async fn oversized_bodies_get_413_and_foreign_sandboxes_404() {
    let twin = start_with(
        TwinOptions {
            fixtures: Fixtures::builtin(),
            sandbox: Some("sbx".into()),
            log: None,
            credential: None,
        },
        None,
    )
    .await;
    let client = h1();
    let big = "a=".to_string() + &"x".repeat(1024 * 1024 + 1);
    let a = post_form(&client, &twin.url("/s/sbx/stripe/v1/customers"), &big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(a.body["error"]["type"], "invalid_request_error");

    let foreign = get(&client, &twin.url("/s/elsewhere/stripe/veris/health")).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    assert!(foreign.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("elsewhere")));
    let not_twin = get(&client, &twin.url("/v1/charges")).await;
    assert_eq!(not_twin.status, StatusCode::NOT_FOUND);

    let log = get(
        &client,
        &twin.url("/s/sbx/stripe/veris/requests?tier=handler"),
    )
    .await;
    assert_eq!(rows(&log).len(), 1);
    assert_eq!(rows(&log)[0]["status"], 413);
    let foreign_log = get(&client, &twin.url("/s/elsewhere/stripe/veris/requests")).await;
    assert_eq!(foreign_log.status, StatusCode::NOT_FOUND);
    twin.stop().await;
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn restart_with_log_keeps_rows_and_continues_ids() {
    let path = std::env::temp_dir().join(format!(
        "veris-twin-log-{}-{:?}.jsonl",
        std::process::id(),
        std::thread::current().id()
    ));
    let _cleanup = TempFile(path.clone());
    let _ = std::fs::remove_file(&path);
    let options = || TwinOptions {
        fixtures: Fixtures::builtin(),
        sandbox: None,
        log: Some(path.clone()),
        credential: None,
    };
    let client = h1();

    let first = start_with(options(), None).await;
    for _ in 0..3 {
        post_form(&client, &first.url("/s/sbx/stripe/v1/charges"), "amount=1").await;
    }
    get(
        &client,
        &first.url("/s/sbx/google-calendar/calendar/v3/calendars/p/events"),
    )
    .await;
    let before = get(
        &client,
        &first.url("/s/sbx/stripe/veris/requests?order=asc"),
    )
    .await;
    let before_rows = rows(&before).clone();
    assert_eq!(before_rows.len(), 3);
    first.stop().await;

    // Simulate a crash mid-write: a torn last line must not stop the reload.
    let mut text = std::fs::read_to_string(&path).expect("log written");
    assert_eq!(
        text.lines().count(),
        5,
        "3 charges, 1 calendar, 1 control read: {text}"
    );
    text.push_str("{\"sandbox\":\"sbx\",\"serv");
    std::fs::write(&path, text).expect("torn line appended");

    let second = start_with(options(), None).await;
    let a = post_form(&client, &second.url("/s/sbx/stripe/v1/charges"), "amount=2").await;
    assert_eq!(a.status, StatusCode::OK);
    let after = get(
        &client,
        &second.url("/s/sbx/stripe/veris/requests?order=asc&limit=1000"),
    )
    .await;
    let after_rows = rows(&after);
    assert_eq!(&after_rows[..3], &before_rows[..]);
    let ids: Vec<u64> = after_rows
        .iter()
        .map(|r| r["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(
        ids,
        vec![1, 2, 3, 4, 5],
        "control read 4 from the first run, new charge 5"
    );
    assert_eq!(after_rows[4]["path"], "/v1/charges");
    let cal = get(
        &client,
        &second.url("/s/sbx/google-calendar/veris/requests?order=asc"),
    )
    .await;
    assert_eq!(rows(&cal)[0]["id"], 1);
    second.stop().await;

    let text = std::fs::read_to_string(&path).expect("log readable");
    for line in text
        .lines()
        .filter(|l| !l.starts_with("{\"sandbox\":\"sbx\",\"serv\"") && l.ends_with('}'))
    {
        let v: Value = serde_json::from_str(line).expect("each complete line is JSON");
        assert!(v["sandbox"].is_string() && v["service"].is_string() && v["id"].is_u64());
    }
}

#[tokio::test]
async fn serve_returns_after_shutdown() {
    let twin = start().await;
    let a = get(&h1(), &twin.url("/s/sbx/stripe/veris/health")).await;
    assert_eq!(a.status, StatusCode::OK);
    let addr = twin.addr;
    twin.stop().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed after shutdown"
    );
}

/// What a `veris serve` hands its built-in twin: 64 hex digits.
const CREDENTIAL: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// A request with extra headers; the answer and its raw body bytes.
async fn call_with_headers(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Bytes) {
    let mut req = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request builds");
    let resp = client.request(req).await.expect("request succeeds");
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("body reads")
        .to_bytes();
    (status, bytes)
}

#[tokio::test]
async fn with_a_credential_only_the_proxy_can_write_rows() {
    let twin = start_with(
        TwinOptions {
            fixtures: Fixtures::builtin(),
            sandbox: Some("sbx".into()),
            log: None,
            credential: Some(CREDENTIAL.into()),
        },
        None,
    )
    .await;
    let client = h1();
    let charges = twin.url("/s/sbx/stripe/v1/charges");
    let bearer = format!("Bearer {CREDENTIAL}");
    let same_length_wrong = format!("Bearer {}", "0".repeat(CREDENTIAL.len()));
    let prefix_only = format!("Bearer {}", &CREDENTIAL[..32]);
    let longer = format!("Bearer {CREDENTIAL}0");
    let basic = format!("Basic {CREDENTIAL}");
    // What a workload could try: nothing, guesses, the right value under
    // another scheme or in the header the proxy uses for the client's own
    // authorization, and a foreign sandbox (which must not even be named).
    let attempts: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no credential", vec![]),
        (
            "wrong, same length",
            vec![("authorization", &same_length_wrong)],
        ),
        ("a prefix of it", vec![("authorization", &prefix_only)]),
        ("it plus one more byte", vec![("authorization", &longer)]),
        ("empty bearer", vec![("authorization", "Bearer ")]),
        ("another scheme", vec![("authorization", &basic)]),
        (
            "in x-veris-original-authorization",
            vec![("x-veris-original-authorization", &bearer)],
        ),
    ];
    for (what, headers) in &attempts {
        let (status, body) = call_with_headers(
            &client,
            Method::POST,
            &charges,
            headers,
            "amount=100&currency=usd",
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
        let v: Value = serde_json::from_slice(&body).expect("JSON 401");
        assert_eq!(v["error"], "twin_unauthorized", "{what}");
        assert!(
            v["message"].as_str().unwrap_or("").contains("Next:"),
            "{what}: {v}"
        );
    }
    let (status, _) = call_with_headers(
        &client,
        Method::POST,
        &twin.url("/s/other/stripe/v1/charges"),
        &[],
        "amount=1",
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a foreign sandbox is not named"
    );

    // The control surface stays readable without it, and no attempt left a row.
    let health = get(&client, &twin.url("/s/sbx/stripe/veris/health")).await;
    assert_eq!(health.status, StatusCode::OK);
    let vendor_rows = |a: &Answer| {
        rows(a)
            .iter()
            .filter(|r| r["tier"] != "control")
            .cloned()
            .collect::<Vec<Value>>()
    };
    let log = get(
        &client,
        &twin.url("/s/sbx/stripe/veris/requests?limit=1000"),
    )
    .await;
    assert_eq!(log.status, StatusCode::OK);
    assert!(vendor_rows(&log).is_empty(), "{:?}", log.body);

    // With it (the scheme is case-insensitive): served and logged.
    for auth in [bearer.clone(), format!("bearer {CREDENTIAL}")] {
        let (status, body) = call_with_headers(
            &client,
            Method::POST,
            &charges,
            &[("authorization", &auth)],
            "amount=100&currency=usd",
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let log = get(
        &client,
        &twin.url("/s/sbx/stripe/veris/requests?order=asc&limit=1000"),
    )
    .await;
    let written = vendor_rows(&log);
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(written
        .iter()
        .all(|r| r["path"] == "/v1/charges" && r["status"] == 200 && r["tier"] == "handler"));
    twin.stop().await;
}

#[tokio::test]
async fn with_a_credential_templates_see_the_clients_authorization_not_the_credential() {
    let fixtures = Fixtures::from_json(
        r#"[{"service": "acme", "method": "GET", "path": "/whoami",
             "headers": {"x-auth": "{{header.authorization}}"},
             "body": {"auth": "{{header.authorization}}", "moved": "{{header.x-veris-original-authorization}}"}}]"#,
    )
    .expect("fixtures load");
    let with = |credential: Option<&str>| TwinOptions {
        fixtures: fixtures.clone(),
        sandbox: None,
        log: None,
        credential: credential.map(str::to_string),
    };
    let bearer = format!("Bearer {CREDENTIAL}");
    let client = h1();

    // As the proxy sends it: its credential, the client's own value moved aside.
    let twin = start_with(with(Some(CREDENTIAL)), None).await;
    let url = twin.url("/s/sbx/acme/whoami");
    let req = Request::get(&url)
        .header("authorization", &bearer)
        .header("x-veris-original-authorization", "Bearer client-token-1")
        .body(Full::new(Bytes::new()))
        .expect("request builds");
    let resp = client.request(req).await.expect("request succeeds");
    assert_eq!(resp.status(), StatusCode::OK);
    let header = resp.headers().get("x-auth").cloned();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["auth"], "Bearer client-token-1");
    assert_eq!(v["moved"], Value::Null);
    assert_eq!(
        header.as_ref().and_then(|h| h.to_str().ok()),
        Some("Bearer client-token-1")
    );
    assert!(
        !String::from_utf8_lossy(&body).contains(CREDENTIAL),
        "the credential is never echoed"
    );

    // A client without authorization of its own: the template sees none.
    let (status, body) = call_with_headers(
        &client,
        Method::GET,
        &url,
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["auth"], Value::Null, "{v}");
    twin.stop().await;

    // Without a credential nothing is rewritten.
    let twin = start_with(with(None), None).await;
    let (_, body) = call_with_headers(
        &client,
        Method::GET,
        &twin.url("/s/sbx/acme/whoami"),
        &[("authorization", "Bearer direct")],
        "",
    )
    .await;
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["auth"], "Bearer direct");
    twin.stop().await;
}
