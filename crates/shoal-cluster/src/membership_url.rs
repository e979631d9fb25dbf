//! Where a cluster's membership lives: `etcd://host:2379,host2:2379/prefix`.

use std::fmt;
use std::str::FromStr;

use shoal_core::error::{Result, ShoalError};

/// An etcd cluster's client endpoints and the key prefix of one shoal
/// cluster in it (several shoal clusters can share an etcd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipUrl {
    /// `host:port` of each etcd member the client may talk to.
    pub endpoints: Vec<String>,
    /// The keys' prefix, without a trailing `/`: `/shoal/demo`.
    pub prefix: String,
}

impl FromStr for MembershipUrl {
    type Err = ShoalError;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: &str| {
            ShoalError::invalid(format!(
                "membership {text:?}: {why} (expected etcd://host:port[,host:port…]/prefix)"
            ))
        };
        let rest = text
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("only etcd:// is supported"))?;
        let (hosts, prefix) = rest.split_once('/').ok_or_else(|| bad("no key prefix"))?;
        let prefix = format!("/{}", prefix.trim_matches('/'));
        if prefix == "/" {
            return Err(bad("the key prefix is empty"));
        }
        let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        for endpoint in &endpoints {
            let port = endpoint
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(bad(&format!("endpoint {endpoint:?} is not host:port")));
            }
        }
        Ok(Self { endpoints, prefix })
    }
}

impl fmt::Display for MembershipUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd://{}{}", self.endpoints.join(","), self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_print_back() {
        let url: MembershipUrl = "etcd://10.0.0.1:2379,etcd-b:2379/shoal/demo/"
            .parse()
            .unwrap();
        assert_eq!(url.endpoints, ["10.0.0.1:2379", "etcd-b:2379"]);
        assert_eq!(url.prefix, "/shoal/demo");
        assert_eq!(
            url.to_string(),
            "etcd://10.0.0.1:2379,etcd-b:2379/shoal/demo"
        );
        for bad in [
            "http://h:1/p",
            "etcd://h:1",
            "etcd://h:1/",
            "etcd://h/p",
            "etcd://:1/p",
            "etcd://h:99999/p",
            "etcd://h:1,/p",
        ] {
            let err = bad.parse::<MembershipUrl>().unwrap_err();
            assert_eq!(
                err.kind(),
                shoal_core::error::ErrorKind::InvalidArgument,
                "{bad}"
            );
        }
    }
}
