//! The names a CA may sign for: its X.509 name constraints (RFC 5280
//! §4.2.1.10), as the CA certificate carries them and as veris checks a
//! name against them before minting a leaf.
//!
//! A scope is a set of DNS subtrees (`stripe.com` permits `stripe.com` and
//! every name under it, the way clients read a permitted `dNSName`) and IP
//! subnets. In the certificate it becomes the permitted subtrees; an address
//! family with no permitted subnet is excluded whole (`0.0.0.0/0`, `::/0`),
//! so a stolen key cannot sign for any address veris never asked for. The
//! binary decides what goes in (the catalog, the routes, veris's own
//! names); this module only keeps, prints, encodes and checks it.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use rcgen::{CidrSubnet, GeneralSubtree, NameConstraints};

use crate::CaError;

/// An IP subnet: an address with its prefix length, host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subnet {
    addr: IpAddr,
    prefix: u8,
}

impl Subnet {
    /// `addr/prefix`, with the host bits of `addr` cleared; `None` when the
    /// prefix is longer than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Subnet> {
        let bits = bits(addr);
        let width = width(addr);
        if prefix > width {
            return None;
        }
        let addr = from_bits(addr, bits & mask(width, prefix));
        Some(Subnet { addr, prefix })
    }

    /// Whether `ip` is inside the subnet (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4()
            && bits(ip) & mask(width(ip), self.prefix) == bits(self.addr)
    }

    fn to_rcgen(self) -> CidrSubnet {
        CidrSubnet::from_addr_prefix(self.addr, self.prefix)
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn width(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_bits(like: IpAddr, bits: u128) -> IpAddr {
    match like {
        // The bits came from a v4 address masked to 32 bits or fewer.
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(bits as u32)),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(bits)),
    }
}

fn mask(width: u8, prefix: u8) -> u128 {
    let all: u128 = if width == 32 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    let host = u32::from(width - prefix.min(width));
    all & all.checked_shl(host).unwrap_or(0)
}

/// The names a CA may sign for. Empty until names are permitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    dns: BTreeSet<String>,
    ips: BTreeSet<Subnet>,
}

impl Scope {
    /// A scope permitting nothing yet.
    pub fn new() -> Scope {
        Scope::default()
    }

    /// A scope permitting each of `patterns` ([`Scope::permit`]).
    pub fn of<S: AsRef<str>>(patterns: &[S]) -> Result<Scope, CaError> {
        let mut scope = Scope::new();
        for p in patterns {
            scope.permit(p.as_ref())?;
        }
        Ok(scope)
    }

    /// Permits `pattern`: a host (`api.stripe.com`: it and the names under
    /// it), a route's wildcard (`*.stripe.com`: `stripe.com` and under it),
    /// an IP address (exactly it) or a subnet (`127.0.0.0/8`).
    pub fn permit(&mut self, pattern: &str) -> Result<(), CaError> {
        let invalid = || CaError::InvalidHost {
            host: pattern.to_owned(),
        };
        let trimmed = pattern.trim();
        if let Some((addr, prefix)) = trimmed.split_once('/') {
            let addr: IpAddr = addr.parse().map_err(|_| invalid())?;
            let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
            self.ips
                .insert(Subnet::new(addr, prefix).ok_or_else(invalid)?);
            return Ok(());
        }
        let name = trimmed.strip_prefix("*.").unwrap_or(trimmed);
        let name = crate::authority::normalize_host(name)?;
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                let whole = width(ip);
                self.ips.insert(Subnet::new(ip, whole).ok_or_else(invalid)?);
            }
            Err(_) => {
                self.dns.insert(name);
            }
        }
        Ok(())
    }

    /// Whether a leaf for `host` (a DNS name or an IP literal) is inside the
    /// scope, the way a client checking the constraints decides it.
    pub fn permits(&self, host: &str) -> bool {
        let Ok(host) = crate::authority::normalize_host(host) else {
            return false;
        };
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.ips.iter().any(|s| s.contains(ip));
        }
        self.dns
            .iter()
            .any(|tree| host == *tree || host.ends_with(&format!(".{tree}")))
    }

    /// The permitted subtrees, one per line when printed: DNS names in
    /// order, then subnets.
    pub fn subtrees(&self) -> Vec<String> {
        self.dns
            .iter()
            .cloned()
            .chain(self.ips.iter().map(Subnet::to_string))
            .collect()
    }

    /// The certificate extension: these subtrees permitted, and every
    /// address family without a permitted subnet excluded whole.
    pub(crate) fn to_rcgen(&self) -> Result<NameConstraints, CaError> {
        if self.dns.is_empty() {
            // No permitted dNSName would leave every DNS name permitted.
            return Err(CaError::EmptyScope);
        }
        let mut permitted: Vec<GeneralSubtree> = self
            .dns
            .iter()
            .map(|d| GeneralSubtree::DnsName(d.clone()))
            .collect();
        permitted.extend(
            self.ips
                .iter()
                .map(|s| GeneralSubtree::IpAddress(s.to_rcgen())),
        );
        let mut excluded = Vec::new();
        if !self.ips.iter().any(|s| s.addr.is_ipv4()) {
            excluded.push(GeneralSubtree::IpAddress(CidrSubnet::from_v4_prefix(
                [0; 4], 0,
            )));
        }
        if !self.ips.iter().any(|s| s.addr.is_ipv6()) {
            excluded.push(GeneralSubtree::IpAddress(CidrSubnet::from_v6_prefix(
                [0; 16], 0,
            )));
        }
        Ok(NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: excluded,
        })
    }

    /// The scope a CA certificate's name constraints permit, `None` when it
    /// has none (a CA made before veris constrained its CAs). Excluded
    /// subtrees are read as veris writes them: a whole address family.
    pub(crate) fn from_cert(
        x509: &x509_parser::certificate::X509Certificate<'_>,
    ) -> Result<Option<Scope>, String> {
        use x509_parser::extensions::GeneralName;
        let Some(ext) = x509
            .name_constraints()
            .map_err(|e| format!("name constraints: {e}"))?
        else {
            return Ok(None);
        };
        let mut scope = Scope::new();
        for subtree in ext.value.permitted_subtrees.iter().flatten() {
            match &subtree.base {
                GeneralName::DNSName(name) => {
                    scope.dns.insert(name.to_ascii_lowercase());
                }
                GeneralName::IPAddress(bytes) => {
                    if let Some(subnet) = subnet_of(bytes) {
                        scope.ips.insert(subnet);
                    }
                }
                _ => {}
            }
        }
        Ok(Some(scope))
    }
}

/// An iPAddress subtree's address-and-mask octets as a subnet.
fn subnet_of(bytes: &[u8]) -> Option<Subnet> {
    let (addr, mask): (IpAddr, &[u8]) = match bytes.len() {
        8 => (
            IpAddr::from(<[u8; 4]>::try_from(&bytes[..4]).ok()?),
            &bytes[4..],
        ),
        32 => (
            IpAddr::from(<[u8; 16]>::try_from(&bytes[..16]).ok()?),
            &bytes[16..],
        ),
        _ => return None,
    };
    let prefix: u32 = mask.iter().map(|b| b.count_ones()).sum();
    Subnet::new(addr, u8::try_from(prefix).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(patterns: &[&str]) -> Scope {
        let mut s = Scope::new();
        for p in patterns {
            s.permit(p).unwrap();
        }
        s
    }

    #[test]
    fn a_dns_subtree_permits_itself_and_names_under_it_only() {
        let s = scope(&["api.stripe.com", "*.example.com"]);
        assert!(s.permits("api.stripe.com"));
        assert!(s.permits("API.Stripe.com."));
        assert!(s.permits("x.api.stripe.com"));
        assert!(!s.permits("stripe.com"));
        assert!(!s.permits("evilapi.stripe.com"));
        assert!(!s.permits("api.stripe.com.evil.org"));
        assert!(s.permits("example.com"));
        assert!(s.permits("a.b.example.com"));
        assert!(!s.permits("notexample.com"));
        assert!(!s.permits("127.0.0.1"));
    }

    #[test]
    fn subnets_permit_their_addresses_only() {
        let s = scope(&["127.0.0.0/8", "::1", "10.1.2.3", "localhost"]);
        assert!(s.permits("127.9.9.9"));
        assert!(s.permits("[::1]"));
        assert!(s.permits("10.1.2.3"));
        assert!(!s.permits("10.1.2.4"));
        assert!(!s.permits("128.0.0.1"));
        assert!(!s.permits("::2"));
        assert!(!s.permits("::ffff:127.0.0.1"));
        assert_eq!(
            s.subtrees(),
            ["localhost", "10.1.2.3/32", "127.0.0.0/8", "::1/128"]
        );
    }

    #[test]
    fn bad_patterns_are_refused() {
        let mut s = Scope::new();
        assert!(s.permit("bad host").is_err());
        assert!(s.permit("10.0.0.0/33").is_err());
        assert!(s.permit("10.0.0.0/x").is_err());
        assert!(s.permit("").is_err());
        assert_eq!(
            Subnet::new("10.9.9.9".parse().unwrap(), 8)
                .unwrap()
                .to_string(),
            "10.0.0.0/8"
        );
    }

    #[test]
    fn a_scope_without_names_is_refused() {
        assert!(matches!(
            scope(&["127.0.0.1"]).to_rcgen(),
            Err(CaError::EmptyScope)
        ));
    }
}
