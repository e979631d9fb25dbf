//! A node's network address as the cluster file writes it: an IP address or
//! a host name, and a port (`"10.0.0.1:7700"`, `"[fd00::1]:7700"`,
//! `"host0:7700"`).
//!
//! A name is kept as a name and resolved where the address is used: when a
//! daemon binds it, and each time a peer dials it (a new gRPC connection, a
//! data-channel range), so a host that comes back under another IP address is
//! found again as soon as the resolver says so. Nothing resolves a name while
//! the file is parsed: a file is valid on a machine that cannot resolve it.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// The host part: an IP address, or a name for the resolver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Host {
    Ip(IpAddr),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    host: Host,
    port: u16,
}

impl Address {
    /// Parses `HOST:PORT` (IPv6 in brackets). The error says what is wrong,
    /// for the caller to prefix with the node and the key.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(addr.into());
        }
        let expected = "expected HOST:PORT (an IP address or a host name, a colon, a port)";
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(expected.into());
        };
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?;
        if host.starts_with('[') || host.contains(':') {
            return Err(format!(
                "{host:?} is not an IPv6 address in brackets, e.g. [fd00::1]:{port}"
            ));
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Self {
                host: Host::Ip(ip),
                port,
            });
        }
        check_name(host)?;
        Ok(Self {
            host: Host::Name(host.to_ascii_lowercase()),
            port,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The IP address, if the file gives one (not a name).
    pub fn ip(&self) -> Option<IpAddr> {
        match self.host {
            Host::Ip(ip) => Some(ip),
            Host::Name(_) => None,
        }
    }

    /// The host part as written (an IP address without brackets, or a name).
    pub fn host(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(name) => name.clone(),
        }
    }

    /// The same host, another port.
    pub fn with_port(&self, port: u16) -> Self {
        Self {
            host: self.host.clone(),
            port,
        }
    }

    /// Whether the address can only be this machine's (127.0.0.0/8, ::1,
    /// `localhost`).
    pub fn is_loopback(&self) -> bool {
        match &self.host {
            Host::Ip(ip) => ip.is_loopback(),
            Host::Name(name) => name == "localhost" || name.ends_with(".localhost"),
        }
    }

    /// 0.0.0.0 or [::]: every interface (to listen on, not to dial).
    pub fn is_unspecified(&self) -> bool {
        self.ip().is_some_and(|ip| ip.is_unspecified())
    }

    /// The socket addresses it stands for now: itself for an IP address, the
    /// resolver's answer for a name (blocking; each call asks again).
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        match &self.host {
            Host::Ip(ip) => Ok(vec![SocketAddr::new(*ip, self.port)]),
            Host::Name(name) => {
                let found: Vec<_> = (name.as_str(), self.port).to_socket_addrs()?.collect();
                if found.is_empty() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{name} resolves to no address"),
                    ));
                }
                Ok(found)
            }
        }
    }
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_`.
fn check_name(name: &str) -> Result<(), String> {
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(format!(
            "{name:?} is neither an IP address nor a host name (letters, digits, '-', '.')"
        ));
    }
    Ok(())
}

impl From<SocketAddr> for Address {
    fn from(addr: SocketAddr) -> Self {
        Self {
            host: Host::Ip(addr.ip()),
            port: addr.port(),
        }
    }
}

impl std::str::FromStr for Address {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::parse(text)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(ip) => write!(f, "{ip}:{}", self.port),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

impl ToSocketAddrs for Address {
    type Iter = std::vec::IntoIter<SocketAddr>;

    fn to_socket_addrs(&self) -> std::io::Result<Self::Iter> {
        self.resolve().map(Vec::into_iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_and_names_parse_and_print_back() {
        for text in [
            "127.0.0.1:7700",
            "[::1]:7700",
            "[fd00::1]:7700",
            "host0:7700",
            "node-1.rack2.example.com:1",
            "0.0.0.0:7700",
        ] {
            let address = Address::parse(text).unwrap();
            assert_eq!(address.to_string(), text);
            assert_eq!(Address::parse(&address.to_string()).unwrap(), address);
        }
        let name = Address::parse("Host0:7700").unwrap();
        assert_eq!(
            (name.host(), name.port(), name.ip()),
            ("host0".into(), 7700, None)
        );
        assert!(Address::parse("0.0.0.0:1").unwrap().is_unspecified());
        assert!(Address::parse("[::]:1").unwrap().is_unspecified());
        assert!(!name.is_unspecified());
        for loopback in ["127.0.0.1:1", "127.0.0.2:1", "[::1]:1", "localhost:1"] {
            assert!(
                Address::parse(loopback).unwrap().is_loopback(),
                "{loopback}"
            );
        }
        assert!(!Address::parse("10.0.0.1:1").unwrap().is_loopback());
        assert_eq!(name.with_port(7701), Address::parse("host0:7701").unwrap());
    }

    #[test]
    fn malformed_addresses_say_why() {
        for (text, why) in [
            ("nowhere", "HOST:PORT"),
            ("host0:", "port"),
            ("host0:http", "port"),
            ("host0:70000", "port"),
            ("::1:7700", "brackets"),
            ("[::1:7700", "brackets"),
            (":7700", "host name"),
            ("-bad-.example:7700", "host name"),
            ("a..b:7700", "host name"),
            ("under score?:7700", "host name"),
        ] {
            let err = Address::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn names_are_resolved_each_time_ip_addresses_never() {
        let ip = Address::parse("10.1.2.3:7700").unwrap();
        assert_eq!(
            ip.resolve().unwrap(),
            vec!["10.1.2.3:7700".parse().unwrap()]
        );
        // Every machine resolves localhost (/etc/hosts); on loopback only.
        let name = Address::parse("localhost:7700").unwrap();
        let found = name.resolve().unwrap();
        assert!(!found.is_empty());
        assert!(found
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 7700));
        assert_eq!(name.to_socket_addrs().unwrap().collect::<Vec<_>>(), found);
    }
}
