//! The gateway's connection cap (`veris gateway --max-connections`) is one
//! for both its listeners: a client holding the plain listener's share
//! cannot double what the gateway keeps open by using the TLS listener too.

use std::net::{SocketAddr, TcpStream};

use crate::support::gateway::*;
use crate::support::{self, skip};

#[test]
fn max_connections_is_one_cap_over_the_plain_and_the_tls_listener() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let gw = Gateway::start(
        "gw-cap",
        "127.0.0.1:0",
        &["--tls-listen", "127.0.0.1:0", "--max-connections", "2"],
    );
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let json = a.json.clone().unwrap();
    let https = json["https_proxy_url"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ca = gw.ca();

    // Under the cap, the TLS listener serves.
    let (_, status, stderr) = curl_charge_over_tls(&https, &ca, &ca);
    assert_eq!(status, "200", "below the cap: {stderr}");

    // Two idle connections on the plain listener take the whole cap (they
    // are held until the handshake timeout, 10 s, longer than this test
    // needs them).
    let plain: SocketAddr = gw.ready["listen"].as_str().unwrap().parse().unwrap();
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(plain).unwrap()).collect();
    // Accepted and counted before the next client comes: the listener
    // takes them in order, so a third plain connection queued behind them
    // is refused once they hold their slots.
    let probe = TcpStream::connect(plain).unwrap();
    probe
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 1];
    let closed = matches!(std::io::Read::read(&mut &probe, &mut buf), Ok(0) | Err(_));
    assert!(closed, "a third plain connection was kept over a cap of 2");

    let (_, status, stderr) = curl_charge_over_tls(&https, &ca, &ca);
    assert_ne!(
        status, "200",
        "the TLS listener served a client while the plain one held the whole --max-connections: {stderr}"
    );
    drop(held);
    drop(probe);
    // Freed: served again (the slots are given back as the held
    // connections' tasks see them closed).
    let mut served = false;
    for _ in 0..50 {
        if curl_charge_over_tls(&https, &ca, &ca).1 == "200" {
            served = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        served,
        "the TLS listener did not serve again once the plain connections closed"
    );
}
