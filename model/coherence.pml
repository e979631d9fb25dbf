/*
 * shoal's software cache coherency protocol on a non-coherent fabric.
 * Explained in model/README.md; checked by scripts/check-model.sh.
 *
 * Two nodes share a memory of LINES cache lines. Node W (0) owns the memory
 * and runs the allocator; an object may be written by a process on either
 * node, and is read by both. Each node has its own cache, which the hardware
 * may at any moment write back, evict or fill by prefetch. For GENS
 * generations the same range is allocated, written, flushed, sealed, read,
 * released, freed and reused (or written and aborted, then freed).
 *
 * Property: every read of a sealed object returns that generation's value.
 *
 * Broken variants, each of which must produce an assertion violation:
 *   -DNO_FLUSH           the writer seals without flushing
 *   -DNO_INVALIDATE      a reader reads without invalidating first
 *   -DNO_OWNER_INVALIDATE  the owner node reads objects the other node wrote
 *                        into its memory without invalidating first
 *   -DNO_ABORT_FLUSH     the writer of an aborted object frees it unflushed
 *   -DSEAL_BEFORE_FLUSH  the writer flushes, but only after sending the seal
 *                        (what a flush without its trailing fence allows)
 *
 * -DDATA_ASSERT_ONLY drops the check that readers never hold dirty lines, so
 * a broken variant must break the data property itself to be caught.
 */

#define NODES 2
#define LINES 2
#ifndef GENS
#define GENS 3
#endif

#define W 0            /* the owner: allocator, and a writer or reader too */
#define R 1            /* the other node: a writer or reader */

/* Cache line states. */
#define INVALID 0
#define CLEAN   1
#define DIRTY   2

byte mem[LINES];               /* physical memory: a generation per line */
byte st[NODES * LINES];        /* line state in each node's cache */
byte val[NODES * LINES];       /* cached value, meaningful unless INVALID */
#define I(n, l) ((n) * LINES + (l))

mtype = { SEALED, ABORTED, RELEASED };

/* Control messages: RPC, never through the shared memory. */
chan alloc_reply[NODES] = [1] of { byte };      /* "write generation g here" */
chan get_reply[NODES]   = [1] of { byte };      /* "generation g is sealed" */
chan to_owner           = [NODES] of { mtype, byte };

/* ---- one cache line, as the hardware handles it (each step atomic) ---- */

inline fill(n, l) {            /* a miss loads the line from memory */
  if
  :: st[I(n, l)] == INVALID -> val[I(n, l)] = mem[l]; st[I(n, l)] = CLEAN
  :: else -> skip
  fi
}

inline write_back(n, l) {      /* a dirty line goes to memory, stays clean */
  if
  :: st[I(n, l)] == DIRTY -> mem[l] = val[I(n, l)]; st[I(n, l)] = CLEAN
  :: else -> skip
  fi
}

/* ---- the protocol's operations on one line ---- */

inline store(n, l, v) {        /* a write stays in the writer's cache */
  atomic { val[I(n, l)] = v; st[I(n, l)] = DIRTY }
}

inline flush(n, l) {           /* flush_range: CLWB keeps the line, the others evict */
  atomic {
    write_back(n, l);
    if
    :: st[I(n, l)] = INVALID
    :: skip
    fi
  }
}

inline invalidate(n, l) {      /* invalidate_range: drop the line */
  atomic {
#ifndef DATA_ASSERT_ONLY
    assert(st[I(n, l)] != DIRTY);   /* readers never hold dirty lines */
#endif
    /* Real instructions write a dirty line back first; a pure invalidate
       would not. Either may happen, so the protocol may rely on neither. */
    if
    :: write_back(n, l)
    :: skip
    fi;
    st[I(n, l)] = INVALID
  }
}

inline load(n, l, g) {         /* a read of sealed generation g */
  atomic {
    fill(n, l);
    assert(val[I(n, l)] == g)
  }
}

/* ---- the hardware, acting on its own between any two steps ---- */

active proctype Hardware() {
  byte n, l;
end_hw:
  do
  :: atomic {
       if :: n = W :: n = R fi;
       if :: l = 0 :: l = 1 fi;            /* LINES == 2 */
       if
       :: st[I(n, l)] == DIRTY -> write_back(n, l)
       :: st[I(n, l)] != INVALID -> write_back(n, l); st[I(n, l)] = INVALID  /* evict */
       :: st[I(n, l)] == INVALID -> fill(n, l)                               /* prefetch */
       fi;
       n = 0; l = 0
     }
  od
}

/* ---- the allocator on the owner node: one range, reused every generation ---- */

active proctype Allocator() {
  byte g = 1, x;
  do
  :: g <= GENS ->
     /* alloc: a process on either node gets the range */
     if :: alloc_reply[W] ! g :: alloc_reply[R] ! g fi;
     if
     :: to_owner ? SEALED, x ->
        assert(x == g);
        get_reply[W] ! g; get_reply[R] ! g;
        to_owner ? RELEASED, x; to_owner ? RELEASED, x
     :: to_owner ? ABORTED, x ->
        assert(x == g)
     fi;
     /* free: the next generation reuses the range */
     g++
  :: else -> break
  od
}

/* ---- a node: writes objects it is given, reads objects that are sealed ---- */

inline flush_range(n) {        /* every line of the object, then (implicitly) a fence */
  l = 0;
  do :: l < LINES -> flush(n, l); l++ :: else -> break od
}

inline invalidate_range(n) {
  l = 0;
  do :: l < LINES -> invalidate(n, l); l++ :: else -> break od
}

proctype Node(byte n) {
  byte g, l;
  byte wrote = 0;              /* the generation this node wrote last */
end_node:
  do
  :: alloc_reply[n] ? g ->
     wrote = g;
     l = 0;
     do :: l < LINES -> store(n, l, g); l++ :: else -> break od;
     if
     :: /* seal: flush, then send the seal */
#ifdef SEAL_BEFORE_FLUSH
        to_owner ! SEALED, g;
#endif
#ifndef NO_FLUSH
        flush_range(n);
#endif
#ifndef SEAL_BEFORE_FLUSH
        to_owner ! SEALED, g
#else
        skip
#endif
     :: /* abort: flush, then free */
#ifndef NO_ABORT_FLUSH
        flush_range(n);
#endif
        to_owner ! ABORTED, g
     fi
  :: get_reply[n] ? g ->
     /* Every reader invalidates first, except the owner node reading an
        object it wrote itself: its cache saw every one of those writes. */
#ifndef NO_INVALIDATE
     if
     :: n == W && wrote == g -> skip
#ifdef NO_OWNER_INVALIDATE
     :: n == W && wrote != g -> skip
#endif
     :: else -> invalidate_range(n)
     fi;
#endif
     /* two passes: lines cached by the first must stay right for the second */
     l = 0;
     do :: l < 2 * LINES -> load(n, l % LINES, g); l++ :: else -> break od;
     to_owner ! RELEASED, g
  od
}

init {
  atomic { run Node(W); run Node(R) }
}
