//! Which addresses the gateway tier (G1) may dial for a sandbox. A gateway
//! is an SSRF target: a sandbox asks it to connect somewhere, and the
//! gateway sits on a network the sandbox must never reach — its own
//! loopback, its private network, the cloud metadata service. The defence
//! is smokescreen's (Stripe's egress proxy): resolve the name once, judge
//! each address with [`DialPolicy::check`], dial only an address that
//! passed (no DNS-rebinding window between check and dial), and refuse by
//! default every address that is not plainly on the public internet.
//!
//! Refused, by [`Class`] (from the IANA IPv4 and IPv6 Special-Purpose
//! Address Registries and the IPv6 address space registry):
//!
//! - loopback (127/8, ::1), unspecified and "this network" (0/8, ::), which
//!   connect to this host;
//! - private networks (10/8, 172.16/12, 192.168/16, unique local fc00::/7,
//!   deprecated site-local fec0::/10, local-use NAT64 64:ff9b:1::/48), CGNAT
//!   shared space (100.64/10), link-local (169.254/16 with the cloud metadata
//!   service at 169.254.169.254, fe80::/10);
//! - multicast (224/4, ff00::/8), broadcast (255.255.255.255);
//! - documentation (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32,
//!   3fff::/20), benchmarking (198.18/15, 2001:2::/48);
//! - reserved: IETF protocol assignments (192.0.0/24, 2001::/23), the
//!   deprecated 6to4 relay anycast (192.88.99/24), 240/4, discard-only
//!   100::/64, the dummy prefix 100:0:0:1::/64, SRv6 SIDs 5f00::/16, and
//!   every IPv6 address outside global unicast 2000::/3. The few anycast
//!   services IANA marks globally reachable inside 192.0.0/24 and 2001::/23
//!   (PCP, TURN, AMT, AS112, ORCHIDv2) are refused with their blocks: no
//!   API lives there, and the allow-list is the exception;
//! - Teredo (2001::/32), whose embedded addresses are obfuscated;
//! - an IPv6 address that embeds an IPv4 one — IPv4-mapped ::ffff:0:0/96,
//!   IPv4-compatible ::/96, IPv4-translated ::ffff:0:0:0/96, NAT64
//!   64:ff9b::/96, 6to4 2002::/16 — when the embedded address is refused by
//!   the same rules (`::ffff:127.0.0.1` is loopback,
//!   `64:ff9b::a9fe:a9fe` is the metadata service). A mapped or NAT64
//!   address embedding a public one is that public address and passes;
//!   a compatible or translated one is outside 2000::/3 and is refused;
//! - the gateway's own addresses ([`own_addresses`], passed in), compared
//!   as IPv4 when mapped or embedded.
//!
//! An allow-list ([`Cidr`], the gateway's `--allow-dial`) overrides every
//! refusal, for deliberate exceptions (tests use it for their loopback
//! targets). An entry matches the address itself or, for an IPv4-mapped
//! address, its IPv4 form (the same destination); other embeddings reach
//! another host (a NAT64 or 6to4 relay) and must be allowed as written.
//!
//! These rules govern dials made for a sandbox, its webhook deliveries
//! included (a sandbox's app URL reaches nothing its passthrough could
//! not). The gateway's own connections (the twin) are configured by the
//! operator and are not judged here. [`super::dial`] keeps its own,
//! narrower rule for the isolated tier (never this host, [`super::dial::is_this_host`]).

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address block: an address and a prefix length, with no host bits set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    const fn v4(a: [u8; 4], prefix: u8) -> Cidr {
        Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Cidr {
        let [a, b, c, d, e, f, g, h] = segments;
        Cidr {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    /// Whether `ip` is in the block (of the same family).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(net)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A block that does not parse, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not an address or an address block: {why} (write it as 10.0.0.0/8, 127.0.0.1/32 or ::1)")]
pub struct CidrError {
    pub input: String,
    pub why: String,
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `ADDR/PREFIX`, or a bare address (one host: /32 or /128).
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = |why: String| CidrError {
            input: s.to_string(),
            why,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| err(format!("{addr:?} is not an IPv4 or IPv6 address")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                match p.parse::<u8>() {
                    Ok(n) if n <= max => n,
                    _ => return Err(err(format!("the prefix length is over {max}"))),
                }
            }
            Some(p) => return Err(err(format!("the prefix length {p:?} is not a number"))),
        };
        let block = Cidr { addr, prefix };
        let network = Cidr {
            addr: match addr {
                IpAddr::V4(ip) => {
                    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                    IpAddr::V4(Ipv4Addr::from(u32::from(ip) & mask))
                }
                IpAddr::V6(ip) => {
                    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                    IpAddr::V6(Ipv6Addr::from(u128::from(ip) & mask))
                }
            },
            prefix,
        };
        if network != block {
            return Err(err(format!(
                "host bits are set after the prefix (the block is {network})"
            )));
        }
        Ok(block)
    }
}

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Loopback,
    /// The unspecified address and "this network" (0/8): they connect to
    /// this host.
    Unspecified,
    Private,
    /// 169.254/16 (the cloud metadata service) and fe80::/10.
    LinkLocal,
    /// CGNAT shared address space, 100.64/10.
    SharedAddressSpace,
    Multicast,
    Broadcast,
    Documentation,
    Benchmarking,
    /// Not for use on the internet: IETF protocol assignments, reserved
    /// space, IPv6 outside global unicast.
    Reserved,
    Teredo,
    /// One of the gateway's own addresses.
    OwnAddress,
}

impl Class {
    /// The class as a ledger line names it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Class::Loopback => "loopback",
            Class::Unspecified => "unspecified",
            Class::Private => "private",
            Class::LinkLocal => "link-local",
            Class::SharedAddressSpace => "cgnat",
            Class::Multicast => "multicast",
            Class::Broadcast => "broadcast",
            Class::Documentation => "documentation",
            Class::Benchmarking => "benchmarking",
            Class::Reserved => "reserved",
            Class::Teredo => "teredo",
            Class::OwnAddress => "own-address",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an IPv6 address carries an IPv4 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Embedding {
    /// ::ffff:0:0/96.
    Mapped,
    /// ::/96 (deprecated).
    Compatible,
    /// ::ffff:0:0:0/96 (RFC 2765, deprecated).
    Translated,
    /// 64:ff9b::/96 (RFC 6052).
    Nat64,
    /// 2002::/16 (RFC 3056).
    SixToFour,
}

impl Embedding {
    pub fn as_str(&self) -> &'static str {
        match self {
            Embedding::Mapped => "IPv4-mapped",
            Embedding::Compatible => "IPv4-compatible",
            Embedding::Translated => "IPv4-translated",
            Embedding::Nat64 => "NAT64",
            Embedding::SixToFour => "6to4",
        }
    }
}

/// A dial refused: the address, its class and, when the class is that of
/// an IPv4 address embedded in it, how and which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Refusal {
    pub ip: IpAddr,
    pub class: Class,
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl Refusal {
    fn describe(&self) -> String {
        let what = match self.class {
            Class::LinkLocal => "link-local (the cloud metadata service lives there)",
            Class::SharedAddressSpace => "CGNAT shared address space",
            Class::OwnAddress => "one of the gateway's own addresses",
            other => other.as_str(),
        };
        let subject = match self.embedded {
            Some((how, v4)) => format!("{} embeds {v4} ({}), which is", self.ip, how.as_str()),
            None => format!("{} is", self.ip),
        };
        format!(
            "{subject} {what}: the gateway does not dial it for a sandbox (allow it deliberately with --allow-dial {})",
            Cidr {
                addr: self.ip,
                prefix: if self.ip.is_ipv4() { 32 } else { 128 }
            }
        )
    }
}

/// The IPv4 blocks refused, most specific first where they nest.
const V4: &[(Cidr, Class)] = &[
    (Cidr::v4([0, 0, 0, 0], 8), Class::Unspecified),
    (Cidr::v4([10, 0, 0, 0], 8), Class::Private),
    (Cidr::v4([100, 64, 0, 0], 10), Class::SharedAddressSpace),
    (Cidr::v4([127, 0, 0, 0], 8), Class::Loopback),
    (Cidr::v4([169, 254, 0, 0], 16), Class::LinkLocal),
    (Cidr::v4([172, 16, 0, 0], 12), Class::Private),
    (Cidr::v4([192, 0, 0, 0], 24), Class::Reserved),
    (Cidr::v4([192, 0, 2, 0], 24), Class::Documentation),
    (Cidr::v4([192, 88, 99, 0], 24), Class::Reserved),
    (Cidr::v4([192, 168, 0, 0], 16), Class::Private),
    (Cidr::v4([198, 18, 0, 0], 15), Class::Benchmarking),
    (Cidr::v4([198, 51, 100, 0], 24), Class::Documentation),
    (Cidr::v4([203, 0, 113, 0], 24), Class::Documentation),
    (Cidr::v4([224, 0, 0, 0], 4), Class::Multicast),
    (Cidr::v4([255, 255, 255, 255], 32), Class::Broadcast),
    (Cidr::v4([240, 0, 0, 0], 4), Class::Reserved),
];

/// The IPv6 blocks refused (after the embedded IPv4 forms), most specific
/// first where they nest. Anything outside 2000::/3 is refused after these.
const V6: &[(Cidr, Class)] = &[
    (
        Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        Class::Private,
    ),
    (Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), Class::Reserved),
    (Cidr::v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64), Class::Reserved),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), Class::Teredo),
    (
        Cidr::v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48),
        Class::Benchmarking,
    ),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), Class::Reserved),
    (
        Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        Class::Documentation,
    ),
    (
        Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        Class::Documentation,
    ),
    (Cidr::v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), Class::Reserved),
    (Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), Class::Private),
    (
        Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        Class::LinkLocal,
    ),
    (Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), Class::Private),
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), Class::Multicast),
];

const GLOBAL_UNICAST: Cidr = Cidr::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

fn class_v4(ip: Ipv4Addr) -> Option<Class> {
    V4.iter()
        .find(|(block, _)| block.contains(IpAddr::V4(ip)))
        .map(|&(_, class)| class)
}

/// The IPv4 address `ip` carries, and how.
fn embedded(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let bits = u128::from(ip);
    let low = Ipv4Addr::from(bits as u32);
    let s = ip.segments();
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some((Embedding::Mapped, low)),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some((Embedding::Translated, low)),
        // :: and ::1 are judged as themselves before this.
        [0, 0, 0, 0, 0, 0, _, _] => Some((Embedding::Compatible, low)),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some((Embedding::Nat64, low)),
        [0x2002, a, b, ..] => Some((
            Embedding::SixToFour,
            Ipv4Addr::from((u32::from(a) << 16) | u32::from(b)),
        )),
        _ => None,
    }
}

/// The class `ip` is refused as, before the allow-list and own addresses.
fn classify(ip: IpAddr) -> Option<(Class, Option<(Embedding, Ipv4Addr)>)> {
    let ip = match ip {
        IpAddr::V4(v4) => return class_v4(v4).map(|c| (c, None)),
        IpAddr::V6(v6) => v6,
    };
    if ip.is_unspecified() {
        return Some((Class::Unspecified, None));
    }
    if ip.is_loopback() {
        return Some((Class::Loopback, None));
    }
    if let Some((how, v4)) = embedded(ip) {
        if let Some(class) = class_v4(v4) {
            return Some((class, Some((how, v4))));
        }
        // A public IPv4 address, mapped or behind the well-known NAT64
        // prefix (globally reachable), is that address.
        if matches!(how, Embedding::Mapped | Embedding::Nat64) {
            return None;
        }
    }
    let v6 = IpAddr::V6(ip);
    if let Some(&(_, class)) = V6.iter().find(|(block, _)| block.contains(v6)) {
        return Some((class, None));
    }
    if !GLOBAL_UNICAST.contains(v6) {
        return Some((Class::Reserved, None));
    }
    None
}

/// The rule for a sandbox's dials: the refusals above, the gateway's own
/// addresses, and the allow-list that overrides both.
#[derive(Debug, Clone, Default)]
pub struct DialPolicy {
    allow: Vec<Cidr>,
    own: Vec<IpAddr>,
}

impl DialPolicy {
    /// `allow`: the deliberate exceptions; `own`: the gateway's addresses
    /// ([`own_addresses`], plus any the operator knows it is reached at,
    /// such as a NAT's public address).
    pub fn new(allow: Vec<Cidr>, own: Vec<IpAddr>) -> DialPolicy {
        let own = own.into_iter().map(|ip| ip.to_canonical()).collect();
        DialPolicy { allow, own }
    }

    /// The allow-list.
    pub fn allowed(&self) -> &[Cidr] {
        &self.allow
    }

    /// Whether a sandbox's dial may go to `ip`.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        let canonical = ip.to_canonical();
        if self
            .allow
            .iter()
            .any(|block| block.contains(ip) || block.contains(canonical))
        {
            return Ok(());
        }
        if let Some((class, embedded)) = classify(ip) {
            return Err(Refusal {
                ip,
                class,
                embedded,
            });
        }
        let carried = match ip {
            IpAddr::V6(v6) => embedded(v6),
            IpAddr::V4(_) => None,
        };
        if self.own.contains(&canonical) {
            return Err(Refusal {
                ip,
                class: Class::OwnAddress,
                embedded: None,
            });
        }
        if let Some((how, v4)) = carried.filter(|(_, v4)| self.own.contains(&IpAddr::V4(*v4))) {
            return Err(Refusal {
                ip,
                class: Class::OwnAddress,
                embedded: Some((how, v4)),
            });
        }
        Ok(())
    }
}

/// This host's interface addresses (its network namespace), IPv4 and
/// IPv6, link-local included: the gateway's own addresses, read once when
/// it starts (the caller reads them again if interfaces change).
pub fn own_addresses() -> io::Result<Vec<IpAddr>> {
    crate::sys::interface_addresses()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn class_of(policy: &DialPolicy, s: &str) -> Option<Class> {
        policy.check(ip(s)).err().map(|r| r.class)
    }

    #[test]
    fn every_special_ipv4_block_is_refused_by_class_and_its_neighbours_pass() {
        let p = DialPolicy::default();
        use Class::*;
        for (addr, want) in [
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("1.0.0.1", None),
            ("8.8.8.8", None),
            ("9.255.255.255", None),
            ("10.0.0.0", Some(Private)),
            ("10.255.255.255", Some(Private)),
            ("11.0.0.0", None),
            ("100.63.255.255", None),
            ("100.64.0.0", Some(SharedAddressSpace)),
            ("100.127.255.255", Some(SharedAddressSpace)),
            ("100.128.0.0", None),
            ("126.255.255.255", None),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("128.0.0.0", None),
            ("169.253.255.255", None),
            ("169.254.169.254", Some(LinkLocal)),
            ("169.254.0.1", Some(LinkLocal)),
            ("169.255.0.0", None),
            ("172.15.255.255", None),
            ("172.16.0.0", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.0", None),
            ("192.0.0.8", Some(Reserved)),
            ("192.0.0.170", Some(Reserved)),
            ("192.0.1.1", None),
            ("192.0.2.1", Some(Documentation)),
            ("192.0.3.0", None),
            ("192.88.99.1", Some(Reserved)),
            ("192.167.255.255", None),
            ("192.168.1.1", Some(Private)),
            ("192.169.0.0", None),
            ("198.17.255.255", None),
            ("198.18.0.0", Some(Benchmarking)),
            ("198.19.255.255", Some(Benchmarking)),
            ("198.20.0.0", None),
            ("198.51.100.7", Some(Documentation)),
            ("203.0.113.9", Some(Documentation)),
            ("203.0.114.0", None),
            ("223.255.255.255", None),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.254", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
        ] {
            assert_eq!(class_of(&p, addr), want, "{addr}");
        }
    }

    #[test]
    fn every_special_ipv6_block_is_refused_by_class_and_global_unicast_passes() {
        let p = DialPolicy::default();
        use Class::*;
        for (addr, want) in [
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("2606:4700:4700::1111", None),
            ("2a00:1450:4001::200e", None),
            ("2000::", None),
            ("3ffe::1", None),
            ("1fff:ffff::1", Some(Reserved)),
            ("4000::1", Some(Reserved)),
            ("100::1", Some(Reserved)),
            ("100:0:0:1::1", Some(Reserved)),
            ("2001::1", Some(Teredo)),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Some(Teredo)),
            ("2001:1::1", Some(Reserved)),
            ("2001:2::1", Some(Benchmarking)),
            ("2001:4:112::1", Some(Reserved)),
            ("2001:20::1", Some(Reserved)),
            ("2001:1ff:ffff::1", Some(Reserved)),
            ("2001:200::1", None),
            ("2001:db8::1", Some(Documentation)),
            ("2001:db9::1", None),
            ("3fff::1", Some(Documentation)),
            ("3fff:fff::1", Some(Documentation)),
            ("3fff:1000::1", None),
            ("5f00::1", Some(Reserved)),
            ("64:ff9b:1::a00:1", Some(Private)),
            ("fc00::1", Some(Private)),
            ("fd12:3456::1", Some(Private)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(Private)),
            ("ff02::1", Some(Multicast)),
        ] {
            assert_eq!(class_of(&p, addr), want, "{addr}");
        }
    }

    #[test]
    fn an_embedded_ipv4_address_is_judged_by_the_ipv4_rules() {
        let p = DialPolicy::default();
        use Embedding::*;
        for (addr, class, how, v4) in [
            ("::ffff:127.0.0.1", Class::Loopback, Mapped, "127.0.0.1"),
            (
                "::ffff:169.254.169.254",
                Class::LinkLocal,
                Mapped,
                "169.254.169.254",
            ),
            ("::ffff:10.1.2.3", Class::Private, Mapped, "10.1.2.3"),
            ("::ffff:0.0.0.0", Class::Unspecified, Mapped, "0.0.0.0"),
            ("::127.0.0.1", Class::Loopback, Compatible, "127.0.0.1"),
            ("::ffff:0:a00:1", Class::Private, Translated, "10.0.0.1"),
            (
                "64:ff9b::a9fe:a9fe",
                Class::LinkLocal,
                Nat64,
                "169.254.169.254",
            ),
            ("64:ff9b::7f00:1", Class::Loopback, Nat64, "127.0.0.1"),
            (
                "64:ff9b::6440:1",
                Class::SharedAddressSpace,
                Nat64,
                "100.64.0.1",
            ),
            ("2002:7f00:1::", Class::Loopback, SixToFour, "127.0.0.1"),
            (
                "2002:a9fe:a9fe::1",
                Class::LinkLocal,
                SixToFour,
                "169.254.169.254",
            ),
            ("2002:c0a8:101::", Class::Private, SixToFour, "192.168.1.1"),
        ] {
            let r = p.check(ip(addr)).unwrap_err();
            assert_eq!(r.class, class, "{addr}");
            assert_eq!(r.embedded, Some((how, v4.parse().unwrap())), "{addr}");
        }
        // A public address, mapped, behind NAT64 or 6to4, passes; the
        // deprecated forms are outside global unicast.
        for addr in ["::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"] {
            assert_eq!(p.check(ip(addr)), Ok(()), "{addr}");
        }
        for addr in ["::8.8.8.8", "::ffff:0:808:808"] {
            assert_eq!(class_of(&p, addr), Some(Class::Reserved), "{addr}");
        }
    }

    #[test]
    fn the_allow_list_overrides_for_a_host_and_a_block() {
        let p = DialPolicy::new(
            vec![
                "127.0.0.1/32".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
                "::1".parse().unwrap(),
            ],
            vec![ip("127.0.0.1"), ip("10.9.9.9")],
        );
        for addr in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "10.0.0.1",
            "10.255.255.255",
            "10.9.9.9",
            "::1",
        ] {
            assert_eq!(p.check(ip(addr)), Ok(()), "{addr}");
        }
        for (addr, class) in [
            ("127.0.0.2", Class::Loopback),
            ("172.16.0.1", Class::Private),
            ("fe80::1", Class::LinkLocal),
            // Another embedding reaches another host: not allowed by 127.0.0.1/32.
            ("64:ff9b::7f00:1", Class::Loopback),
        ] {
            assert_eq!(class_of(&p, addr), Some(class), "{addr}");
        }
        // A public address that is not the gateway's passes.
        assert_eq!(p.check(ip("11.0.0.1")), Ok(()));
    }

    #[test]
    fn the_gateways_own_addresses_are_refused_in_any_form() {
        let p = DialPolicy::new(vec![], vec![ip("8.8.4.4"), ip("2606:4700::6810:84e5")]);
        for addr in ["8.8.4.4", "::ffff:8.8.4.4", "2606:4700::6810:84e5"] {
            assert_eq!(class_of(&p, addr), Some(Class::OwnAddress), "{addr}");
        }
        for addr in ["64:ff9b::808:404", "2002:808:404::"] {
            let r = p.check(ip(addr)).unwrap_err();
            assert_eq!(r.class, Class::OwnAddress, "{addr}");
            assert_eq!(
                r.embedded.map(|(_, v4)| v4),
                Some("8.8.4.4".parse().unwrap())
            );
        }
        assert_eq!(p.check(ip("8.8.8.8")), Ok(()));
        // Mapped own addresses given are compared as IPv4.
        let p = DialPolicy::new(vec![], vec![ip("::ffff:1.2.3.4")]);
        assert_eq!(class_of(&p, "1.2.3.4"), Some(Class::OwnAddress));
        // This host's addresses include its loopback.
        let own = own_addresses().unwrap();
        assert!(own.iter().any(|a| a.is_loopback()), "{own:?}");
    }

    #[test]
    fn blocks_parse_or_say_why() {
        for (s, shown) in [
            ("127.0.0.1/32", "127.0.0.1/32"),
            ("127.0.0.1", "127.0.0.1/32"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("::1", "::1/128"),
            ("fd00::/8", "fd00::/8"),
            ("::/0", "::/0"),
        ] {
            assert_eq!(s.parse::<Cidr>().unwrap().to_string(), shown, "{s}");
        }
        for (s, why) in [
            (
                "10.0.0.1/8",
                "host bits are set after the prefix (the block is 10.0.0.0/8)",
            ),
            ("10.0.0.0/33", "the prefix length is over 32"),
            ("::/129", "the prefix length is over 128"),
            ("10.0.0.0/", "the prefix length \"\" is not a number"),
            ("10.0.0.0/+8", "the prefix length \"+8\" is not a number"),
            ("10.0.0.0/8/8", "the prefix length \"8/8\" is not a number"),
            ("[::1]", "\"[::1]\" is not an IPv4 or IPv6 address"),
            (
                "fe80::1%eth0",
                "\"fe80::1%eth0\" is not an IPv4 or IPv6 address",
            ),
            ("localhost", "\"localhost\" is not an IPv4 or IPv6 address"),
            ("", "\"\" is not an IPv4 or IPv6 address"),
        ] {
            let e = s.parse::<Cidr>().unwrap_err();
            assert_eq!(e.why, why, "{s}");
            assert!(e.to_string().contains("write it as"), "{e}");
        }
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(ip("10.1.2.3")) && !c.contains(ip("11.0.0.0")));
        assert!(
            !c.contains(ip("::ffff:10.1.2.3")),
            "families do not mix in a block"
        );
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("255.255.255.255")));
    }

    #[test]
    fn a_refusal_says_what_and_how_to_allow_it() {
        let p = DialPolicy::default();
        let r = p.check(ip("64:ff9b::a9fe:a9fe")).unwrap_err();
        assert_eq!(
            r.to_string(),
            "64:ff9b::a9fe:a9fe embeds 169.254.169.254 (NAT64), which is link-local (the cloud metadata service lives there): the gateway does not dial it for a sandbox (allow it deliberately with --allow-dial 64:ff9b::a9fe:a9fe/128)"
        );
        let r = p.check(ip("10.0.0.1")).unwrap_err();
        assert!(r.to_string().starts_with("10.0.0.1 is private:"), "{r}");
    }
}
