//! Body templates: JSON values whose strings may hold `{{…}}` placeholders.
//!
//! Templates are compiled once when fixtures load (so a typo fails at load, not on the
//! first request) and rendered per request against a [`Context`]. A string that is
//! exactly one placeholder renders to the placeholder's JSON value (so
//! `"{{int form.amount}}"` becomes a number and `"{{json.start}}"` an object); a
//! placeholder inside a longer string is spliced in as text (`null` → empty).
//!
//! Expressions:
//! - `param.NAME` — a `{NAME}` segment of the fixture path (percent-decoded);
//! - `form.A.B`, `json.A.B`, `body.A.B` — the parsed request body. Form bodies
//!   (Stripe-style, `metadata[k]=v`, `expand[]=x`) and JSON bodies parse into the same
//!   JSON value, so the three prefixes are aliases and a fixture works with both;
//! - `query.NAME`, `header.NAME`;
//! - `request.method`, `request.path`, `request.service`, `request.sandbox`;
//! - `id "prefix_"` — a fresh id (`prefix_` + 24 alphanumerics), `now` (unix seconds),
//!   `now_rfc3339`, `list` (the stored objects, in `list` fixtures);
//! - `int REF` (string → integer, else null), `default REF LITERAL` (LITERAL is a quoted
//!   string or any bare JSON token such as `0`, `true`, `{}`).

use std::collections::BTreeMap;

use http::HeaderMap;
use serde_json::{Map, Value};

/// A compiled JSON template.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Literal(Value),
    Str(StrTemplate),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

/// A compiled string: literal text interleaved with placeholders.
#[derive(Debug, Clone)]
pub(crate) struct StrTemplate {
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
enum Part {
    Lit(String),
    Expr(Expr),
}

#[derive(Debug, Clone)]
enum Expr {
    Ref(Ref),
    Id(String),
    Now,
    NowRfc3339,
    List,
    Int(Ref),
    Default(Ref, Value),
}

#[derive(Debug, Clone)]
enum Ref {
    Param(String),
    Body(Vec<String>),
    Query(String),
    Header(String),
    Request(RequestField),
}

#[derive(Debug, Clone, Copy)]
enum RequestField {
    Method,
    Path,
    Service,
    Sandbox,
}

/// What a template can see while rendering one request.
#[derive(Clone, Copy)]
pub(crate) struct Context<'a> {
    pub params: &'a BTreeMap<String, String>,
    pub body: &'a Value,
    pub query: &'a BTreeMap<String, String>,
    pub headers: &'a HeaderMap,
    pub method: &'a str,
    pub path: &'a str,
    pub service: &'a str,
    pub sandbox: &'a str,
    pub list: Option<&'a [Value]>,
    pub ids: &'a crate::twin::IdGen,
}

impl Node {
    pub(crate) fn compile(value: &Value) -> Result<Node, String> {
        Ok(match value {
            Value::String(s) => Node::Str(StrTemplate::compile(s)?),
            Value::Array(items) => {
                Node::Array(items.iter().map(Node::compile).collect::<Result<_, _>>()?)
            }
            Value::Object(map) => Node::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), Node::compile(v)?)))
                    .collect::<Result<_, String>>()?,
            ),
            other => Node::Literal(other.clone()),
        })
    }

    pub(crate) fn render(&self, cx: &Context<'_>) -> Value {
        match self {
            Node::Literal(v) => v.clone(),
            Node::Str(t) => t.render_value(cx),
            Node::Array(items) => Value::Array(items.iter().map(|n| n.render(cx)).collect()),
            Node::Object(fields) => {
                let mut map = Map::new();
                for (k, n) in fields {
                    map.insert(k.clone(), n.render(cx));
                }
                Value::Object(map)
            }
        }
    }

    /// Names of the path parameters this template refers to (for load-time checks).
    pub(crate) fn params(&self, out: &mut Vec<String>) {
        match self {
            Node::Literal(_) => {}
            Node::Str(t) => t.params(out),
            Node::Array(items) => items.iter().for_each(|n| n.params(out)),
            Node::Object(fields) => fields.iter().for_each(|(_, n)| n.params(out)),
        }
    }
}

impl StrTemplate {
    pub(crate) fn compile(s: &str) -> Result<StrTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                parts.push(Part::Lit(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let mut end = after
                .find("}}")
                .ok_or_else(|| format!("unclosed placeholder in {s:?}"))?;
            // In a run of braces the placeholder closes on the last two, so a literal
            // `{}` may end an expression: `{{default form.metadata {}}}`.
            while after.as_bytes().get(end + 2) == Some(&b'}') {
                end += 1;
            }
            parts.push(Part::Expr(parse_expr(after[..end].trim())?));
            rest = &after[end + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_string()));
        }
        Ok(StrTemplate { parts })
    }

    fn render_value(&self, cx: &Context<'_>) -> Value {
        match self.parts.as_slice() {
            [Part::Expr(e)] => eval(e, cx),
            [] => Value::String(String::new()),
            _ => Value::String(self.render_string(cx)),
        }
    }

    pub(crate) fn render_string(&self, cx: &Context<'_>) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Lit(s) => out.push_str(s),
                Part::Expr(e) => match eval(e, cx) {
                    Value::Null => {}
                    Value::String(s) => out.push_str(&s),
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        out
    }

    fn params(&self, out: &mut Vec<String>) {
        for part in &self.parts {
            if let Part::Expr(
                Expr::Ref(Ref::Param(p))
                | Expr::Int(Ref::Param(p))
                | Expr::Default(Ref::Param(p), _),
            ) = part
            {
                out.push(p.clone());
            }
        }
    }
}

fn parse_expr(text: &str) -> Result<Expr, String> {
    let tokens = tokenize(text)?;
    let mut it = tokens.into_iter();
    let Some(Token::Bare(head)) = it.next() else {
        return Err(format!("placeholder {{{{{text}}}}} must start with a name"));
    };
    let args: Vec<Token> = it.collect();
    let arity = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!("{head} takes {n} argument(s) in {{{{{text}}}}}"))
        }
    };
    let expr = match head.as_str() {
        "id" => match args.as_slice() {
            [] => Expr::Id(String::new()),
            [Token::Quoted(prefix)] => Expr::Id(prefix.clone()),
            _ => return Err(format!("id takes one quoted prefix in {{{{{text}}}}}")),
        },
        "now" => {
            arity(0)?;
            Expr::Now
        }
        "now_rfc3339" => {
            arity(0)?;
            Expr::NowRfc3339
        }
        "list" => {
            arity(0)?;
            Expr::List
        }
        "int" => match args.as_slice() {
            [Token::Bare(r)] => Expr::Int(parse_ref(r)?),
            _ => return Err(format!("int takes one reference in {{{{{text}}}}}")),
        },
        "default" => match args.as_slice() {
            [Token::Bare(r), lit] => {
                let value = match lit {
                    Token::Quoted(s) => Value::String(s.clone()),
                    Token::Bare(b) => serde_json::from_str(b).map_err(|_| {
                        format!("default literal {b:?} is not JSON in {{{{{text}}}}}")
                    })?,
                };
                Expr::Default(parse_ref(r)?, value)
            }
            _ => {
                return Err(format!(
                    "default takes a reference and a literal in {{{{{text}}}}}"
                ))
            }
        },
        _ => {
            arity(0)?;
            Expr::Ref(parse_ref(&head)?)
        }
    };
    Ok(expr)
}

fn parse_ref(text: &str) -> Result<Ref, String> {
    let mut segs = text.split('.');
    let scope = segs.next().unwrap_or_default();
    let rest: Vec<String> = segs.map(str::to_string).collect();
    if rest.is_empty() || rest.iter().any(String::is_empty) {
        return Err(format!("reference {text:?} needs a name after the scope"));
    }
    let single = |what: &str| {
        if rest.len() == 1 {
            Ok(rest[0].clone())
        } else {
            Err(format!("{what} reference {text:?} takes exactly one name"))
        }
    };
    Ok(match scope {
        "param" => Ref::Param(single("param")?),
        "form" | "json" | "body" => Ref::Body(rest),
        "query" => Ref::Query(single("query")?),
        "header" => Ref::Header(single("header")?.to_ascii_lowercase()),
        "request" => Ref::Request(match single("request")?.as_str() {
            "method" => RequestField::Method,
            "path" => RequestField::Path,
            "service" => RequestField::Service,
            "sandbox" => RequestField::Sandbox,
            other => return Err(format!("unknown request field {other:?}")),
        }),
        other => return Err(format!("unknown placeholder {other:?} (in {text:?})")),
    })
}

enum Token {
    Bare(String),
    Quoted(String),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(e) => s.push(e),
                        None => return Err(format!("unterminated string in {{{{{text}}}}}")),
                    },
                    Some(ch) => s.push(ch),
                    None => return Err(format!("unterminated string in {{{{{text}}}}}")),
                }
            }
            tokens.push(Token::Quoted(s));
        } else {
            let mut s = String::new();
            while let Some(&ch) = chars.peek() {
                if ch.is_whitespace() {
                    break;
                }
                s.push(ch);
                chars.next();
            }
            tokens.push(Token::Bare(s));
        }
    }
    Ok(tokens)
}

fn eval(expr: &Expr, cx: &Context<'_>) -> Value {
    match expr {
        Expr::Ref(r) => resolve(r, cx),
        Expr::Id(prefix) => Value::String(cx.ids.next(prefix)),
        Expr::Now => Value::from(time::OffsetDateTime::now_utc().unix_timestamp()),
        Expr::NowRfc3339 => Value::String(crate::log::rfc3339_now()),
        Expr::List => Value::Array(cx.list.map(<[Value]>::to_vec).unwrap_or_default()),
        Expr::Int(r) => match resolve(r, cx) {
            Value::String(s) => s
                .trim()
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or(Value::Null),
            Value::Number(n) if n.is_i64() || n.is_u64() => Value::Number(n),
            _ => Value::Null,
        },
        Expr::Default(r, lit) => match resolve(r, cx) {
            Value::Null => lit.clone(),
            v => v,
        },
    }
}

fn resolve(r: &Ref, cx: &Context<'_>) -> Value {
    let text = |s: Option<&String>| s.map_or(Value::Null, |s| Value::String(s.clone()));
    match r {
        Ref::Param(p) => text(cx.params.get(p)),
        Ref::Query(q) => text(cx.query.get(q)),
        Ref::Header(h) => cx
            .headers
            .get(h.as_str())
            .and_then(|v| v.to_str().ok())
            .map_or(Value::Null, |v| Value::String(v.to_string())),
        Ref::Body(path) => lookup_path(cx.body, path).cloned().unwrap_or(Value::Null),
        Ref::Request(f) => Value::String(
            match f {
                RequestField::Method => cx.method,
                RequestField::Path => cx.path,
                RequestField::Service => cx.service,
                RequestField::Sandbox => cx.sandbox,
            }
            .to_string(),
        ),
    }
}

/// Walks a dotted path through objects (by key) and arrays (by index).
pub(crate) fn lookup_path<'v, S: AsRef<str>>(value: &'v Value, path: &[S]) -> Option<&'v Value> {
    let mut cur = value;
    for seg in path {
        let seg = seg.as_ref();
        cur = match cur {
            Value::Object(map) => map.get(seg)?,
            Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: Value, body: Value) -> Value {
        let params = BTreeMap::from([("id".to_string(), "cus 1".to_string())]);
        let query = BTreeMap::new();
        let headers = HeaderMap::new();
        let ids = crate::twin::IdGen::new();
        let cx = Context {
            params: &params,
            body: &body,
            query: &query,
            headers: &headers,
            method: "POST",
            path: "/v1/x",
            service: "stripe",
            sandbox: "sbx",
            list: None,
            ids: &ids,
        };
        Node::compile(&template).expect("compiles").render(&cx)
    }

    #[test]
    fn whole_placeholder_keeps_type_and_embedded_splices_text() {
        let out = render(
            json!({"a": "{{int form.amount}}", "b": "x-{{param.id}}-{{json.n.k}}", "c": "{{json.n}}",
                   "d": "{{default form.missing \"usd\"}}", "e": "{{default form.m {}}}", "f": "{{form.missing}}"}),
            json!({"amount": "2000", "n": {"k": 5}}),
        );
        assert_eq!(
            out,
            json!({"a": 2000, "b": "x-cus 1-5", "c": {"k": 5}, "d": "usd", "e": {}, "f": null})
        );
    }

    #[test]
    fn ids_are_prefixed_and_unique() {
        let a = render(json!("{{id \"ch_\"}}"), json!({}));
        let b = render(json!("{{id \"ch_\"}}"), json!({}));
        let a = a.as_str().expect("string");
        assert!(a.starts_with("ch_") && a.len() == 27, "{a}");
        assert!(a[3..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(Some(a), b.as_str());
    }

    #[test]
    fn bad_templates_fail_to_compile() {
        for bad in [
            "{{nope.x}}",
            "{{param}}",
            "{{int}}",
            "{{id ch_}}",
            "{{form.a",
            "{{default form.a nope}}",
        ] {
            assert!(
                Node::compile(&json!(bad)).is_err(),
                "{bad} should not compile"
            );
        }
    }
}
