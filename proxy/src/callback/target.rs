//! A `--webhook SERVICE=URL` value: where one service's events go
//! (`http://`, or `https://` delivered over TLS, [`super::tls`]).

/// Where one service's events are delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub service: String,
    /// `https://`: delivered over TLS, the app's certificate verified.
    pub tls: bool,
    /// `host:port` to dial (the port made explicit).
    pub authority: String,
    /// The URL's path (`/` when it had none).
    pub path: String,
    pub query: Option<String>,
}

impl Webhook {
    /// Parses `SERVICE=http(s)://HOST[:PORT]/PATH`; the error says what was
    /// wrong, for a message that ends with the syntax.
    pub fn parse(s: &str) -> Result<Webhook, String> {
        let (service, url) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} has no `=`"))?;
        let service = service.trim();
        if service.is_empty()
            || !service
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!("{service:?} is not a service name"));
        }
        let uri: http::Uri = url
            .trim()
            .parse()
            .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                return Err(format!(
                    "{url:?}: only http:// and https:// URLs are delivered to (not {other}://)"
                ))
            }
            None => return Err(format!("{url:?} has no http:// or https:// in front")),
        };
        let authority = uri
            .authority()
            .filter(|a| !a.host().is_empty() && !a.as_str().contains('@'))
            .ok_or_else(|| format!("{url:?} names no host (or carries credentials)"))?;
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Webhook {
            service: service.to_string(),
            tls,
            authority: format!("{host}:{port}"),
            path: uri.path().to_string(),
            query: uri.query().map(str::to_string),
        })
    }

    /// Whether the URL names this machine's loopback: `localhost` or a
    /// loopback address (what an isolated run's namespace has).
    pub fn loopback(&self) -> bool {
        let host = self
            .authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// The URL's host as written (`[::1]` with its brackets).
    pub fn host(&self) -> &str {
        self.authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h)
    }

    /// The URL as given back to a person (`http://host:port/path`).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        match &self.query {
            Some(q) => format!("{scheme}://{}{}?{q}", self.authority, self.path),
            None => format!("{scheme}://{}{}", self.authority, self.path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_parse_and_bad_ones_say_why() {
        let w = Webhook::parse("stripe=http://127.0.0.1:4242/webhook").expect("parses");
        assert_eq!(
            (
                w.service.as_str(),
                w.authority.as_str(),
                w.path.as_str(),
                w.query
            ),
            ("stripe", "127.0.0.1:4242", "/webhook", None)
        );
        let w = Webhook::parse("stripe=http://localhost/hooks?x=1").expect("parses");
        assert_eq!(w.authority, "localhost:80");
        assert_eq!(w.query.as_deref(), Some("x=1"));
        assert_eq!(w.url(), "http://localhost:80/hooks?x=1");
        let w = Webhook::parse("stripe=http://[::1]:9/").expect("parses");
        assert_eq!(w.authority, "[::1]:9");
        assert_eq!(w.host(), "[::1]");
        let w = Webhook::parse("stripe=https://4242-sbx.e2b.app/hooks").expect("parses");
        assert_eq!(
            (w.tls, w.authority.as_str()),
            (true, "4242-sbx.e2b.app:443")
        );
        assert_eq!(w.url(), "https://4242-sbx.e2b.app:443/hooks");
        let loopback = |url: &str| Webhook::parse(&format!("stripe={url}")).unwrap().loopback();
        for url in [
            "http://127.0.0.1:1/",
            "http://127.9.9.9/",
            "http://[::1]:9/",
            "http://LocalHost/",
        ] {
            assert!(loopback(url), "{url}");
        }
        for url in [
            "http://192.0.2.1:1/",
            "http://[::]:9/",
            "http://localhost.example/",
            "http://app/",
        ] {
            assert!(!loopback(url), "{url}");
        }
        for bad in [
            "stripe",
            "=http://127.0.0.1/",
            "str ipe=http://127.0.0.1/",
            "stripe=127.0.0.1:4242/webhook",
            "stripe=ftp://127.0.0.1/",
            "stripe=http:///x",
            "stripe=http://u:p@127.0.0.1/",
        ] {
            assert!(Webhook::parse(bad).is_err(), "{bad}");
        }
    }
}
