/*
 * The fast path's get without a round trip (docs/fast-path.md, "As built"):
 * a Spin model of the shared index slot, the readers' reference counts and
 * the daemon's look before it frees memory. Rust side:
 * crates/shoal-core/src/fast_path/{index,readers}.rs and the store's
 * kept_for_fast_readers_now / sweep_fast_readers.
 *
 * One index position. The daemon publishes object generations 1..GENS there
 * one after another: publish, later take it out of view (eviction or
 * delete), look at every reader's count; free the memory only if all are
 * zero, else keep the object (it stays allocated) and look again later.
 * Memory is `mem`: the generation whose bytes are there, 0 when free.
 *
 * Readers (READERS of them) loop: look the slot up (seqlock read: version,
 * entry, version again), count a reference, re-read the version; if it
 * moved, give the count back; if not, they hold the object: its memory must
 * still be that generation's for as long as they hold it. Then release. A
 * reader may also crash at any point: its count is dropped with its table
 * (the daemon's disconnect), as the daemon drops a dead client's table.
 *
 * Spin's interleaving is sequentially consistent: the Rust side makes every
 * operation of the pairing SeqCst (the counts' add, the version stores and
 * loads, the daemon's fence before reading counts).
 *
 * Broken variants, each of which must be caught:
 *   NO_RECHECK               readers skip the version re-read after counting
 *   LOOK_BEFORE_UNPUBLISH    the daemon reads the counts before unpublishing
 *   NO_KEEP                  the daemon frees even if a count is non-zero
 */

#ifndef READERS
#define READERS 2
#endif
#ifndef GENS
#define GENS 2
#endif

byte version = 0;       /* seqlock: odd while the daemon writes the slot */
bool live = false;      /* the slot's state: live or tombstone */
byte entry = 0;         /* the generation the live entry names */
byte mem = 0;           /* whose bytes are in the object's memory; 0: free */
byte count[READERS];    /* each reader's reference count at this position */
bool alive[READERS];    /* the reader's table still exists */
byte holding[READERS];  /* generation a reader believes it holds (0: none) */

/* A seqlock write of the slot: version odd, the fields, version even. */
inline publish(gen) {
    version = version + 1;   /* odd: readers retry */
    live = true;
    entry = gen;
    version = version + 1
}

inline unpublish() {
    version = version + 1;
    live = false;
    version = version + 1
}

proctype Reader(byte me) {
    byte v1, v2, e;
    bool l;
    alive[me] = true;
    do
    :: true ->
        /* Lookup: a consistent snapshot of the slot. */
        v1 = version;
        if
        :: v1 % 2 == 1 -> goto next
        :: else
        fi;
        l = live; e = entry;
        v2 = version;
        if
        :: v1 != v2 || !l -> goto next
        :: else
        fi;
        /* Count the reference, then re-read the version. */
        count[me] = count[me] + 1;
#ifdef NO_RECHECK
        v2 = v1;
#else
        v2 = version;
#endif
        if
        :: v2 != v1 -> count[me] = count[me] - 1; goto next
        :: else
        fi;
        /* Held: the bytes are that generation's while we hold them. */
        holding[me] = e;
        assert(mem == e);
        /* ... any number of daemon steps may happen while it reads ... */
        atomic { holding[me] = 0; count[me] = count[me] - 1 };
next:
        skip
    :: true ->
        /* Killed: its table goes with its connection. */
        atomic { holding[me] = 0; count[me] = 0; alive[me] = false };
        break
    od
}

/* Whether any live reader counts a reference. */
inline held(result) {
    result = false;
    i = 0;
    do
    :: i < READERS ->
        if
        :: alive[i] && count[i] > 0 -> result = true
        :: else
        fi;
        i = i + 1
    :: else -> break
    od
}

active proctype Daemon() {
    byte gen = 1;
    byte i;
    byte again;   /* republishes of one generation: bounded, so the byte
                   * version cannot wrap around (the Rust one is a u64) */
    bool h;
    do
    :: gen <= GENS ->
        /* Allocate and write the object, then publish it. */
        mem = gen;
        publish(gen);
        /* Later: it must leave memory. */
#ifdef LOOK_BEFORE_UNPUBLISH
        held(h);
        unpublish();
#else
        unpublish();
        held(h);
#endif
#ifdef NO_KEEP
        h = false;
#endif
        /* Kept while held: look again until no reader holds it. A victim
         * of eviction is published again meanwhile (readers keep getting
         * it) and taken out of view before the next look; a deleted object
         * stays out of view. */
        again = 0;
        do
        :: h ->
            if
            :: again < 1 -> publish(gen); unpublish(); again = again + 1
            :: skip
            fi;
            held(h)
        :: !h -> break
        od;
        mem = 0;   /* freed: the next generation reuses the memory */
        gen = gen + 1
    :: gen > GENS -> break
    od
}

init {
    byte r = 0;
    atomic {
        do
        :: r < READERS -> run Reader(r); r = r + 1
        :: else -> break
        od
    }
}

/* At every reachable state: a reader that holds a generation finds its
 * bytes in memory (the monitor can fire between any two steps). */
active proctype Monitor() {
end:    /* waiting for a violation is a valid end */
    atomic {
        !((holding[0] == 0 || holding[0] == mem)
#if READERS > 1
          && (holding[1] == 0 || holding[1] == mem)
#endif
        ) -> assert(false)
    }
}
