//! [`S3Config`]: where the S3 tier's store is and how to reach it; plain data,
//! in every build (the command line reads it with or without the client).

use std::time::Duration;

/// Where and how to reach the store.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// e.g. `http://127.0.0.1:8014`.
    pub endpoint: String,
    /// The bucket, which must exist: the tier does not create it.
    pub bucket: String,
    /// Key prefix of this node's tier (e.g. `cluster/node-3`); may be empty.
    pub prefix: String,
    /// Access key id of the credentials.
    pub access_key: String,
    /// Secret access key of the credentials. The derived `Debug` prints it:
    /// do not log a config.
    pub secret_key: String,
    /// Region the requests are signed for; `us-east-1` from
    /// [`S3Config::new`], what most S3-compatible stores expect.
    pub region: String,
    /// Plain HTTP (a store on loopback or a private network).
    pub allow_http: bool,
    /// Bytes of images this tier may hold.
    pub capacity: u64,
    /// Retries of one request inside the client; keep them few.
    pub max_retries: usize,
    /// The first wait before a retry; each next one doubles, up to
    /// [`S3Config::max_backoff`].
    pub init_backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// No retry starts after this long since the request's first try.
    pub retry_timeout: Duration,
    /// How long a connection may take to set up before the request fails;
    /// 2 s from [`S3Config::new`], so a store that is down surfaces quickly.
    pub connect_timeout: Duration,
}

impl S3Config {
    /// A config with short retries (2 retries, 100 ms → 1 s, 5 s in all) and a
    /// 2 s connect timeout.
    pub fn new(
        endpoint: &str,
        bucket: &str,
        prefix: &str,
        access_key: &str,
        secret_key: &str,
    ) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            region: "us-east-1".to_string(),
            allow_http: endpoint.starts_with("http://"),
            capacity: u64::MAX,
            max_retries: 2,
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            retry_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}
