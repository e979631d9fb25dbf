/*
 * A seal that does not wait for the daemon (docs/fast-path.md, "What a caller
 * observes"): a Spin model of the write ring's seal record, the write poller's
 * asleep/doorbell handshake, and the daemon's rule "apply every published record
 * before answering a socket request". Rust side: shoal-client lent.rs
 * (FastWrites::seal, publish), shoal-daemon write_poller.rs and
 * connection/mod.rs (apply_all_writes before a request), ops/lent.rs.
 *
 * The writer publishes its seal record (the ring's tail), reads the daemon's
 * "asleep" word and rings the doorbell if it is set, and returns: it does not
 * wait for the answer. Then it deletes the object over the socket. A reader
 * that starts after the seal returned must find the object — in the shared
 * index, or by asking the daemon over the socket when the index misses — and
 * a reader that starts after the delete returned must not find it anywhere.
 * And no published record may be left unapplied while the poller sleeps with
 * no doorbell rung (checked when every process is blocked or done).
 *
 * Spin's interleaving is sequentially consistent: the Rust side makes the
 * tail's store / asleep word's load (client) and the asleep word's store /
 * tails' loads (daemon) SeqCst with a fence between. Applying records and
 * answering a request run on the daemon's one thread: each is atomic here.
 *
 * Broken variants, each of which must be caught:
 *   NO_APPLY_BEFORE_REQUEST  the daemon answers a socket request without
 *                            applying published records first
 *   LOOK_BEFORE_ASLEEP       the poller looks for records before it says it
 *                            sleeps (a record published in between is lost)
 */

bool published = false; /* the ring's tail covers the seal record */
bool applied = false;   /* the daemon took the record */
bool in_index = false;  /* the object is sealed, visible, in the index */
bool deleted = false;   /* the daemon deleted it */
bool asleep = false;    /* the poller's word in the index header */
bool rung = false;      /* the doorbell (an eventfd) has a count */
bool seal_returned = false;
bool delete_returned = false;

chan delete_req = [0] of { bit };
chan delete_rep = [0] of { bit };
chan get_req = [0] of { bit };
chan get_rep = [0] of { bool };

/* Applies the published record, if not yet (the daemon's apply_all_writes). */
inline apply_all() {
    if
    :: published && !applied ->
        applied = true;
        in_index = !deleted
    :: else -> skip
    fi
}

/* Before a socket request is answered (the connection loop's rule). */
inline before_request() {
#ifndef NO_APPLY_BEFORE_REQUEST
    apply_all()
#else
    skip
#endif
}

active proctype Writer() {
    published = true;
    if
    :: asleep -> rung = true
    :: else -> skip
    fi;
    seal_returned = true;
    if
    :: delete_req ! 1;
        delete_rep ? _;
        delete_returned = true
    :: skip /* a writer that goes idle: only the poller applies its record */
    fi
}

active proctype Poller() {
end_poll:
    do
    :: atomic { apply_all() };
#ifdef LOOK_BEFORE_ASLEEP
        if
        :: published && !applied -> skip
        :: else ->
            asleep = true;
end_sleep_broken:
            atomic { rung -> rung = false };
            asleep = false
        fi
#else
        asleep = true;
        if
        :: published && !applied -> asleep = false
        :: else ->
end_sleep:
            atomic { rung -> rung = false };
            asleep = false
        fi
#endif
    od
}

/* The writer's connection: its delete. Only an object the daemon has can be
 * deleted (otherwise: not found, nothing changes). */
active proctype WriterConnection() {
end_serve:
    do
    :: delete_req ? _ ->
        atomic {
            before_request();
            if
            :: applied -> deleted = true; in_index = false
            :: else -> skip
            fi
        };
        delete_rep ! 1
    od
}

/* The reader's connection: gets that missed the index. */
active proctype ReaderConnection() {
    bool found;
end_serve:
    do
    :: get_req ? _ ->
        atomic {
            before_request();
            found = applied && !deleted
        };
        get_rep ! found
    od
}

/* A get: the index first (a seqlock read: atomic here), then the socket. */
inline get(found) {
    if
    :: in_index -> found = true
    :: else ->
        get_req ! 1;
        get_rep ? found
    fi
}

active proctype Reader() {
    bool found;
    if
    :: seal_returned;
        get(found);
        /* Found, unless the delete (which may run meanwhile) came first. */
        assert(found || deleted);
end_wait:
        delete_returned;
        get(found);
        assert(!found)
    :: skip /* no reader: only the poller applies the record */
    fi
}

/* Every process blocked or done: nothing published is left behind. */
active proctype Quiescence() {
    timeout -> assert(!published || applied)
}
