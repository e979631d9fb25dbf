//! The peer RPC server: tonic handlers turn each call into a `PeerCall`
//! for the daemon's single store thread, which answers through a oneshot.
//! Handlers never touch the store themselves (it lives on the daemon's
//! current-thread runtime, unshared), so the gRPC side needs no locks.

use shoal_cluster::ids::{pack, unpack};
use shoal_cluster::proto::peer_server::Peer;
use shoal_cluster::proto::{
    AcquireReply, AcquireRequest, AdoptedRequest, AllocateReply, AllocateRequest, AttachReadsReply,
    AttachReadsRequest, CachedRequest, Empty, HeartbeatReply, HeartbeatRequest, Ids, ListReply,
    LookupReply, NamesReply, NamesRequest, NodeStatus, Outcome, PublishRequest, RegisterRequest,
    ReleaseRequest, RenameNameRequest, RestoreRequest, RestoredRequest, RevokeRequest, SealRequest,
    Statuses, UnlinkNameRequest, WitnessRequest,
};
use shoal_core::location::ObjectLocation;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use shoal_cluster::auth::verified_peer;

use crate::peer_service::calls::{self, PeerCall};

pub(super) struct PeerService {
    pub calls: mpsc::Sender<PeerCall>,
}

impl PeerService {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> PeerCall) -> Result<T, Status> {
        let (reply, answer) = oneshot::channel();
        self.tell(make(reply)).await?;
        answer
            .await
            .map_err(|_| Status::unavailable("the daemon is stopping"))
    }

    async fn tell(&self, call: PeerCall) -> Result<(), Status> {
        self.calls
            .send(call)
            .await
            .map_err(|_| Status::unavailable("the daemon is stopping"))
    }
}

fn location(l: &shoal_cluster::proto::Location) -> ObjectLocation {
    ObjectLocation {
        offset: l.offset,
        data_size: l.data_size,
        meta_size: l.meta_size,
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let from = verified_peer(&request)?;
        let membership_link = shoal_cluster::epoch::link_of(request.metadata());
        let request = request.into_inner();
        self.ask(|reply| {
            PeerCall::Heartbeat(calls::Heartbeat {
                from,
                membership_link,
                incarnation: request.incarnation,
                fence_epoch: request.fence_epoch,
                fence_confirmed: request.fence_confirmed,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<Statuses>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        if request.owner != from {
            return Err(Status::permission_denied(
                "a node registers ids only for itself",
            ));
        }
        let ids = unpack(&request.ids)?;
        let incarnation = request.incarnation;
        self.ask(|reply| {
            PeerCall::Register(calls::Register {
                ids,
                owner: from,
                incarnation,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn unregister(&self, request: Request<Ids>) -> Result<Response<Empty>, Status> {
        let owner = verified_peer(&request)?;
        let ids = unpack(&request.into_inner().ids)?;
        self.tell(PeerCall::Unregister(calls::Unregister { ids, owner }))
            .await?;
        Ok(Response::new(Empty {}))
    }

    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<Empty>, Status> {
        let owner = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        if ids.len() != request.locations.len() {
            return Err(Status::invalid_argument(
                "ids and locations differ in count",
            ));
        }
        let locations = request.locations.iter().map(location).collect();
        // Answered once applied: a get anywhere after the seal returns sees it.
        self.ask(|reply| {
            PeerCall::Publish(calls::Publish {
                ids,
                locations,
                owner,
                reply,
            })
        })
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn lookup(&self, request: Request<Ids>) -> Result<Response<LookupReply>, Status> {
        let ids = unpack(&request.into_inner().ids)?;
        self.ask(|reply| PeerCall::Lookup(calls::Lookup { ids, reply }))
            .await?
            .map(Response::new)
    }

    async fn restore(
        &self,
        request: Request<RestoreRequest>,
    ) -> Result<Response<Statuses>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let sealed_ids = unpack(&request.sealed)?;
        if sealed_ids.len() != request.locations.len() {
            return Err(Status::invalid_argument(
                "sealed ids and locations differ in count",
            ));
        }
        let sealed = sealed_ids
            .into_iter()
            .zip(request.locations.iter().map(location))
            .collect();
        let pending = unpack(&request.pending)?;
        let copies = unpack(&request.copies)?;
        let incarnation = request.caller_incarnation;
        self.ask(|reply| {
            PeerCall::Restore(calls::Restore {
                from,
                incarnation,
                sealed,
                pending,
                copies,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn restored(&self, request: Request<RestoredRequest>) -> Result<Response<Empty>, Status> {
        let from = verified_peer(&request)?;
        let epoch = shoal_cluster::epoch::of_call(request.metadata())?;
        let incarnation = request.into_inner().incarnation;
        self.tell(PeerCall::Restored(calls::Restored {
            from,
            incarnation,
            epoch,
        }))
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn adopted(&self, request: Request<AdoptedRequest>) -> Result<Response<Empty>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        self.tell(PeerCall::Adopted(calls::Adopted {
            from,
            origin: request.origin,
            objects: request.objects,
        }))
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn witness(&self, request: Request<WitnessRequest>) -> Result<Response<Empty>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let sealed = unpack(&request.adds)?;
        let gone = unpack(&request.removes)?;
        self.tell(PeerCall::Witness(calls::Witness {
            from,
            epoch: request.epoch,
            reset: request.reset,
            sealed,
            gone,
        }))
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireReply>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        let incarnation = request.incarnation;
        self.ask(|reply| {
            PeerCall::Acquire(calls::Acquire {
                ids,
                from,
                incarnation,
                seq: request.seq,
                settled: request.settled,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn attach_reads(
        &self,
        request: Request<AttachReadsRequest>,
    ) -> Result<Response<AttachReadsReply>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let table = (request.fd >= 0).then_some((request.pid, request.fd));
        self.ask(|reply| {
            PeerCall::AttachReads(calls::AttachReads {
                from,
                incarnation: request.incarnation,
                table,
                key: request.key,
                reply,
            })
        })
        .await?
        .map(Response::new)
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<Empty>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        self.tell(PeerCall::Release(calls::Release {
            ids,
            from,
            fence_epoch: request.fence_epoch,
            seq: request.seq,
            settled: request.settled,
            undo: request.undo,
            callee_incarnation: request.callee_incarnation,
        }))
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn delete(&self, request: Request<Ids>) -> Result<Response<Statuses>, Status> {
        let ids = unpack(&request.into_inner().ids)?;
        self.ask(|reply| PeerCall::Delete(calls::Delete { ids, reply }))
            .await
            .map(Response::new)
    }

    async fn revoke(&self, request: Request<RevokeRequest>) -> Result<Response<Ids>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        let number = request.number;
        let dropped = self
            .ask(|reply| {
                PeerCall::Revoke(calls::Revoke {
                    ids,
                    number,
                    from,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(Ids {
            ids: pack(&dropped),
        }))
    }

    async fn give_back(&self, request: Request<Empty>) -> Result<Response<Ids>, Status> {
        let from = verified_peer(&request)?;
        let dropped = self
            .ask(|reply| PeerCall::GiveBack(calls::GiveBack { from, reply }))
            .await?;
        Ok(Response::new(Ids {
            ids: pack(&dropped),
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateReply>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        if request.data_sizes.len() != ids.len() || request.meta_sizes.len() != ids.len() {
            return Err(Status::invalid_argument("ids and sizes differ in count"));
        }
        let specs = ids
            .into_iter()
            .zip(request.data_sizes)
            .zip(request.meta_sizes)
            .map(|((id, d), m)| (id, d, m))
            .collect();
        let (timeout_ms, incarnation) = (request.timeout_ms, request.incarnation);
        self.ask(|reply| {
            PeerCall::Allocate(calls::Allocate {
                specs,
                timeout_ms,
                from,
                incarnation,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn seal(&self, request: Request<SealRequest>) -> Result<Response<Outcome>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        let release = request.release;
        self.ask(|reply| {
            PeerCall::Seal(calls::Seal {
                ids,
                release,
                from,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn abort(&self, request: Request<Ids>) -> Result<Response<Outcome>, Status> {
        let from = verified_peer(&request)?;
        let ids = unpack(&request.into_inner().ids)?;
        self.ask(|reply| PeerCall::Abort(calls::Abort { ids, from, reply }))
            .await
            .map(Response::new)
    }

    async fn cached(&self, request: Request<CachedRequest>) -> Result<Response<Statuses>, Status> {
        let from = verified_peer(&request)?;
        let request = request.into_inner();
        let ids = unpack(&request.ids)?;
        if request.locations.len() != ids.len() {
            return Err(Status::invalid_argument("one location per id"));
        }
        let locations = request.locations.iter().map(location).collect();
        let owner = request.owner;
        self.ask(|reply| {
            PeerCall::Cached(calls::Cached {
                ids,
                owner,
                locations,
                from,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn drop(&self, request: Request<Ids>) -> Result<Response<Empty>, Status> {
        let ids = unpack(&request.into_inner().ids)?;
        self.tell(PeerCall::Drop(calls::Drop { ids })).await?;
        Ok(Response::new(Empty {}))
    }

    async fn status(&self, _: Request<Empty>) -> Result<Response<NodeStatus>, Status> {
        self.ask(|reply| PeerCall::Status(calls::Status { reply }))
            .await
            .map(Response::new)
    }

    async fn list(&self, _: Request<Empty>) -> Result<Response<ListReply>, Status> {
        self.ask(|reply| PeerCall::List(calls::List { reply }))
            .await
            .map(Response::new)
    }

    async fn names(&self, request: Request<NamesRequest>) -> Result<Response<NamesReply>, Status> {
        let NamesRequest { prefix, exact } = request.into_inner();
        self.ask(|reply| {
            PeerCall::Names(calls::Names {
                prefix,
                exact,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn unlink_name(
        &self,
        request: Request<UnlinkNameRequest>,
    ) -> Result<Response<Outcome>, Status> {
        let from = verified_peer(&request)?;
        let UnlinkNameRequest {
            name,
            older_than_ms,
        } = request.into_inner();
        self.ask(|reply| {
            PeerCall::UnlinkName(calls::UnlinkName {
                name,
                older_than_ms,
                from,
                reply,
            })
        })
        .await
        .map(Response::new)
    }

    async fn rename_name(
        &self,
        request: Request<RenameNameRequest>,
    ) -> Result<Response<Outcome>, Status> {
        let from_node = verified_peer(&request)?;
        let RenameNameRequest { from, to } = request.into_inner();
        self.ask(|reply| {
            PeerCall::RenameName(calls::RenameName {
                from,
                to,
                from_node,
                reply,
            })
        })
        .await
        .map(Response::new)
    }
}
