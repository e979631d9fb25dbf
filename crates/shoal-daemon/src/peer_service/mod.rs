//! This node's side of the peer protocol: the gRPC server other nodes call
//! (`grpc`), the calls as the store thread receives them (`calls`), and
//! their answers (`answer`), given with the same operations local clients
//! use. Started with the data channel and the heartbeats by [`start`].

mod answer;
mod calls;
mod grpc;

use std::rc::Rc;

use shoal_cluster::auth::TokenCheck;
use shoal_cluster::proto::peer_server::PeerServer;
use shoal_core::error::{Result, ShoalError};
use tokio::sync::mpsc;

use crate::ops::Ops;

/// Peer calls queued for the store thread at most (back-pressure on gRPC).
const CALL_QUEUE: usize = 1024;

/// How long a stopping daemon lets open peer connections finish their calls.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Binds the peer RPC and data channel ports (a busy port fails the start)
/// and starts, under the supervisor: the gRPC server (its own tasks, fed to
/// the store thread through a channel), the task answering its calls, the
/// data channel, and the heartbeats.
pub(crate) async fn start(ops: &Rc<Ops>) -> Result<()> {
    let cluster = ops.cluster.clone().expect("cluster mode");
    let node = cluster.topology().node(cluster.me)?.clone();
    // `listen` (default: rpc, a host name resolved now) may differ from the
    // address peers dial, e.g. 0.0.0.0:7700.
    let listen = node.listen_address();
    let listener = tokio::net::TcpListener::bind(listen.to_string())
        .await
        .map_err(|e| ShoalError::io(&format!("bind peer RPC {listen}"), e))?;
    let bound = listener
        .local_addr()
        .map_or_else(|_| listen.to_string(), |a| a.to_string());
    let identity = cluster.identity.clone();
    let (calls, mut incoming) = mpsc::channel::<calls::PeerCall>(CALL_QUEUE);
    let calls_metrics = &cluster.node.metrics().peer_calls;
    let rpc_mode = if cluster.tls.is_some() {
        "tls1.3"
    } else {
        "none"
    };
    calls_metrics.set_encryption("rpc", rpc_mode);
    calls_metrics.set_encryption("data", cluster.data_encryption().as_str());
    let check = match cluster.tls {
        Some(_) => TokenCheck::new(identity.clone()).over_tls(),
        None => TokenCheck::new(identity.clone()),
    };
    let service = tonic::service::interceptor::InterceptedService::new(
        PeerServer::new(grpc::PeerService { calls }).max_decoding_message_size(64 << 20),
        check,
    );
    let stopping = ops.supervisor.stopping();
    let stopped = ops.supervisor.stopping();
    let tls = cluster.tls.clone();
    ops.supervisor.spawn("peer rpc", async move {
        let builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(service);
        let server: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = match tls {
            Some(tls) => Box::pin(builder.serve_with_incoming_shutdown(
                shoal_cluster::tls::rpc::incoming(listener, tls),
                stopping,
            )),
            None => Box::pin(builder.serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                stopping,
            )),
        };
        // A graceful stop waits for every connection to close, and one from a
        // peer that is cut off or frozen never does: past a short grace the
        // rest are dropped, so a stop never hangs on the network.
        let grace = async {
            stopped.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            served = server => {
                if let Err(err) = served {
                    tracing::error!(%err, "peer RPC server failed");
                }
            }
            () = grace => tracing::info!(
                "peer RPC connections still open {SHUTDOWN_GRACE:?} after the stop began: dropped"
            ),
        }
    });
    cluster.start_data_channel(identity).await?;
    let answering = ops.clone();
    ops.supervisor.spawn_local("peer calls", async move {
        while let Some(call) = incoming.recv().await {
            // The tasks `answer` starts for calls that wait carry it too.
            let _span = call.span().entered();
            answer::answer(&answering, call);
        }
    });
    ops.supervisor
        .spawn_local("heartbeats", cluster.clone().run_heartbeats());
    // Logged, not awaited: a slow resolver must not hold up the heartbeats.
    let resolving = cluster.clone();
    let known = resolving.topology().clone();
    ops.supervisor.spawn_local("peer addresses", async move {
        crate::cluster::peers::resolve_peers(&known, resolving.me).await;
    });
    tracing::info!(node = node.id, rpc = %node.rpc, listen = %bound, host = %node.host(), nodes = cluster.topology().nodes.len(), "cluster node up");
    Ok(())
}
