//! `veris demo`: the whole product offline in one command. Starts the built-in
//! twin and the proxy on loopback exactly as `veris run` does, in the same
//! tier `veris run` would pick here (isolated where the kernel allows it),
//! and runs a client behind it: `veris __demo-client`, which makes real HTTPS
//! requests the way a client in a sandbox would (a rustls client that trusts
//! only the generated CA). Then it prints the receipt and checks it.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::cmd::run::{RunArgs, TierArg};
use crate::runtime::stack::ProxyArgs;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// The proxy's flags, as `veris run` takes them.
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// The tier the demo's client runs in, as `veris run --tier`: auto picks
    /// what `veris run` would here (isolated where the kernel allows it).
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierArg,
    /// Not for demo (serve's transparent tier); accepted only to answer with
    /// what to do instead of a bare "unexpected argument".
    #[arg(long, hide = true)]
    pub transparent: bool,
}

pub async fn demo(mut args: DemoArgs) -> Result<u8> {
    // A throwaway state dir unless one is named, so the demo leaves nothing behind.
    let temp = if args.proxy.state_dir.is_none() && std::env::var_os("VERIS_STATE_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("veris-demo-{}", crate::util::random_hex(6)?));
        args.proxy.state_dir = Some(dir.clone());
        Some(dir)
    } else {
        None
    };
    let result = demo_in(&args.proxy, args.tier, temp.is_none()).await;
    if let Some(dir) = temp {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// The running binary, for the demo client's command.
const SELF_EXE: &str = "/proc/self/exe";

/// `veris run` of the demo client, with the demo's requirements.
fn run_args(proxy: &ProxyArgs, tier: TierArg, keep_ledger: bool) -> Result<RunArgs> {
    #[derive(clap::Parser)]
    struct Parse {
        #[command(flatten)]
        run: RunArgs,
    }
    use clap::Parser;
    // This binary by the kernel's own link to it, not by its path: an
    // isolated run has a private /tmp, where a binary under /tmp is not.
    let asked = clap::ValueEnum::to_possible_value(&tier)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    let mut run =
        Parse::try_parse_from(["veris", "--", SELF_EXE, "__demo-client", "--tier", &asked])
            .context("the demo's run arguments")?
            .run;
    run.proxy = proxy.clone();
    run.tier = tier;
    run.require.require_request = vec![
        "stripe POST /v1/customers".into(),
        "stripe POST /v1/charges".into(),
    ];
    run.require.require = vec!["stripe:3".into(), "google-calendar:1".into()];
    run.demo = Some(crate::cmd::run::DemoOutput { keep_ledger });
    Ok(run)
}

async fn demo_in(proxy: &ProxyArgs, tier: TierArg, keep_ledger: bool) -> Result<u8> {
    let code = crate::cmd::run::run(run_args(proxy, tier, keep_ledger)?).await?;
    crate::outln!(
        "\nYour own code: `veris run -- CMD` (e.g. `veris run -- curl https://api.stripe.com/v1/charges -d amount=1`)."
    );
    crate::outln!(
        "It runs CMD as the demo ran its client: isolated where the kernel allows it (a network"
    );
    crate::outln!(
        "namespace of its own where every connection, DNS query and QUIC packet goes to veris"
    );
    crate::outln!(
        "whatever the client does), else with the proxy variables and TCP confined to the proxy"
    );
    crate::outln!("by Landlock, and says so; --isolate makes that an error.");
    Ok(code)
}

/// `veris __demo-client`: the demo's workload, run by `veris run`. It finds
/// the proxy the way any client does: `HTTPS_PROXY` in the explicit tiers,
/// nothing at all when isolated (every connection reaches veris there), and
/// trusts only the veris CA (`NODE_EXTRA_CA_CERTS`, the bare CA).
/// `veris __demo-client`'s flags.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// The tier the demo was asked for, so that the client can say why it
    /// is not isolated.
    #[arg(long, value_enum, default_value = "auto")]
    tier: TierArg,
}

pub async fn client_main(args: ClientArgs) -> Result<u8> {
    let proxy = ["HTTPS_PROXY", "https_proxy"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
    let ca_path = std::env::var_os("NODE_EXTRA_CA_CERTS")
        .ok_or_else(|| anyhow!("NODE_EXTRA_CA_CERTS is not set: not started by `veris run`"))?;
    let pem = std::fs::read(&ca_path)
        .with_context(|| format!("reading the veris CA {}", ca_path.to_string_lossy()))?;
    let ca = CertificateDer::from_pem_slice(&pem)
        .with_context(|| format!("no certificate in {}", ca_path.to_string_lossy()))?;
    let proxy = match proxy {
        Some(url) => {
            let uri: http::Uri = url
                .parse()
                .with_context(|| format!("HTTPS_PROXY {url:?}"))?;
            let host = uri
                .host()
                .ok_or_else(|| anyhow!("HTTPS_PROXY {url:?} has no host"))?;
            let port = uri.port_u16().unwrap_or(80);
            let why = match args.tier {
                TierArg::Explicit => "the explicit tier, as asked with --tier explicit",
                TierArg::Confined => "the confined tier, as asked with --tier confined",
                TierArg::Auto | TierArg::Isolated => {
                    "not isolated: this machine cannot isolate it, and veris said why above"
                }
            };
            crate::outln!("veris demo: the client runs behind HTTPS_PROXY={url} ({why})");
            Some(format!("{host}:{port}"))
        }
        None => {
            crate::outln!(
                "veris demo: the client runs isolated: no proxy settings, its own network namespace, every connection goes to veris"
            );
            None
        }
    };
    crate::outln!(
        "client: rustls trusting only the veris CA ({})\n",
        ca_path.to_string_lossy()
    );
    calls(&Client { proxy, ca }).await?;
    Ok(0)
}

async fn calls(client: &Client) -> Result<()> {
    let (status, customer) = client
        .call(
            "api.stripe.com",
            "POST",
            "/v1/customers",
            Some("email=ada%40example.com&name=Ada+Lovelace"),
        )
        .await?;
    let customer_id = id_of(&customer)?;
    crate::outln!("  POST https://api.stripe.com/v1/customers -> {status} ({customer_id})");
    let form = format!("amount=2000&currency=usd&customer={customer_id}");
    let (status, charge) = client
        .call("api.stripe.com", "POST", "/v1/charges", Some(&form))
        .await?;
    let charge_id = id_of(&charge)?;
    crate::outln!(
        "  POST https://api.stripe.com/v1/charges -> {status} ({charge_id}, amount {})",
        charge["amount"]
    );
    let path = format!("/v1/charges/{charge_id}");
    let (status, read_back) = client.call("api.stripe.com", "GET", &path, None).await?;
    if read_back["id"] != charge["id"] {
        bail!(
            "the charge read back ({}) is not the one created ({charge_id})",
            read_back["id"]
        );
    }
    crate::outln!("  GET  https://api.stripe.com{path} -> {status} (same charge)");
    let path = "/calendar/v3/calendars/primary/events";
    let (status, events) = client.call("www.googleapis.com", "GET", path, None).await?;
    let n = events["items"].as_array().map(|a| a.len()).unwrap_or(0);
    crate::outln!("  GET  https://www.googleapis.com{path} -> {status} ({n} events)");
    Ok(())
}

fn id_of(v: &Value) -> Result<String> {
    v["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("the twin's answer has no id: {v}"))
}

/// A minimal HTTPS client: through the proxy with CONNECT when one is
/// given, else straight to the host (isolated: the redirect catches it).
struct Client {
    proxy: Option<String>,
    ca: CertificateDer<'static>,
}

/// The most bytes of one twin answer the demo reads.
const MAX_ANSWER: usize = 1 << 20;

impl Client {
    async fn call(
        &self,
        host: &str,
        method: &str,
        path: &str,
        form: Option<&str>,
    ) -> Result<(u16, Value)> {
        let authority = format!("{host}:443");
        let mut tcp = match &self.proxy {
            Some(proxy) => veris_admin_client::connect(proxy).await?,
            None => TcpStream::connect((host, 443))
                .await
                .with_context(|| format!("connecting to {host}:443"))?,
        };
        if let Some(proxy) = &self.proxy {
            veris_admin_client::connect_tunnel(&mut tcp, proxy, &authority).await?;
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone())?;
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(host.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS to {host} through the proxy"))?;
        let mut req = veris_admin_client::Request::new(method, path, host)
            .header(
                "user-agent",
                concat!("veris-demo/", env!("CARGO_PKG_VERSION")),
            )
            .bearer("sk_test_demo0000000000000000");
        if let Some(form) = form {
            req = req.body("application/x-www-form-urlencoded", form.as_bytes());
        }
        let answer = veris_admin_client::exchange(tls, &authority, &req, MAX_ANSWER).await?;
        let status = answer.status;
        let json: Value = serde_json::from_slice(&answer.body)
            .with_context(|| format!("{method} {host}{path} answered {status} with non-JSON"))?;
        if !(200..300).contains(&status) {
            bail!("{method} https://{host}{path} -> {status}: {json}");
        }
        Ok((status, json))
    }
}
