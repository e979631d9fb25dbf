//! Peer traffic over TLS (issue 44): a real node 0 of three with per-node
//! keys and certificates of a test CA, and this test playing nodes 1 and 2
//! with good certificates and with every kind of bad one, on both channels;
//! then two nodes pulling over TLS through a relay that tampers with bytes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{
    ClientConfig, ClientConnection, RootCertStore, StreamOwned, SupportedProtocolVersion,
};
use shoal_cluster::auth::{Credentials, PeerIdentity};
use shoal_cluster::bulk::{fetch_range, Kind, Request};
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::proto::HeartbeatRequest;
use shoal_cluster::tls::TlsMaterial;
use shoal_cluster::{Access, Address, NodeTls};
use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;
use shoal_testing::{with_node_keys, with_tls, LoneNode, TcpProxy, TestCa, TestCluster};

const REGION_SIZE: u64 = 8 << 20;
/// The HTTP/2 client preface: a TLS peer RPC port answers it with SETTINGS.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Node 0 of three over TLS, the test's CA, and the revocation list node
/// 0 reads (empty at start).
struct TlsNodeZero {
    node: LoneNode,
    ca: TestCa,
    crl: PathBuf,
}

impl TlsNodeZero {
    fn start() -> Self {
        let mut made = None;
        let node = LoneNode::start_with(
            "peer-tls",
            3,
            REGION_SIZE,
            true,
            Duration::from_secs(30),
            |topology, dir| {
                let ca = with_tls(topology, dir);
                let crl = ca.dir.join("revoked.crl");
                ca.revoke(&[], &crl);
                topology.tls.as_mut().unwrap().crl = Some(crl.clone());
                made = Some((ca, crl));
            },
        );
        let (ca, crl) = made.unwrap();
        Self { node, ca, crl }
    }

    fn cert(&self, n: u32) -> NodeTls {
        self.node.topology.nodes[n as usize].tls.clone().unwrap()
    }

    fn public_key(&self, n: u32) -> [u8; 32] {
        self.node.topology.nodes[n as usize]
            .identity
            .as_ref()
            .unwrap()
            .public_key
    }

    /// Node `n`'s own TLS material, as its daemon would load it.
    fn material(&self, n: u32) -> Arc<TlsMaterial> {
        let identity = PeerIdentity::for_node(&self.node.topology, n).unwrap();
        TlsMaterial::load(&self.node.topology, n, identity)
            .unwrap()
            .unwrap()
    }

    /// A client presenting `cert`, trusting the cluster's CA, speaking
    /// `versions`.
    fn client(
        &self,
        cert: &NodeTls,
        versions: &[&'static SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(self.ca.dir.join("ca.crt")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let chain: Vec<_> = CertificateDer::pem_file_iter(&cert.cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
        Arc::new(
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .unwrap(),
        )
    }

    /// Node 0's certificate name (what the client checks).
    fn zero(&self) -> ServerName<'static> {
        let identity = PeerIdentity::for_node(&self.node.topology, 0).unwrap();
        ServerName::try_from(identity.cert_name(0).unwrap()).unwrap()
    }

    fn rpc(&self) -> &Address {
        &self.node.topology.nodes[0].rpc
    }

    fn data(&self) -> &Address {
        &self.node.topology.nodes[0].data
    }

    /// A pull from node 0's data channel claiming node 1 (with `one`'s
    /// credential) over a TLS connection made with `material`.
    fn pull_as_one(
        &self,
        one: &PeerIdentity,
        material: &TlsMaterial,
    ) -> shoal_core::error::Result<()> {
        let request = Request {
            kind: Kind::Pull,
            from: 1,
            token: one.token_for(0).unwrap(),
            id: ObjectId::random(),
            offset: 0,
            len: 1,
        };
        let mut byte = [0u8; 1];
        fetch_range(
            0,
            self.data(),
            &request,
            &mut byte,
            Duration::from_secs(5),
            Some(material),
        )
    }
}

/// Connects to `addr` over TLS with `client`, sends `bytes`, and reads what
/// comes back: `Ok` with the first bytes of the answer, or the TLS error.
fn exchange(
    addr: &Address,
    client: Arc<ClientConfig>,
    name: ServerName<'static>,
    bytes: &[u8],
) -> Result<Vec<u8>, String> {
    let socket = TcpStream::connect(addr.to_string()).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut tls = StreamOwned::new(ClientConnection::new(client, name).unwrap(), socket);
    tls.write_all(bytes)
        .and_then(|()| tls.flush())
        .map_err(|e| e.to_string())?;
    let mut answer = [0u8; 64];
    match tls.read(&mut answer) {
        Ok(0) => Err("closed without an answer".into()),
        Ok(n) => Ok(answer[..n].to_vec()),
        Err(e) => Err(e.to_string()),
    }
}

/// A data-channel request from node 1 (with a token node 0 refuses: the
/// answer is an error frame, which proves the request got through).
fn pull_request() -> Vec<u8> {
    Request {
        kind: Kind::Pull,
        from: 1,
        token: b"not a credential".to_vec(),
        id: ObjectId::random(),
        offset: 0,
        len: 1,
    }
    .encode()
}

/// Both channels of node 0 admit `cert` (`Ok`) or refuse it: the errors.
fn both_channels(node: &TlsNodeZero, cert: &NodeTls) -> (Result<(), String>, Result<(), String>) {
    let tls13 = &[&rustls::version::TLS13];
    let rpc = exchange(node.rpc(), node.client(cert, tls13), node.zero(), PREFACE).map(|_| ());
    let data = exchange(
        node.data(),
        node.client(cert, tls13),
        node.zero(),
        &pull_request(),
    )
    .map(|answer| assert_ne!(answer[0], 0, "a refused token is an error frame"));
    (rpc, data)
}

#[test]
fn a_peer_without_a_good_certificate_is_refused_on_both_channels() {
    let node = TlsNodeZero::start();
    let one = node.public_key(1);

    // The control: node 1's own certificate is admitted on both.
    let (rpc, data) = both_channels(&node, &node.cert(1));
    rpc.unwrap();
    data.unwrap();

    let other_ca = TestCa::new(&node.ca.dir.join("other"));
    let refused = [
        (
            "another CA's",
            other_ca.issue("foreign", 1, Some(&one), -60, 86_400),
        ),
        (
            "an expired",
            node.ca
                .issue("expired", 1, Some(&one), -2 * 86_400, -86_400),
        ),
        (
            "a not-yet-valid",
            node.ca.issue("early", 1, Some(&one), 86_400, 2 * 86_400),
        ),
        (
            "another key's",
            node.ca.issue("rekeyed", 1, Some(&[7; 32]), -60, 86_400),
        ),
        (
            "an unknown node's",
            node.ca.issue("n9", 9, Some(&one), -60, 86_400),
        ),
    ];
    for (what, cert) in &refused {
        let (rpc, data) = both_channels(&node, cert);
        for (channel, outcome) in [("rpc", rpc), ("data", data)] {
            let err = outcome.expect_err(&format!("{what} certificate on the {channel} channel"));
            assert!(err.contains("alert"), "{what}, {channel}: {err}");
        }
    }

    // A revocation takes effect without a restart.
    let revoked = node.ca.issue("revoked", 1, Some(&one), -60, 86_400);
    let (rpc, data) = both_channels(&node, &revoked);
    rpc.unwrap();
    data.unwrap();
    node.ca.revoke(&[&revoked.cert], &node.crl);
    std::thread::sleep(Duration::from_millis(1_200)); // files are looked at once a second
    let (rpc, data) = both_channels(&node, &revoked);
    assert!(rpc.unwrap_err().contains("alert"));
    assert!(data.unwrap_err().contains("alert"));
    let (rpc, data) = both_channels(&node, &node.cert(1));
    rpc.unwrap();
    data.unwrap();

    // A downgrade: a client offering TLS 1.2 only.
    let tls12 = node.client(&node.cert(1), &[&rustls::version::TLS12]);
    for addr in [node.rpc(), node.data()] {
        let err = exchange(addr, tls12.clone(), node.zero(), PREFACE).unwrap_err();
        assert!(
            err.contains("ProtocolVersion") || err.contains("alert"),
            "{err}"
        );
    }

    // Cleartext, the other downgrade: no answer on either channel.
    for (addr, bytes) in [
        (node.rpc(), PREFACE.to_vec()),
        (node.data(), pull_request()),
    ] {
        let mut socket = TcpStream::connect(addr.to_string()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        socket.write_all(&bytes).unwrap();
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer);
        assert!(
            answer.is_empty() || answer[0] == 0x15,
            "a cleartext peer got {answer:?}"
        );
    }
}

#[test]
fn a_call_over_tls_must_come_from_the_node_the_certificate_proves() {
    let node = TlsNodeZero::start();
    let one = PeerIdentity::for_node(&node.node.topology, 1).unwrap();
    let heartbeat = |material: Arc<TlsMaterial>, credentials: Credentials| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let endpoint =
                    tonic::transport::Endpoint::from_shared(format!("http://{}", node.rpc()))
                        .unwrap();
                let channel = shoal_cluster::tls::rpc::channel(endpoint, Some(&material), 0);
                PeerClient::with_interceptor(channel, credentials)
                    .heartbeat(HeartbeatRequest {
                        node: 1,
                        incarnation: 7,
                        ..Default::default()
                    })
                    .await
            })
    };
    // Node 1 over its own connection: admitted.
    heartbeat(node.material(1), one.credentials(0).unwrap()).unwrap();
    // Node 1's valid credential inside node 2's TLS connection: refused.
    let refused = heartbeat(node.material(2), one.credentials(0).unwrap()).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    assert!(refused.message().contains("certificate"), "{refused}");
    // The same on the data channel: a request claiming node 1 from node 2.
    let err = node.pull_as_one(&one, &node.material(2)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.message().contains("node 2's TLS connection"), "{err}");
}

#[test]
fn a_node_refused_by_its_peer_gets_a_typed_error() {
    let node = TlsNodeZero::start();
    // Node 1's material loaded while its certificate is good; then revoked.
    let material = node.material(1);
    node.ca.revoke(&[&node.cert(1).cert], &node.crl);
    std::thread::sleep(Duration::from_millis(1_200));
    let one = PeerIdentity::for_node(&node.node.topology, 1).unwrap();
    let err = node.pull_as_one(&one, &material).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.message().contains("TLS refused"), "{err}");
    // A revoked certificate is refused at the node's own start as well.
    let err = TlsMaterial::load(
        &node.node.topology,
        1,
        PeerIdentity::for_node(&node.node.topology, 1).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(
        err.message().contains("would be refused by its peers"),
        "{err}"
    );
}

/// Two nodes over TLS, node 1's data channel reached through `relay`
/// (node 0 pulls its objects: access "network"); node `i` serves its
/// metrics at `metrics[i]`.
fn through_relay(
    relay_slot: &mut Option<TcpProxy>,
    keys_dir: &Path,
    metrics: &[std::net::SocketAddr],
) -> TestCluster {
    TestCluster::start_with(
        "peer-tls-relay",
        2,
        32 << 20,
        Duration::ZERO,
        |topology| {
            with_node_keys(topology, keys_dir);
            with_tls(topology, keys_dir);
            for node in &mut topology.nodes {
                node.access = Access::Network;
            }
            let one = &mut topology.nodes[1];
            let real = one.data.clone();
            let relay = TcpProxy::start(real.to_string().parse().unwrap());
            one.data_listen = Some(real);
            one.data = Address::parse(&format!("127.0.0.1:{}", relay.port())).unwrap();
            *relay_slot = Some(relay);
        },
        |node, config, _| config.metrics = Some(metrics[node as usize]),
    )
}

fn metrics_addresses() -> Vec<std::net::SocketAddr> {
    shoal_testing::free_ports(2)
        .into_iter()
        .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .collect()
}

#[test]
fn bytes_changed_in_flight_fail_the_pull_and_are_never_returned() {
    let keys = tempfile::tempdir().unwrap();
    let mut relay = None;
    let metrics = metrics_addresses();
    let cluster = through_relay(&mut relay, keys.path(), &metrics);
    let relay = relay.unwrap();
    let payload: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    let id = ObjectId::random();
    cluster.client(1).put(id, &payload, b"").unwrap();

    // Well past the handshake: a flipped bit in the object's bytes.
    relay.tamper_at(64 << 10);
    let mut reader = cluster.client(0);
    let err = reader.get(&[id], 2_000).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.message().contains("TLS refused"), "{err}");
    // In the handshake: refused as well.
    relay.tamper_at(200);
    let err = reader.get(&[id], 2_000).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::PermissionDenied | ErrorKind::NodeUnavailable
        ),
        "{err}"
    );

    // An honest path again: the object, whole.
    relay.stop_tampering();
    let located = reader.get(&[id], 5_000).unwrap()[0].expect("found");
    let ptr = reader.located_ptr(located).unwrap();
    assert_eq!(located.location.data_size, payload.len() as u64);
    // SAFETY: referenced by the get; bounds checked on receipt.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, payload.len()) };
    assert!(bytes == &payload[..], "the owner's bytes, whole");
    reader.release(&[id]).unwrap();
    // Who encrypted the pull: the kernel where it takes TLS sessions (kTLS,
    // sendfile kept), else rustls; the metric says which, the other is 0.
    let (ran, not) = if shoal_cluster::tls::kernel::available() {
        ("tls-kernel", "tls-userspace")
    } else {
        ("tls-userspace", "tls-kernel")
    };
    let sent = |mode| {
        shoal_testing::metric(
            metrics[1],
            "shoal_data_channel_transfers_total",
            &[("encryption", mode)],
        )
        .unwrap_or(0.0)
    };
    assert!(sent(ran) >= 1.0, "{ran}: {}", sent(ran));
    assert_eq!(sent(not), 0.0, "{not}");
    let mode = shoal_testing::metric(
        metrics[0],
        "shoal_peer_encryption",
        &[("channel", "data"), ("mode", ran)],
    );
    assert_eq!(mode, Some(1.0));
}
