//! A data-channel connection over TLS with its record layer in this
//! process, on both ends: rustls makes the handshake and hands over the
//! session's traffic keys; records are then sealed and opened here (RFC
//! 8446 §5), a received range's records opened in place in the object
//! being written. The dialing end makes its handshake with rustls'
//! unbuffered API and keeps its kernel-connection API (made for kTLS) for
//! session tickets and key updates ([`connect`]); the answering end's
//! handshake ran on the async side, through tokio-rustls, and its keys are
//! taken from that session once the request is read ([`answering`]).
//!
//! Written by hand because no library opens records into the caller's
//! buffer: rustls 0.23 copies every received byte three times after the
//! socket (into its deframer, into its plaintext queue, into the caller's
//! buffer; in-place reading is a TODO in its unbuffered API), and its
//! writer allocates a buffer per record. Here, as with kTLS or in
//! cleartext, the kernel's copy into the destination is the only one on
//! receipt, and records are sealed into one reused buffer. rustls keeps
//! what is not record protection: the handshake, the certificates' checks,
//! session tickets and key updates.

use std::io::{self, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ClientConfig, ConnectionTrafficSecrets, Error as TlsError, ServerConnection};

/// A record's header: content type, legacy version, body length.
const HEADER: usize = 5;
const TAG: usize = 16;
/// The most plaintext one record carries.
const MAX_PLAINTEXT: usize = 1 << 14;
/// The longest body a peer may send: plaintext, its content type, padding
/// and the tag within 2^14 + 256 (RFC 8446 §5.2).
const MAX_BODY: usize = MAX_PLAINTEXT + 256;
/// Plaintext sealed per socket write: 16 records (one system call where
/// rustls' own writer makes one per 64 KiB).
const SEND_BATCH: usize = 16 * MAX_PLAINTEXT;

const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
const CLOSE_NOTIFY: u8 = 0;
const UNEXPECTED_MESSAGE: u8 = 10;
const BAD_RECORD_MAC: u8 = 20;
const RECORD_OVERFLOW: u8 = 22;
const FATAL: u8 = 2;

/// One direction's protection: the AEAD key, the static IV and the record
/// sequence number the nonce is made from, which stops short of the
/// suite's confidentiality limit.
struct Direction {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    limit: u64,
}

impl Direction {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets), limit: u64) -> Result<Self, TlsError> {
        let (algorithm, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => {
                return Err(TlsError::General(
                    "a cipher suite shoal does not offer".into(),
                ))
            }
        };
        let key = UnboundKey::new(algorithm, key.as_ref())
            .map_err(|_| TlsError::General("a traffic key of the wrong length".into()))?;
        let iv = iv
            .as_ref()
            .try_into()
            .map_err(|_| TlsError::General("an IV of the wrong length".into()))?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
            limit,
        })
    }

    /// The next record's nonce: the IV xor the sequence number (§5.3).
    fn nonce(&mut self) -> Result<Nonce, TlsError> {
        if self.seq >= self.limit {
            // rustls would update the keys here; an answering end takes no
            // key update (its session is not rustls' any more), so a range
            // this long (hundreds of GB over AES-GCM) fails instead.
            return Err(TlsError::General(
                "the session reached its cipher's record limit".into(),
            ));
        }
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *n ^= s;
        }
        self.seq = self.seq.checked_add(1).ok_or(TlsError::EncryptError)?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// A TLS failure as an I/O error, so callers that look for the rustls
/// error inside (`data::tls_error`) see it.
fn failed(err: TlsError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}

/// The rustls error inside an I/O error, if that is what it is.
pub fn tls_error(err: &io::Error) -> Option<&TlsError> {
    err.get_ref()?.downcast_ref::<TlsError>()
}

fn unexpected(what: &str) -> io::Error {
    failed(TlsError::General(format!("unexpected TLS record: {what}")))
}

/// A handshake's failure: the peer's or this end's refusal (`Tls`), or the
/// connection's (`Io`).
#[derive(Debug)]
pub enum HandshakeError {
    Tls(TlsError),
    Io(io::Error),
}

/// Bytes waiting to be taken, from `at`.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    at: usize,
}

impl Pending {
    /// Copies what it can into `buf`; how many bytes.
    fn take(&mut self, buf: &mut [u8]) -> usize {
        let waiting = &self.bytes[self.at..];
        let n = waiting.len().min(buf.len());
        buf[..n].copy_from_slice(&waiting[..n]);
        self.at += n;
        if self.at == self.bytes.len() {
            self.bytes.clear();
            self.at = 0;
        }
        n
    }

    /// `bytes` wait now: its callers took all that waited first.
    fn set(&mut self, bytes: &[u8]) {
        debug_assert!(self.bytes.is_empty());
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.at = 0;
    }
}

/// What rustls keeps of a session after the handshake.
enum Session {
    /// The dialing end's: it takes the peer's tickets and key updates.
    Dialing(Box<KernelConnection<ClientConnectionData>>),
    /// The answering end's keys were taken from a buffered session, which
    /// keeps nothing: a dialing end sends neither tickets nor key updates
    /// unasked, and one that does is refused.
    Answering,
}

/// An established session on a blocking socket: [`Read`] and [`Write`] for
/// the small messages and a range's bytes sent, [`Records::receive_exact`]
/// for a range's bytes received. After any error (a timeout included) the
/// session is dropped: its sequence numbers may have moved on.
pub struct Records {
    socket: TcpStream,
    session: Session,
    rx: Direction,
    tx: Direction,
    /// The peer asked for our key update: sent before our next record.
    update_tx: bool,
    /// Bytes received ahead of the record being read.
    ahead: Pending,
    /// Plaintext opened but not yet read.
    plain: Pending,
    /// Where records that do not fit their destination are opened.
    scratch: Vec<u8>,
    /// Where records are sealed before they are sent.
    out: Vec<u8>,
    peer_closed: bool,
}

/// Makes the handshake with `name` on a connected blocking socket (within
/// its timeouts) and takes over the session's records.
pub fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    mut socket: TcpStream,
) -> Result<Records, HandshakeError> {
    let mut conn = UnbufferedClientConnection::new(config, name).map_err(HandshakeError::Tls)?;
    let mut incoming = vec![0u8; MAX_PLAINTEXT + 2 * HEADER + MAX_BODY];
    let mut used = 0;
    let mut outgoing = vec![0u8; MAX_PLAINTEXT];
    let mut pending = 0;
    loop {
        let UnbufferedStatus { discard, state } = conn.process_tls_records(&mut incoming[..used]);
        let state = match state {
            Ok(state) => state,
            Err(err) => {
                send_alert(&mut conn, &mut socket);
                return Err(HandshakeError::Tls(err));
            }
        };
        let done = match state {
            ConnectionState::EncodeTlsData(mut data) => loop {
                match data.encode(&mut outgoing[pending..]) {
                    Ok(n) => {
                        pending += n;
                        break false;
                    }
                    Err(EncodeError::InsufficientSize(size)) => {
                        outgoing.resize(pending + size.required_size, 0);
                    }
                    Err(err) => {
                        return Err(HandshakeError::Tls(TlsError::General(err.to_string())))
                    }
                }
            },
            ConnectionState::TransmitTlsData(data) => {
                socket
                    .write_all(&outgoing[..pending])
                    .map_err(HandshakeError::Io)?;
                pending = 0;
                data.done();
                false
            }
            ConnectionState::BlockedHandshake => {
                if used == incoming.len() {
                    // A handshake message rustls takes up to 64 KiB.
                    incoming.resize(incoming.len() * 2, 0);
                }
                match socket.read(&mut incoming[used..]) {
                    Ok(0) => {
                        return Err(HandshakeError::Io(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "closed during the handshake",
                        )))
                    }
                    Ok(n) => used += n,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => return Err(HandshakeError::Io(err)),
                }
                false
            }
            ConnectionState::WriteTraffic(_) => true,
            other => {
                return Err(HandshakeError::Tls(TlsError::General(format!(
                    "unexpected during the handshake: {other:?}"
                ))))
            }
        };
        if discard > 0 {
            incoming.copy_within(discard..used, 0);
            used -= discard;
        }
        if done {
            break;
        }
    }
    tracing::debug!(kind = ?conn.handshake_kind(), "data channel handshake");
    // A pusher sends whole ranges: it stops at the suite's record limit (its
    // peer, the answering end, takes no key update).
    let limit =
        confidentiality_limit(conn.negotiated_cipher_suite()).map_err(HandshakeError::Tls)?;
    let (secrets, session) = conn
        .dangerous_into_kernel_connection()
        .map_err(HandshakeError::Tls)?;
    incoming.truncate(used); // the server's first records (its tickets), if they came with it
    Ok(Records::new(
        socket,
        Session::Dialing(Box::new(session)),
        Direction::new(secrets.rx, limit).map_err(HandshakeError::Tls)?,
        Direction::new(secrets.tx, limit).map_err(HandshakeError::Tls)?,
        incoming,
    ))
}

/// The answering end's session on its socket, taken from rustls once the
/// handshake and the request are done. The dialing end sends nothing more
/// until answered: bytes rustls read past the request would be lost, so
/// any it holds refuse the hand-over.
pub fn answering(mut conn: ServerConnection, socket: TcpStream) -> Result<Records, TlsError> {
    let state = conn.process_new_packets()?;
    if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() {
        return Err(TlsError::General(
            "bytes after the request, before the answer".into(),
        ));
    }
    let limit = confidentiality_limit(conn.negotiated_cipher_suite())?;
    let secrets = conn.dangerous_extract_secrets()?;
    Ok(Records::new(
        socket,
        Session::Answering,
        Direction::new(secrets.rx, limit)?,
        Direction::new(secrets.tx, limit)?,
        Vec::new(),
    ))
}

/// The last record sequence number a session's suite allows before its
/// keys must change.
fn confidentiality_limit(suite: Option<rustls::SupportedCipherSuite>) -> Result<u64, TlsError> {
    suite
        .and_then(|suite| suite.tls13())
        .and_then(|suite| suite.common.confidentiality_limit.checked_sub(1))
        .ok_or(TlsError::HandshakeNotComplete)
}

/// Sends the alert rustls queued with a handshake error, so the peer logs
/// why (best effort: the connection is dropped either way).
fn send_alert(conn: &mut UnbufferedClientConnection, socket: &mut TcpStream) {
    let mut out = vec![0u8; 64];
    if let Ok(ConnectionState::EncodeTlsData(mut data)) = conn.process_tls_records(&mut []).state {
        if let Ok(n) = data.encode(&mut out) {
            let _ = socket.write_all(&out[..n]);
        }
    }
}

/// Where an opened record's content is: at the start of the destination
/// given, or of the scratch buffer.
struct Opened {
    kind: u8,
    len: usize,
    in_scratch: bool,
}

impl Records {
    fn new(
        socket: TcpStream,
        session: Session,
        rx: Direction,
        tx: Direction,
        ahead: Vec<u8>,
    ) -> Self {
        Self {
            socket,
            session,
            rx,
            tx,
            update_tx: false,
            ahead: Pending {
                bytes: ahead,
                at: 0,
            },
            plain: Pending::default(),
            scratch: vec![0u8; MAX_BODY],
            out: Vec::new(),
            peer_closed: false,
        }
    }

    /// The dialing end's rustls session, which takes post-handshake messages.
    fn dialing(&mut self, what: &str) -> io::Result<&mut KernelConnection<ClientConnectionData>> {
        match &mut self.session {
            Session::Dialing(session) => Ok(session),
            Session::Answering => Err(unexpected(&format!("{what} from the dialing end"))),
        }
    }

    /// The TCP socket underneath (for its options).
    pub fn socket(&self) -> &TcpStream {
        &self.socket
    }

    /// Fills `buf` from the bytes read ahead, then the socket.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let got = self.ahead.take(buf);
        self.socket.read_exact(&mut buf[got..])
    }

    /// [`Self::fill`], reading the next record's header with the last of
    /// `body` where it has come: one system call per record, not two.
    fn fill_body(&mut self, body: &mut [u8]) -> io::Result<()> {
        let mut got = self.ahead.take(body);
        let mut next = [0u8; HEADER];
        while got < body.len() {
            let mut parts = [
                IoSliceMut::new(&mut body[got..]),
                IoSliceMut::new(&mut next),
            ];
            match self.socket.read_vectored(&mut parts) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    let over = (got + n).saturating_sub(body.len());
                    got += n - over;
                    self.ahead.set(&next[..over]);
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Reads and opens the next record: in place at the start of `into` if
    /// its whole body fits there, else in the scratch buffer.
    fn open_next(&mut self, into: &mut [u8]) -> io::Result<Opened> {
        let mut header = [0u8; HEADER];
        self.fill(&mut header)?;
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        // Every protected TLS 1.3 record is "application data", version 1.2.
        if header[..3] != [APPLICATION_DATA, 3, 3] || !(TAG + 1..=MAX_BODY).contains(&len) {
            return Err(unexpected(&format!("header {header:?}")));
        }
        let in_scratch = len > into.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        let body = if in_scratch {
            &mut scratch[..len]
        } else {
            &mut into[..len]
        };
        let opened = self.fill_body(body).and_then(|()| {
            let nonce = self.rx.nonce().map_err(failed)?;
            let plain = self
                .rx
                .key
                .open_in_place(nonce, Aad::from(header), body)
                .map_err(|_| failed(TlsError::DecryptError))?;
            // The content type is the last byte that is not padding (§5.4).
            let end = plain
                .iter()
                .rposition(|&b| b != 0)
                .ok_or_else(|| unexpected("no content type"))?;
            if end > MAX_PLAINTEXT {
                return Err(failed(TlsError::PeerSentOversizedRecord));
            }
            Ok(Opened {
                kind: plain[end],
                len: end,
                in_scratch,
            })
        });
        self.scratch = scratch;
        opened
    }

    /// A record that is not application data: the peer's tickets and key
    /// updates go to rustls, its close ends reading, its alerts fail.
    fn control(&mut self, kind: u8, mut content: &[u8]) -> io::Result<()> {
        match kind {
            HANDSHAKE if content.is_empty() => Err(unexpected("an empty handshake record")),
            HANDSHAKE => {
                while let [typ, a, b, c, rest @ ..] = content {
                    let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
                    // rustls sends each post-handshake message whole in one record.
                    let (body, rest) = rest
                        .split_at_checked(len)
                        .ok_or_else(|| unexpected("a handshake message split across records"))?;
                    match (*typ, body) {
                        (NEW_SESSION_TICKET, _) => self
                            .dialing("a session ticket")?
                            .handle_new_session_ticket(body)
                            .map_err(failed)?,
                        (KEY_UPDATE, [requested @ (0 | 1)]) => {
                            let secrets = self
                                .dialing("a key update")?
                                .update_rx_secret()
                                .map_err(failed)?;
                            self.rx = Direction::new(secrets, self.rx.limit).map_err(failed)?;
                            self.update_tx |= *requested == 1;
                            // What follows was sealed under the old keys (§5.1).
                            if !rest.is_empty() {
                                return Err(unexpected("a key update not at its record's end"));
                            }
                        }
                        _ => return Err(unexpected(&format!("handshake message {typ}"))),
                    }
                    content = rest;
                }
                if content.is_empty() {
                    Ok(())
                } else {
                    Err(unexpected("a truncated handshake message"))
                }
            }
            ALERT => match content {
                [_, CLOSE_NOTIFY] => {
                    self.peer_closed = true;
                    Ok(())
                }
                [_, description] => Err(failed(TlsError::AlertReceived((*description).into()))),
                _ => Err(unexpected("a malformed alert")),
            },
            other => Err(unexpected(&format!("content type {other}"))),
        }
    }

    /// Tells the peer why its records are refused, as rustls would (best
    /// effort: the session ends either way), and gives back the error.
    fn refuse(&mut self, err: io::Error) -> io::Error {
        let description = match tls_error(&err) {
            Some(TlsError::DecryptError) => BAD_RECORD_MAC,
            Some(TlsError::PeerSentOversizedRecord) => RECORD_OVERFLOW,
            // An I/O failure, or the peer's own alert: nothing to say.
            None | Some(TlsError::AlertReceived(_)) => return err,
            Some(_) => UNEXPECTED_MESSAGE,
        };
        self.out.clear();
        if self.seal(ALERT, &[FATAL, description]).is_ok() {
            let _ = self.socket.write_all(&self.out);
        }
        err
    }

    /// Receives exactly `dst.len()` bytes of application data into `dst`,
    /// each record opened where its bytes belong (only those too close to
    /// the end for their tag go through the scratch buffer). On failure,
    /// how many bytes arrived.
    pub fn receive_exact(&mut self, dst: &mut [u8]) -> Result<(), (usize, io::Error)> {
        let mut got = self.plain.take(dst);
        while got < dst.len() {
            if self.peer_closed {
                return Err((got, io::ErrorKind::UnexpectedEof.into()));
            }
            let opened = self
                .open_next(&mut dst[got..])
                .map_err(|e| (got, self.refuse(e)))?;
            let content = if opened.in_scratch {
                &self.scratch[..opened.len]
            } else {
                &dst[got..got + opened.len]
            };
            if opened.kind != APPLICATION_DATA {
                let content = content.to_vec(); // a few bytes; `dst` is overwritten next
                self.control(opened.kind, &content)
                    .map_err(|e| (got, self.refuse(e)))?;
                continue;
            }
            if opened.in_scratch {
                // The range's last bytes; anything after them is for a later read.
                let n = opened.len.min(dst.len() - got);
                dst[got..got + n].copy_from_slice(&self.scratch[..n]);
                self.plain.set(&self.scratch[n..opened.len]);
                got += n;
            } else {
                got += opened.len;
            }
        }
        Ok(())
    }

    /// Seals `content` as one record of `kind` onto `self.out`.
    fn seal(&mut self, kind: u8, content: &[u8]) -> io::Result<()> {
        let start = self.out.len();
        let len = (content.len() + 1 + TAG) as u16;
        let mut header = [APPLICATION_DATA, 3, 3, 0, 0];
        header[3..].copy_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(&header);
        self.out.extend_from_slice(content);
        self.out.push(kind);
        let nonce = self.tx.nonce().map_err(failed)?;
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut self.out[start + HEADER..])
            .map_err(|_| failed(TlsError::EncryptError))?;
        self.out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Our key update, which the peer asked for: announced under the old
    /// keys, then the new ones.
    fn update_tx_keys(&mut self) -> io::Result<()> {
        self.seal(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0])?;
        let secrets = self
            .dialing("a key update")?
            .update_tx_secret()
            .map_err(failed)?;
        self.tx = Direction::new(secrets, self.tx.limit).map_err(failed)?;
        self.update_tx = false;
        Ok(())
    }
}

impl Read for Records {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let n = self.plain.take(buf);
            if n > 0 || buf.is_empty() || self.peer_closed {
                return Ok(n);
            }
            let opened = self.open_next(&mut []).map_err(|e| self.refuse(e))?;
            let content = &self.scratch[..opened.len];
            if opened.kind == APPLICATION_DATA {
                self.plain.set(content);
            } else {
                let content = content.to_vec();
                self.control(opened.kind, &content)
                    .map_err(|e| self.refuse(e))?;
            }
        }
    }
}

impl Write for Records {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.clear();
        if self.update_tx {
            self.update_tx_keys()?;
        }
        let n = buf.len().min(SEND_BATCH);
        // Once per connection for a range: the buffer is kept.
        self.out
            .reserve(n + n.div_ceil(MAX_PLAINTEXT) * (HEADER + 1 + TAG) + HEADER + 6 + TAG);
        for chunk in buf[..n].chunks(MAX_PLAINTEXT) {
            self.seal(APPLICATION_DATA, chunk)?;
        }
        self.socket.write_all(&self.out)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.socket.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpListener};

    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::{ServerConfig, ServerConnection, StreamOwned};

    use super::*;

    /// A server's config and a client's that trusts it, for `localhost`.
    fn configs() -> (Arc<ServerConfig>, Arc<ClientConfig>) {
        let issued = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = CertificateDer::from(issued.cert.der().to_vec());
        let key = PrivateKeyDer::try_from(issued.signing_key.serialize_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = &[&rustls::version::TLS13];
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        server.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        (Arc::new(server), Arc::new(client))
    }

    /// One connection accepted on a thread, a rustls server's buffered
    /// stream on it handed to `serve`.
    fn rustls_server<T: Send + 'static>(
        config: Arc<ServerConfig>,
        serve: impl FnOnce(StreamOwned<ServerConnection, TcpStream>) -> T + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<T>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let socket = bounded(listener.accept().unwrap().0);
            serve(StreamOwned::new(
                ServerConnection::new(config).unwrap(),
                socket,
            ))
        });
        (addr, thread)
    }

    /// A rustls client's buffered stream to `addr` (as `localhost`).
    fn rustls_client(
        config: Arc<ClientConfig>,
        addr: SocketAddr,
    ) -> StreamOwned<rustls::ClientConnection, TcpStream> {
        let name = ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(config, name).unwrap();
        StreamOwned::new(conn, bounded(TcpStream::connect(addr).unwrap()))
    }

    /// Our dialing end's handshake with `addr` (as `localhost`).
    fn dial(config: Arc<ClientConfig>, addr: SocketAddr) -> Result<Records, HandshakeError> {
        let socket = bounded(TcpStream::connect(addr).unwrap());
        connect(config, ServerName::try_from("localhost").unwrap(), socket)
    }

    /// A rustls server on a thread running `serve`, and our end connected
    /// to it.
    fn pair(
        serve: impl FnOnce(&mut StreamOwned<ServerConnection, TcpStream>) + Send + 'static,
    ) -> (Records, std::thread::JoinHandle<()>) {
        let (server, client) = configs();
        let (addr, thread) = rustls_server(server, move |mut stream| serve(&mut stream));
        (dial(client, addr).unwrap(), thread)
    }

    /// A socket whose reads fail after 10 s: a test that waits for bytes
    /// that never come fails instead of hanging.
    fn bounded(socket: TcpStream) -> TcpStream {
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        socket
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn ranges_arrive_whole_around_record_boundaries() {
        let lens = [
            1,
            MAX_PLAINTEXT - 1,
            MAX_PLAINTEXT,
            MAX_PLAINTEXT + 1,
            (3 << 20) + 7,
        ];
        let (mut records, server) = pair(move |stream| {
            for (i, len) in lens.into_iter().enumerate() {
                let mut ask = [0u8; 1];
                stream.read_exact(&mut ask).unwrap();
                stream.write_all(&[0]).unwrap(); // the status, its own record
                stream.write_all(&pattern(len, i as u8)).unwrap();
                stream.flush().unwrap();
            }
            let mut ack = [0u8; 2];
            stream.read_exact(&mut ack).unwrap();
            assert_eq!(ack, [0xa5, 0x5a]);
        });
        for (i, len) in lens.into_iter().enumerate() {
            records.write_all(&[i as u8]).unwrap();
            let mut status = [9u8; 1];
            records.read_exact(&mut status).unwrap();
            assert_eq!(status, [0]);
            // One spare byte each side: nothing is written outside the range.
            let mut dst = vec![0xeeu8; len + 2];
            records.receive_exact(&mut dst[1..=len]).unwrap();
            assert_eq!(dst[0], 0xee);
            assert_eq!(dst[len + 1], 0xee);
            assert!(
                dst[1..=len] == pattern(len, i as u8)[..],
                "range {i} of {len} bytes"
            );
        }
        records.write_all(&[0xa5, 0x5a]).unwrap();
        server.join().unwrap();
    }

    #[test]
    fn bytes_past_the_range_are_read_next() {
        let (mut records, server) = pair(|stream| {
            stream.write_all(&pattern(MAX_PLAINTEXT + 100, 1)).unwrap();
            stream.flush().unwrap();
        });
        let mut first = vec![0u8; MAX_PLAINTEXT + 10];
        records.receive_exact(&mut first).unwrap();
        let mut rest = vec![0u8; 90];
        records.read_exact(&mut rest).unwrap();
        assert_eq!([first, rest].concat(), pattern(MAX_PLAINTEXT + 100, 1));
        server.join().unwrap();
    }

    #[test]
    fn a_key_update_mid_range_is_followed_both_ways() {
        let len = 1 << 20;
        let (mut records, server) = pair(move |stream| {
            stream.write_all(&pattern(len / 2, 3)).unwrap();
            // rustls asks for ours too (update_requested).
            stream.conn.refresh_traffic_keys().unwrap();
            stream.write_all(&pattern(len / 2, 4)).unwrap();
            stream.flush().unwrap();
            let mut ack = [0u8; 1];
            stream.read_exact(&mut ack).unwrap();
            assert_eq!(ack, [7]);
        });
        let mut dst = vec![0u8; len];
        records.receive_exact(&mut dst).unwrap();
        assert_eq!(dst, [pattern(len / 2, 3), pattern(len / 2, 4)].concat());
        // Sent under our new keys: the server reads it only if it followed.
        records.write_all(&[7]).unwrap();
        server.join().unwrap();
    }

    #[test]
    fn a_changed_byte_fails_the_range() {
        // A relay between the two flips one byte of the second record.
        let (server, client) = configs();
        let (addr, thread) = rustls_server(server, |mut stream| {
            stream.write_all(&pattern(4 * MAX_PLAINTEXT, 5)).unwrap();
            stream.flush().unwrap();
            // Our end's alert says why.
            stream.read(&mut [0u8; 1]).unwrap_err().to_string()
        });
        let relay = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay_addr = relay.local_addr().unwrap();
        let relay_thread = std::thread::spawn(move || {
            let (mut near, _) = relay.accept().unwrap();
            let mut far = TcpStream::connect(addr).unwrap();
            let (mut near_in, mut far_out) = (near.try_clone().unwrap(), far.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = io::copy(&mut near_in, &mut far_out);
                let _ = far_out.shutdown(std::net::Shutdown::Write);
            });
            // Past the handshake (a few KiB), inside the application data.
            let mut seen = 0usize;
            let mut buf = vec![0u8; 4096];
            loop {
                let n = match far.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if seen < 20_000 && seen + n >= 20_000 {
                    buf[20_000 - seen - 1] ^= 1;
                }
                seen += n;
                if near.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let mut records = dial(client, relay_addr).unwrap();
        let mut dst = vec![0u8; 4 * MAX_PLAINTEXT];
        let (_, err) = records.receive_exact(&mut dst).unwrap_err();
        assert_eq!(tls_error(&err), Some(&TlsError::DecryptError), "{err}");
        drop(records);
        let seen = thread.join().unwrap();
        assert!(
            seen.contains("received fatal alert: BadRecordMac"),
            "{seen}"
        );
        relay_thread.join().unwrap();
    }

    #[test]
    fn a_close_before_the_range_ends_is_an_early_end() {
        let (mut records, server) = pair(|stream| {
            stream.write_all(&pattern(1000, 6)).unwrap();
            stream.conn.send_close_notify();
            while stream.conn.wants_write() {
                stream.conn.write_tls(&mut stream.sock).unwrap();
            }
        });
        let mut dst = vec![0u8; 5000];
        let (got, err) = records.receive_exact(&mut dst).unwrap_err();
        assert_eq!((got, err.kind()), (1000, io::ErrorKind::UnexpectedEof));
        assert_eq!(records.read(&mut [0u8; 4]).unwrap(), 0);
        server.join().unwrap();
    }

    /// Our answering end (its keys taken after a one-byte request, as the
    /// data channel's) on a thread running `serve`, and a rustls client's
    /// buffered stream connected to it.
    fn answering_pair(
        serve: impl FnOnce(&mut Records) + Send + 'static,
    ) -> (
        StreamOwned<rustls::ClientConnection, TcpStream>,
        std::thread::JoinHandle<()>,
    ) {
        let (server, client) = configs();
        let (addr, thread) = rustls_server(server, |mut stream| {
            stream.read_exact(&mut [0u8; 1]).unwrap();
            let mut records = answering(stream.conn, stream.sock).unwrap();
            serve(&mut records);
        });
        let mut stream = rustls_client(client, addr);
        stream.write_all(&[1]).unwrap();
        (stream, thread)
    }

    #[test]
    fn the_answering_end_sends_and_receives_ranges() {
        let len = (2 << 20) + 3;
        let (mut stream, server) = answering_pair(move |records| {
            records.write_all(&pattern(len, 8)).unwrap();
            records.flush().unwrap();
            let mut dst = vec![0u8; len];
            records.receive_exact(&mut dst).unwrap();
            assert!(dst == pattern(len, 9));
            records.write_all(&[0]).unwrap();
        });
        let mut got = vec![0u8; len];
        stream.read_exact(&mut got).unwrap();
        assert!(got == pattern(len, 8));
        stream.write_all(&pattern(len, 9)).unwrap();
        stream.flush().unwrap();
        let mut answer = [9u8; 1];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(answer, [0]);
        server.join().unwrap();
    }

    #[test]
    fn bytes_sent_past_the_request_refuse_the_hand_over() {
        let (server, client) = configs();
        let (addr, thread) = rustls_server(server, |mut stream| {
            stream.read_exact(&mut [0u8; 1]).unwrap();
            while stream
                .conn
                .process_new_packets()
                .unwrap()
                .plaintext_bytes_to_read()
                == 0
            {
                stream.conn.read_tls(&mut stream.sock).unwrap();
            }
            answering(stream.conn, stream.sock)
                .err()
                .map(|e| e.to_string())
        });
        let mut stream = rustls_client(client, addr);
        stream.write_all(&[1]).unwrap();
        stream.write_all(&[2]).unwrap(); // not waiting for the answer
        stream.flush().unwrap();
        let refused = thread.join().unwrap();
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("bytes after the request")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_key_update_the_answering_end_did_not_ask_for_is_refused() {
        let (mut stream, server) = answering_pair(|records| {
            let mut dst = vec![0u8; 2000];
            records.write_all(&[0]).unwrap(); // go on: as a push's receiver says
            let (got, err) = records.receive_exact(&mut dst).unwrap_err();
            assert_eq!(got, 1000);
            assert!(
                err.to_string()
                    .contains("a key update from the dialing end"),
                "{err}"
            );
        });
        stream.read_exact(&mut [0u8; 1]).unwrap();
        stream.write_all(&pattern(1000, 10)).unwrap();
        stream.conn.refresh_traffic_keys().unwrap();
        stream.write_all(&pattern(1000, 11)).unwrap();
        stream.flush().unwrap();
        server.join().unwrap();
    }

    #[test]
    fn a_server_it_does_not_trust_is_refused() {
        let (server, _) = configs();
        let (_, client) = configs(); // trusts another certificate
        let (addr, thread) = rustls_server(server, |mut stream| {
            // The client's alert says why.
            stream.read(&mut [0u8; 1]).unwrap_err().to_string()
        });
        let Err(HandshakeError::Tls(err)) = dial(client, addr) else {
            panic!("admitted");
        };
        assert!(matches!(err, TlsError::InvalidCertificate(_)), "{err}");
        let seen = thread.join().unwrap();
        // Both certificates name the same issuer, so the signature fails:
        // "decrypt_error" is the alert for that (RFC 8446 §6.2).
        assert!(
            seen.contains("received fatal alert: DecryptError"),
            "{seen}"
        );
    }
}
