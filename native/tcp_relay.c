/*
 * Native TCP for the egress proxy's CONNECT tunnels: accept, the first read of a client, the
 * upstream dial, and the relay both ways, all on one epoll set that libuv polls. A tunnel made
 * of two net.Sockets costs Node a stream object per side, a call into JavaScript per read and
 * per write callback, and several listeners; a minimal Node CONNECT proxy already costs what
 * squid does per tunnel (README, "Benchmarks"). Here a tunnel costs JavaScript four calls: its
 * first bytes, the dial's result, the splice, its end.
 *
 * Every decision stays in TypeScript (src/proxy/native-tcp.ts): this file never parses a byte.
 * It hands JavaScript the first read of each accepted connection; JavaScript either splices it
 * to an upstream it dialled here, or adopts the descriptor into a net.Socket (anything that is
 * not a whole CONNECT head, and every refusal, goes through Node as before).
 *
 * JavaScript face:
 *   init(onEvent)                          once per environment
 *   listen(host, port, backlog, handshakeMs) -> [id, port]
 *   unlisten(id)
 *   dial(host, port) -> id                 a CONNECTED event follows
 *   adopt(id) -> fd                        a parked client, handed to Node
 *   splice(client, upstream, idleMs, finishedIdleMs, watchClient, toClient?)
 *   watch(client, dir, on)                 dir 0: client -> upstream, 1: upstream -> client
 *   send(client, dir, bytes)
 *   end(client, dir)                       ends the side written to, once its bytes are out
 *                                          (these three: false when the tunnel has closed)
 *   close(id) -> [bytesUp, bytesDown] | undefined
 *   stats() -> [sockets, pendingBytes]
 * onEvent(type, id, a, b, c, bytes, text):
 *   1 ACCEPTED  client id, a listener, b peer port, c ms since accept, bytes (empty: the
 *               handshake time passed with none), text peer address
 *   2 CONNECTED upstream id, text: undefined on success, else the error code (it is closed);
 *               a 1: connected to one of this host's own addresses (both ends have one address)
 *   3 DATA      client id of a tunnel, a dir, bytes read from a watched side (empty: its end);
 *               watched bytes are not relayed, nor is a watched side's end: JavaScript sends
 *               what should go on, and ends the other side when it should
 *   4 CLOSED    client id of a tunnel, a bytes up, b bytes down (not sent for close())
 *   5 OPENED    client id just accepted, a listener, b peer port, text peer address: JavaScript
 *               counts it against its sandbox from here (and close()s it when over budget)
 *   6 GONE      client id whose descriptor this relay no longer holds (closed, or adopted)
 *
 * Ids are slot numbers with a generation, so an id JavaScript kept after its socket closed
 * finds nothing instead of another socket. A socket closed while events or epoll results may
 * still name it is freed only once they are done (the graveyard).
 */
#define _GNU_SOURCE
#define NAPI_VERSION 8
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h> /* SO_ORIGINAL_DST */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <node_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>
#include "napi_shared.h"

enum {
  READ_BYTES = 256 * 1024, /* one relayed read */
  RELAY_READS = 8,         /* per socket and turn of the event loop */
  PIPE_BYTES = 1024 * 1024, /* a streaming side's pipe (the default pipe-max-size) */
  FIRST_READ_BYTES = 64 * 1024,
  EPOLL_BATCH = 256,
  EPOLL_ROUNDS = 4,   /* epoll_waits per wake-up, while each finds something */
  ACCEPT_BATCH = 64,  /* per wake-up and listener; the listener is level-triggered */
  SWEEP_MS = 50,      /* deadlines (first bytes, idle) are checked this often */
  EMFILE_PAUSE_MS = 100,
  SLOT_BITS = 24,
  SLOT_MASK = (1 << SLOT_BITS) - 1,
};

/* Generations: ids stay below 2^53, exact as JavaScript numbers. */
#define GEN_LIMIT (1ULL << (53 - SLOT_BITS))

enum { EV_ACCEPTED = 1, EV_CONNECTED = 2, EV_DATA = 3, EV_CLOSED = 4, EV_OPENED = 5, EV_GONE = 6 };
enum { LISTENER = 1, CLIENT, UPSTREAM };
enum { S_LISTENING = 1, S_HEAD, S_PARKED, S_CONNECTING, S_SPLICED, S_DEAD };

typedef struct sock sock;
struct sock {
  uint64_t id;
  int fd;
  uint8_t role, state;
  /* Edge-triggered epoll: what the last events said, until a read or write says otherwise. */
  uint8_t readable, writable, rdhup;
  uint8_t rd_eof, wr_shut, watched, queued;
  uint8_t hold_end; /* a watched side ended: its peer is ended when JavaScript says (end) */
  sock *peer;              /* spliced: the other side */
  sock *prev, *next;       /* live sockets, for the sweep */
  sock *ready_next;        /* ready list, or graveyard once dead */
  uint64_t since;          /* accept time (client), last activity (spliced client) */
  uint64_t listener;       /* client: its listener's id */
  uint32_t handshake_ms;   /* listener and client in S_HEAD */
  uint32_t idle_ms, finished_idle_ms;
  uint64_t paused_until;   /* listener: accept paused after EMFILE */
  struct sockaddr_in6 peer_address;
  /*
   * A side that streams (a read filled READ_BYTES) moves its bytes to the peer with splice(2)
   * through this pipe, never copying them into user space; -1 until then.
   */
  int pipe_read, pipe_write;
  size_t in_pipe;
  char *pending; /* bytes waiting to be written to this socket */
  size_t pending_off, pending_len, pending_cap;
  double written;
};

typedef struct {
  uint8_t type;
  uint64_t id;
  double a, b, c;
  size_t off, len; /* bytes in the arena */
  int has_bytes;
  char text[INET6_ADDRSTRLEN + 1];
  int has_text;
} event;

typedef struct {
  sock *s;
  uint64_t gen;
} slot;

typedef struct {
  napi_env env;
  napi_ref on_event;
  napi_async_context async;
  napi_async_cleanup_hook_handle cleanup;
  uv_loop_t *loop;
  int epfd;
  uv_poll_t poll;
  uv_timer_t sweep, later;
  int handles_open, closing;
  sock *live;
  size_t live_count;
  /* Sockets with deadlines (all but listeners), and listeners paused: the sweep runs for them. */
  size_t timed_count, paused_count;
  sock *ready, *ready_tail, *after, *after_tail, *graveyard;
  int depth;
  slot *slots;
  uint32_t slot_count, slot_cap;
  uint32_t *free_slots; /* a ring: free_count of them from free_head */
  uint32_t free_head, free_count;
  event *events;
  size_t event_count, event_cap;
  char *arena;
  size_t arena_len, arena_cap;
  double pending_total;
  char buf[READ_BYTES];
} engine;

/* ---- ids ---------------------------------------------------------------------------- */

static int assign_id(engine *e, sock *s) {
  uint32_t index;
  /* The slot freed longest ago: a stale id meets its own generation only after 2^29 reuses. */
  if (e->free_count > 0) {
    index = e->free_slots[e->free_head];
    e->free_head = (e->free_head + 1) % e->slot_cap;
    e->free_count--;
  } else {
    if (e->slot_count > SLOT_MASK) return -1;
    if (e->slot_count == e->slot_cap) {
      uint32_t cap = e->slot_cap ? 2 * e->slot_cap : 1024;
      slot *slots = realloc(e->slots, cap * sizeof *slots);
      uint32_t *free_slots = realloc(e->free_slots, cap * sizeof *free_slots);
      if (slots != NULL) e->slots = slots;
      if (free_slots != NULL) e->free_slots = free_slots;
      if (slots == NULL || free_slots == NULL) return -1;
      e->slot_cap = cap;
      e->free_head = 0; /* the ring is empty here */
    }
    index = e->slot_count++;
    e->slots[index].gen = 1;
  }
  e->slots[index].s = s;
  s->id = (e->slots[index].gen << SLOT_BITS) | index;
  return 0;
}

static void release_id(engine *e, sock *s) {
  uint32_t index = (uint32_t)(s->id & SLOT_MASK);
  e->slots[index].s = NULL;
  e->slots[index].gen = e->slots[index].gen + 1 == GEN_LIMIT ? 1 : e->slots[index].gen + 1;
  e->free_slots[(e->free_head + e->free_count++) % e->slot_cap] = index;
}

static sock *find(engine *e, uint64_t id) {
  uint32_t index = (uint32_t)(id & SLOT_MASK);
  if (index >= e->slot_count) return NULL;
  slot *entry = &e->slots[index];
  if (entry->s == NULL || entry->s->id != id) return NULL;
  return entry->s;
}

/* ---- scheduling ----------------------------------------------------------------------- */

static void process(engine *e, int from_epoll);
static void on_sweep(uv_timer_t *timer);
static void make_ready(engine *e, sock *s);

/* Sockets that yielded (a long relay, a watched read) are picked up again here. */
static void on_later(uv_timer_t *timer) {
  engine *e = timer->data;
  sock *s = e->after;
  e->after = e->after_tail = NULL;
  e->depth++; /* process() runs below: no timer for make_ready */
  while (s) {
    sock *next = s->ready_next;
    s->queued = 0;
    if (s->state == S_DEAD) {
      s->ready_next = e->graveyard;
      e->graveyard = s;
    } else {
      make_ready(e, s);
    }
    s = next;
  }
  e->depth--;
  process(e, 0);
}

/* Work was queued outside process(): run it on the next turn of the loop. */
static void schedule(engine *e) {
  if (e->depth == 0 && !e->closing) uv_timer_start(&e->later, on_later, 0, 0);
}

/* Queues s once (on the ready list or the next turn's), unless it is queued or dead. */
static int enqueue(sock **head, sock **tail, sock *s) {
  if (s->queued || s->state == S_DEAD) return 0;
  s->queued = 1;
  s->ready_next = NULL;
  if (*tail) (*tail)->ready_next = s;
  else *head = s;
  *tail = s;
  return 1;
}

static void make_ready(engine *e, sock *s) {
  if (enqueue(&e->ready, &e->ready_tail, s)) schedule(e);
}

/*
 * Reads again on the loop's next turn: a watched side after JavaScript has seen its read, a
 * busy relay after other sockets (and the rest of the event loop) had theirs.
 */
static void ready_next_turn(engine *e, sock *s) { enqueue(&e->after, &e->after_tail, s); }

/* ---- events --------------------------------------------------------------------------- */

static event *push_event(engine *e, uint8_t type, uint64_t id) {
  if (e->event_count == e->event_cap) {
    size_t cap = e->event_cap ? 2 * e->event_cap : 64;
    event *events = realloc(e->events, cap * sizeof *events);
    if (events == NULL) return NULL;
    e->events = events;
    e->event_cap = cap;
  }
  event *ev = &e->events[e->event_count++];
  memset(ev, 0, sizeof *ev);
  ev->type = type;
  ev->id = id;
  schedule(e);
  return ev;
}

static int attach_bytes(engine *e, event *ev, const char *data, size_t len) {
  if (e->arena_len + len > e->arena_cap) {
    size_t cap = e->arena_cap ? e->arena_cap : 64 * 1024;
    while (cap < e->arena_len + len) cap *= 2;
    char *arena = realloc(e->arena, cap);
    if (arena == NULL) return -1;
    e->arena = arena;
    e->arena_cap = cap;
  }
  memcpy(e->arena + e->arena_len, data, len);
  ev->off = e->arena_len;
  ev->len = len;
  ev->has_bytes = 1;
  e->arena_len += len;
  return 0;
}

/* ---- sockets -------------------------------------------------------------------------- */

/* The sweep runs while something has a deadline: an idle Moat with its listener never wakes. */
static void sweep_as_needed(engine *e) {
  int needed = e->timed_count > 0 || e->paused_count > 0;
  if (needed && !uv_is_active((uv_handle_t *)&e->sweep))
    uv_timer_start(&e->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
  else if (!needed)
    uv_timer_stop(&e->sweep);
}

static sock *new_sock(engine *e, int fd, uint8_t role, uint8_t state) {
  sock *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  if (assign_id(e, s) != 0) {
    free(s);
    return NULL;
  }
  s->fd = fd;
  s->pipe_read = s->pipe_write = -1;
  s->role = role;
  s->state = state;
  s->next = e->live;
  if (e->live) e->live->prev = s;
  e->live = s;
  if (e->live_count++ == 0) uv_ref((uv_handle_t *)&e->poll);
  if (role != LISTENER) e->timed_count++;
  sweep_as_needed(e);
  return s;
}

static void close_pipe(sock *s) {
  if (s->pipe_read < 0) return;
  close(s->pipe_read);
  close(s->pipe_write);
  s->pipe_read = s->pipe_write = -1;
}

static void bury(engine *e) {
  while (e->graveyard) {
    sock *s = e->graveyard;
    e->graveyard = s->ready_next;
    free(s->pending);
    free(s);
  }
}

/* Forgets a socket; closes its descriptor unless `keep_fd` (adopted by Node). */
static void drop(engine *e, sock *s, int keep_fd) {
  if (s->state == S_DEAD) return;
  /*
   * Out of the epoll set before the descriptor closes: a child between fork and exec still
   * holds it, and the set would go on reporting it, with a pointer that is freed by then.
   */
  epoll_ctl(e->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  if (!keep_fd) close(s->fd);
  close_pipe(s);
  e->pending_total -= (double)(s->pending_len + s->in_pipe);
  s->state = S_DEAD;
  s->fd = -1;
  if (s->prev) s->prev->next = s->next;
  else e->live = s->next;
  if (s->next) s->next->prev = s->prev;
  release_id(e, s);
  if (--e->live_count == 0) uv_unref((uv_handle_t *)&e->poll);
  /* Every client JavaScript heard OPENED for ends with GONE, whatever ended it. */
  if (s->role == CLIENT) push_event(e, EV_GONE, s->id);
  if (s->role != LISTENER) e->timed_count--;
  else if (s->paused_until != 0) e->paused_count--;
  sweep_as_needed(e);
  /* Still on the ready list: it is skipped there and buried with the list's next pass. */
  if (!s->queued) {
    s->ready_next = e->graveyard;
    e->graveyard = s;
  }
  schedule(e);
}

static void close_tunnel(engine *e, sock *client, int notify) {
  sock *upstream = client->peer;
  if (notify) {
    event *ev = push_event(e, EV_CLOSED, client->id);
    if (ev) {
      ev->a = upstream ? upstream->written : 0;
      ev->b = client->written;
    }
  }
  if (upstream) drop(e, upstream, 0);
  drop(e, client, 0);
}

/* A spliced socket failed: the whole tunnel goes. */
static void fail(engine *e, sock *s) {
  close_tunnel(e, s->role == CLIENT ? s : s->peer, 1);
}

static void touch(engine *e, sock *s) {
  sock *client = s->role == CLIENT ? s : s->peer;
  if (client) client->since = uv_now(e->loop);
}

static int both_done(sock *client) {
  sock *upstream = client->peer;
  return client->rd_eof && upstream->wr_shut && upstream->rd_eof && client->wr_shut;
}

static void end_toward(engine *e, sock *dst) {
  if (dst->pending_len > 0 || dst->peer->in_pipe > 0 || dst->wr_shut) return;
  shutdown(dst->fd, SHUT_WR);
  dst->wr_shut = 1;
  sock *client = dst->role == CLIENT ? dst : dst->peer;
  if (both_done(client)) close_tunnel(e, client, 1);
}

/* Writes to dst what it can; keeps the rest as dst's pending bytes. Returns -1 when it failed. */
static int write_to(engine *e, sock *dst, const char *data, size_t len) {
  if (len == 0) return 0;
  if (dst->pending_len == 0) {
    ssize_t n;
    do n = send(dst->fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      n = 0;
    }
    dst->written += (double)n;
    touch(e, dst);
    if ((size_t)n == len) return 0;
    data += n;
    len -= (size_t)n;
    dst->writable = 0;
  }
  size_t needed = dst->pending_off + dst->pending_len + len;
  if (needed > dst->pending_cap) {
    /* Move what is left to the front before growing. */
    memmove(dst->pending, dst->pending + dst->pending_off, dst->pending_len);
    dst->pending_off = 0;
    needed = dst->pending_len + len;
    if (needed > dst->pending_cap) {
      size_t cap = dst->pending_cap ? 2 * dst->pending_cap : len;
      if (cap < needed) cap = needed;
      char *grown = realloc(dst->pending, cap);
      if (grown == NULL) return -1;
      dst->pending = grown;
      dst->pending_cap = cap;
    }
  }
  memcpy(dst->pending + dst->pending_off + dst->pending_len, data, len);
  dst->pending_len += len;
  e->pending_total += (double)len;
  return 0;
}

static int direction(const sock *src) { return src->role == CLIENT ? 0 : 1; }

static void fail(engine *e, sock *s);

/* Shows bytes read from a watched side to JavaScript; out of memory, the tunnel goes. */
static void queue_data(engine *e, sock *src, const char *data, size_t len) {
  sock *client = src->role == CLIENT ? src : src->peer;
  event *ev = push_event(e, EV_DATA, client->id);
  if (ev != NULL) {
    ev->a = direction(src);
    if (attach_bytes(e, ev, data, len) == 0) return;
    e->event_count--;
  }
  fail(e, src);
}

/* Gives src a pipe to splice through; stays with recv/send when it cannot have one. */
static void start_pipe(sock *src) {
  int fds[2];
  if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return;
  fcntl(fds[1], F_SETPIPE_SZ, PIPE_BYTES); /* else the default 64 KiB: slower, still right */
  src->pipe_read = fds[0];
  src->pipe_write = fds[1];
}

/*
 * Moves src's piped bytes on to dst; 0 while some are left (dst full) or when it failed. (A
 * reset peer makes this EPIPE, not SIGPIPE: Node ignores SIGPIPE.)
 */
static int drain_pipe(engine *e, sock *src, sock *dst) {
  while (src->in_pipe > 0) {
    ssize_t n;
    do n = splice(src->pipe_read, NULL, dst->fd, NULL, src->in_pipe,
                  SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        dst->writable = 0;
        return 0;
      }
      fail(e, dst);
      return 0;
    }
    src->in_pipe -= (size_t)n;
    e->pending_total -= (double)n;
    dst->written += (double)n;
    touch(e, dst);
  }
  return 1;
}

/* src read its end: JavaScript decides when a watched side's end goes on. */
static void ended(engine *e, sock *src, sock *dst) {
  src->rd_eof = 1;
  src->readable = 0;
  if (!src->watched) return end_toward(e, dst);
  src->hold_end = 1;
  queue_data(e, src, NULL, 0);
}

/*
 * Moves bytes from src to dst until src has none, dst is full, or src is watched (one read:
 * its bytes go to JavaScript, not to dst). A side whose read fills the buffer is streaming and
 * goes on with splice(2); the rest never need a pipe.
 */
static void relay(engine *e, sock *src, sock *dst) {
  for (int reads = 0;; reads++) {
    if (src->state != S_SPLICED) return;
    if (src->in_pipe > 0 && !drain_pipe(e, src, dst)) return;
    /* Watched since it began to stream: what it read before goes on, what follows is shown. */
    if (src->watched) close_pipe(src);
    if (!src->readable || src->rd_eof || dst->pending_len > 0) return;
    if (reads == RELAY_READS) return ready_next_turn(e, src);
    ssize_t n;
    size_t wanted = src->pipe_write >= 0 ? PIPE_BYTES : READ_BYTES;
    do n = src->pipe_write >= 0 ? splice(src->fd, NULL, src->pipe_write, NULL, wanted,
                                         SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                                : recv(src->fd, e->buf, wanted, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        src->readable = 0;
        return;
      }
      return fail(e, src);
    }
    touch(e, src);
    if (n == 0) return ended(e, src, dst);
    if (src->pipe_write >= 0) {
      /*
       * Read on to EAGAIN: a splice stops short when the pipe's slots fill with small
       * fragments, with more bytes waiting that no new arrival would report.
       */
      src->in_pipe += (size_t)n;
      e->pending_total += (double)n;
      continue;
    }
    /*
     * A short read emptied the socket: epoll reports every later arrival, so no read is spent
     * on EAGAIN. Not after the peer's FIN (no later arrival would report the end).
     */
    if ((size_t)n < wanted && !src->rdhup) src->readable = 0;
    if (src->watched) {
      queue_data(e, src, e->buf, (size_t)n);
      if (src->readable) ready_next_turn(e, src);
      return;
    }
    if (write_to(e, dst, e->buf, (size_t)n) != 0) return fail(e, dst);
    if ((size_t)n == READ_BYTES && dst->pending_len == 0) start_pipe(src);
  }
}

/* Writes dst's pending bytes; once they are gone, the side feeding dst may go on. */
static void flush(engine *e, sock *dst) {
  while (dst->pending_len > 0) {
    ssize_t n;
    do n = send(dst->fd, dst->pending + dst->pending_off, dst->pending_len,
                MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        dst->writable = 0;
        return;
      }
      return fail(e, dst);
    }
    dst->written += (double)n;
    dst->pending_off += (size_t)n;
    dst->pending_len -= (size_t)n;
    e->pending_total -= (double)n;
    touch(e, dst);
  }
  /* A drained buffer goes: an idle tunnel holds no memory here. */
  free(dst->pending);
  dst->pending = NULL;
  dst->pending_off = dst->pending_cap = 0;
  sock *src = dst->peer;
  if (src->in_pipe > 0 && !drain_pipe(e, src, dst)) return;
  if (!src->rd_eof) relay(e, src, dst);
  else if (!src->hold_end) end_toward(e, dst);
}

/* A client's peer address as text; 0 when it has none. */
static int peer_text(const sock *s, char *text, size_t size) {
  const void *address = &s->peer_address.sin6_addr;
  int family = AF_INET6;
  if (s->peer_address.sin6_family == AF_INET) {
    family = AF_INET;
    address = &((const struct sockaddr_in *)&s->peer_address)->sin_addr;
  }
  return inet_ntop(family, address, text, (socklen_t)size) != NULL;
}

static void read_first(engine *e, sock *s) {
  if (!s->readable) return;
  ssize_t n;
  do n = recv(s->fd, e->buf, FIRST_READ_BYTES, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    s->readable = 0;
    return;
  }
  /* Left before a byte (or failed): nothing to tell anyone. */
  if (n <= 0) return drop(e, s, 0);
  if ((size_t)n < FIRST_READ_BYTES && !s->rdhup) s->readable = 0;
  event *ev = push_event(e, EV_ACCEPTED, s->id);
  if (ev == NULL) return drop(e, s, 0);
  s->state = S_PARKED;
  ev->a = (double)s->listener;
  ev->c = (double)(uv_now(e->loop) - s->since);
  if (attach_bytes(e, ev, e->buf, (size_t)n) != 0) {
    e->event_count--;
    return drop(e, s, 0);
  }
  ev->b = ntohs(s->peer_address.sin6_port);
  ev->has_text = peer_text(s, ev->text, sizeof ev->text);
}

/*
 * Whether a connected socket's two ends have one address: the kernel picks the destination
 * itself as the source of a connection to one of this host's own addresses.
 */
static int reached_self(int fd) {
  struct sockaddr_storage local, peer;
  socklen_t local_length = sizeof local, peer_length = sizeof peer;
  if (getsockname(fd, (struct sockaddr *)&local, &local_length) != 0 ||
      getpeername(fd, (struct sockaddr *)&peer, &peer_length) != 0)
    return 0;
  if (local.ss_family != peer.ss_family) return 0;
  if (local.ss_family == AF_INET)
    return ((struct sockaddr_in *)&local)->sin_addr.s_addr ==
           ((struct sockaddr_in *)&peer)->sin_addr.s_addr;
  return memcmp(&((struct sockaddr_in6 *)&local)->sin6_addr,
                &((struct sockaddr_in6 *)&peer)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

static void finish_connect(engine *e, sock *s) {
  int error = 0;
  socklen_t length = sizeof error;
  if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
  event *ev = push_event(e, EV_CONNECTED, s->id);
  if (error == 0) {
    s->state = S_PARKED;
    if (ev) ev->a = reached_self(s->fd);
    return;
  }
  if (ev) {
    snprintf(ev->text, sizeof ev->text, "%s", uv_err_name(uv_translate_sys_error(error)));
    ev->has_text = 1;
  }
  drop(e, s, 0);
}

static void step(engine *e, sock *s) {
  switch (s->state) {
    case S_HEAD:
      return read_first(e, s);
    case S_CONNECTING:
      if (s->writable) finish_connect(e, s);
      return;
    case S_SPLICED:
      if (s->writable && (s->pending_len > 0 || s->peer->in_pipe > 0)) flush(e, s);
      if (s->state == S_SPLICED) relay(e, s, s->peer);
      return;
    default:
      return; /* parked: what epoll said is kept for when JavaScript moves it on */
  }
}

static void accept_all(engine *e, sock *listener) {
  if (listener->paused_until > uv_now(e->loop)) return;
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    struct sockaddr_in6 peer;
    socklen_t length = sizeof peer;
    int fd = accept4(listener->fd, (struct sockaddr *)&peer, &length,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* Out of descriptors: the level-triggered listener would spin; try again later. */
        if (listener->paused_until == 0) e->paused_count++;
        listener->paused_until = uv_now(e->loop) + EMFILE_PAUSE_MS;
        struct epoll_event none = {.events = 0, .data.ptr = listener};
        epoll_ctl(e->epfd, EPOLL_CTL_MOD, listener->fd, &none);
        sweep_as_needed(e);
      }
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sock *s = new_sock(e, fd, CLIENT, S_HEAD);
    if (s == NULL) {
      close(fd);
      continue;
    }
    s->listener = listener->id;
    s->handshake_ms = listener->handshake_ms;
    s->since = uv_now(e->loop);
    memcpy(&s->peer_address, &peer, length < sizeof peer ? length : sizeof peer);
    event *opened = push_event(e, EV_OPENED, s->id);
    if (opened != NULL) {
      opened->a = (double)listener->id;
      opened->b = ntohs(s->peer_address.sin6_port);
      opened->has_text = peer_text(s, opened->text, sizeof opened->text);
    }
    struct epoll_event interest = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                   .data.ptr = s};
    if (opened == NULL || epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &interest) != 0) drop(e, s, 0);
  }
}

static void on_io(engine *e, sock *s, uint32_t events) {
  if (s->role == LISTENER) return accept_all(e, s);
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) s->readable = 1;
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) s->rdhup = 1;
  if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) s->writable = 1;
  make_ready(e, s);
}

/* ---- delivery to JavaScript ----------------------------------------------------------- */

static void deliver(engine *e) {
  /* Events queued while these are delivered go to the next round. */
  event *events = e->events;
  size_t count = e->event_count;
  char *arena = e->arena;
  e->events = NULL;
  e->event_count = e->event_cap = 0;
  e->arena = NULL;
  e->arena_len = e->arena_cap = 0;
  napi_handle_scope scope;
  napi_value fn;
  if (napi_open_handle_scope(e->env, &scope) == napi_ok) {
    if (napi_get_reference_value(e->env, e->on_event, &fn) == napi_ok) {
      for (size_t i = 0; i < count && !e->closing; i++) {
        event *ev = &events[i];
        napi_value argv[7];
        napi_create_int32(e->env, ev->type, &argv[0]);
        napi_create_double(e->env, (double)ev->id, &argv[1]);
        napi_create_double(e->env, ev->a, &argv[2]);
        napi_create_double(e->env, ev->b, &argv[3]);
        napi_create_double(e->env, ev->c, &argv[4]);
        /* Out of memory, bytes or text are undefined: JavaScript's handling fails and closes. */
        void *copy;
        napi_status made = napi_generic_failure;
        if (ev->has_bytes && ev->len > 0)
          made = napi_create_buffer_copy(e->env, ev->len, arena + ev->off, NULL, &argv[5]);
        else if (ev->has_bytes)
          made = napi_create_buffer(e->env, 0, &copy, &argv[5]);
        if (made != napi_ok) napi_get_undefined(e->env, &argv[5]);
        made = napi_generic_failure;
        if (ev->has_text)
          made = napi_create_string_latin1(e->env, ev->text, NAPI_AUTO_LENGTH, &argv[6]);
        if (made != napi_ok) napi_get_undefined(e->env, &argv[6]);
        call_js(e->env, e->async, fn, 7, argv);
      }
    }
    napi_close_handle_scope(e->env, scope);
  }
  free(events);
  free(arena);
}

static void run_ready(engine *e) {
  while (e->ready) {
    sock *s = e->ready;
    e->ready = s->ready_next;
    if (e->ready == NULL) e->ready_tail = NULL;
    s->queued = 0;
    if (s->state == S_DEAD) {
      s->ready_next = e->graveyard;
      e->graveyard = s;
      continue;
    }
    step(e, s);
  }
}

/* Takes what epoll has ready (without waiting); false when it had nothing. */
static int poll_once(engine *e) {
  struct epoll_event events[EPOLL_BATCH];
  int count;
  do count = epoll_wait(e->epfd, events, EPOLL_BATCH, 0);
  while (count < 0 && errno == EINTR);
  for (int i = 0; i < count; i++) {
    sock *s = events[i].data.ptr;
    if (s->state != S_DEAD) on_io(e, s, events[i].events);
  }
  return count > 0;
}

static void process(engine *e, int from_epoll) {
  if (e->closing) return;
  e->depth++;
  /*
   * What one round does often makes more ready at once (an accepted client's bytes, a dial
   * that completed on loopback): taken here, it costs no extra turn of the event loop.
   */
  for (int round = 0; round < EPOLL_ROUNDS; round++) {
    if ((from_epoll || round > 0) && !poll_once(e) && round > 0) break;
    for (;;) {
      run_ready(e);
      if (e->event_count > 0 && !e->closing) deliver(e);
      if (e->closing) return;
      if (e->ready == NULL && e->event_count == 0) break;
    }
  }
  e->depth--;
  if (e->depth > 0) return;
  bury(e);
  if (e->after) uv_timer_start(&e->later, on_later, 0, 0);
}

static void on_epoll(uv_poll_t *poll, int status, int events) {
  (void)status;
  (void)events;
  process(poll->data, 1);
}

/* Deadlines: a client's first bytes (handshake), a tunnel's idle time. */
static void on_sweep(uv_timer_t *timer) {
  engine *e = timer->data;
  uint64_t now = uv_now(e->loop);
  e->depth++;
  for (sock *s = e->live, *next; s; s = next) {
    next = s->next;
    if (s->role == LISTENER) {
      if (s->paused_until != 0 && s->paused_until <= now) {
        s->paused_until = 0;
        e->paused_count--;
        struct epoll_event interest = {.events = EPOLLIN, .data.ptr = s};
        epoll_ctl(e->epfd, EPOLL_CTL_MOD, s->fd, &interest);
      }
    } else if (s->state == S_HEAD && now - s->since >= s->handshake_ms) {
      event *ev = push_event(e, EV_ACCEPTED, s->id);
      if (ev == NULL) continue;
      s->state = S_PARKED;
      ev->a = (double)s->listener;
      ev->c = (double)(now - s->since);
      ev->has_bytes = 1; /* none */
    } else if (s->state == S_SPLICED && s->role == CLIENT) {
      /* 0: no limit. `next` may be the peer, which goes too: freed only after this loop. */
      uint32_t idle = s->idle_ms;
      if (s->peer->rd_eof && s->finished_idle_ms != 0 &&
          (idle == 0 || s->finished_idle_ms < idle))
        idle = s->finished_idle_ms;
      if (idle != 0 && now - s->since >= idle) close_tunnel(e, s, 1);
    }
  }
  sweep_as_needed(e);
  e->depth--;
  process(e, 0);
}

/* ---- commands from JavaScript ---------------------------------------------------------- */

static engine *engine_or_throw(napi_env env) {
  engine *e = NULL;
  napi_get_instance_data(env, (void **)&e);
  if (e == NULL || e->closing) {
    napi_throw_error(env, "ERR_MOAT_TCP", "the native TCP relay is not initialised");
    return NULL;
  }
  return e;
}

/* A command's start: the engine (or a throw) and up to `count` arguments in argv, argc. */
#define COMMAND(count)                                                                         \
  engine *e = engine_or_throw(env);                                                            \
  if (e == NULL) return NULL;                                                                  \
  size_t argc = (count);                                                                       \
  napi_value argv[(count)];                                                                    \
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL))

static int get_id(napi_env env, napi_value value, uint64_t *id) {
  double number;
  if (napi_get_value_double(env, value, &number) != napi_ok || !(number >= 0) ||
      number >= 9007199254740992.0)
    return -1;
  *id = (uint64_t)number;
  return (double)*id == number ? 0 : -1;
}

static int parse_address(const char *host, int port, struct sockaddr_in6 *address,
                         socklen_t *length) {
  memset(address, 0, sizeof *address);
  struct sockaddr_in *v4 = (struct sockaddr_in *)address;
  if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    *length = sizeof *v4;
    return AF_INET;
  }
  if (inet_pton(AF_INET6, host, &address->sin6_addr) == 1) {
    address->sin6_family = AF_INET6;
    address->sin6_port = htons((uint16_t)port);
    *length = sizeof *address;
    return AF_INET6;
  }
  return -1;
}

static int read_host_port(napi_env env, napi_value host_value, napi_value port_value,
                          char *host, size_t host_size, int32_t *port) {
  size_t host_length;
  if (napi_get_value_string_utf8(env, host_value, host, host_size, &host_length) != napi_ok ||
      host_length >= host_size - 1 || napi_get_value_int32(env, port_value, port) != napi_ok ||
      *port < 0 || *port > 65535)
    return -1;
  return 0;
}

static void close_handles(engine *e);

static void on_env_cleanup(napi_async_cleanup_hook_handle handle, void *data) {
  (void)handle;
  close_handles(data);
}

static napi_value init(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], resource_name;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  napi_valuetype type;
  if (argc < 1 || napi_typeof(env, argv[0], &type) != napi_ok || type != napi_function) {
    napi_throw_type_error(env, NULL, "init(onEvent: function)");
    return NULL;
  }
  engine *existing = NULL;
  napi_get_instance_data(env, (void **)&existing);
  if (existing != NULL) {
    napi_throw_error(env, "ERR_MOAT_TCP", "the native TCP relay is already initialised");
    return NULL;
  }
  engine *e = calloc(1, sizeof *e);
  if (e == NULL) {
    napi_throw_error(env, "ENOMEM", "native TCP relay: out of memory");
    return NULL;
  }
  e->env = env;
  e->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (e->epfd < 0) {
    int error = errno;
    free(e);
    throw_errno(env, "epoll_create1", error);
    return NULL;
  }
  if (napi_get_uv_event_loop(env, &e->loop) != napi_ok ||
      napi_create_reference(env, argv[0], 1, &e->on_event) != napi_ok ||
      napi_create_string_utf8(env, "MOAT_TCP_RELAY", NAPI_AUTO_LENGTH, &resource_name) !=
          napi_ok ||
      napi_async_init(env, NULL, resource_name, &e->async) != napi_ok) {
    close(e->epfd);
    free(e);
    napi_throw_error(env, "ERR_MOAT_TCP", "native TCP relay: cannot set up");
    return NULL;
  }
  uv_poll_init(e->loop, &e->poll, e->epfd);
  e->poll.data = e;
  uv_poll_start(&e->poll, UV_READABLE, on_epoll);
  uv_unref((uv_handle_t *)&e->poll);
  uv_timer_init(e->loop, &e->sweep);
  e->sweep.data = e;
  uv_unref((uv_handle_t *)&e->sweep);
  uv_timer_init(e->loop, &e->later);
  e->later.data = e;
  e->handles_open = 3;
  napi_add_async_cleanup_hook(env, on_env_cleanup, e, &e->cleanup);
  napi_set_instance_data(env, e, NULL, NULL);
  return NULL;
}

static napi_value listen_tcp(napi_env env, napi_callback_info info) {
  COMMAND(4);
  char host[64];
  int32_t port, backlog;
  uint32_t handshake_ms;
  if (argc < 4 || read_host_port(env, argv[0], argv[1], host, sizeof host, &port) != 0 ||
      napi_get_value_int32(env, argv[2], &backlog) != napi_ok ||
      napi_get_value_uint32(env, argv[3], &handshake_ms) != napi_ok) {
    napi_throw_type_error(env, NULL, "listen(host, port, backlog, handshakeMs)");
    return NULL;
  }
  struct sockaddr_in6 address;
  socklen_t length;
  int family = parse_address(host, port, &address, &length);
  if (family < 0) {
    napi_throw_error(env, "EINVAL", "listen: the host is not an IP address");
    return NULL;
  }
  char what[128];
  snprintf(what, sizeof what, "listen %s%s%s:%d", family == AF_INET6 ? "[" : "", host,
           family == AF_INET6 ? "]" : "", port);
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw_errno(env, what, errno);
    return NULL;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&address, length) != 0 || listen(fd, backlog) != 0) {
    int error = errno;
    close(fd);
    throw_errno(env, what, error);
    return NULL;
  }
  struct sockaddr_in6 bound;
  socklen_t bound_length = sizeof bound;
  getsockname(fd, (struct sockaddr *)&bound, &bound_length);
  sock *s = new_sock(e, fd, LISTENER, S_LISTENING);
  if (s == NULL) {
    close(fd);
    napi_throw_error(env, "ENOMEM", "native TCP relay: out of memory");
    return NULL;
  }
  s->handshake_ms = handshake_ms;
  struct epoll_event interest = {.events = EPOLLIN, .data.ptr = s};
  if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &interest) != 0) {
    int error = errno;
    drop(e, s, 0);
    throw_errno(env, what, error);
    return NULL;
  }
  napi_value result, value;
  CHECK(napi_create_array_with_length(env, 2, &result));
  CHECK(napi_create_double(env, (double)s->id, &value));
  CHECK(napi_set_element(env, result, 0, value));
  CHECK(napi_create_int32(env, ntohs(bound.sin6_port), &value));
  CHECK(napi_set_element(env, result, 1, value));
  return result;
}

static napi_value dial(napi_env env, napi_callback_info info) {
  COMMAND(2);
  char host[64];
  int32_t port;
  struct sockaddr_in6 address;
  socklen_t length;
  int family;
  if (argc < 2 || read_host_port(env, argv[0], argv[1], host, sizeof host, &port) != 0 ||
      port == 0 || (family = parse_address(host, port, &address, &length)) < 0) {
    napi_throw_type_error(env, NULL, "dial(ip, port): an IP address and a port 1-65535");
    return NULL;
  }
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw_errno(env, "socket", errno);
    return NULL;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sock *s = new_sock(e, fd, UPSTREAM, S_CONNECTING);
  if (s == NULL) {
    close(fd);
    napi_throw_error(env, "ENOMEM", "native TCP relay: out of memory");
    return NULL;
  }
  struct epoll_event interest = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 .data.ptr = s};
  int result = connect(fd, (struct sockaddr *)&address, length);
  int error = result == 0 || errno == EINPROGRESS ? 0 : errno;
  if (error == 0 && epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &interest) != 0) error = errno;
  if (error != 0) {
    /* Refused at once (or could not be polled): reported like a later failure. */
    event *ev = push_event(e, EV_CONNECTED, s->id);
    if (ev) {
      snprintf(ev->text, sizeof ev->text, "%s", uv_err_name(uv_translate_sys_error(error)));
      ev->has_text = 1;
    }
    uint64_t id = s->id;
    drop(e, s, 0);
    napi_value value;
    CHECK(napi_create_double(env, (double)id, &value));
    return value;
  }
  if (result == 0) {
    s->writable = 1;
    make_ready(e, s);
  }
  napi_value value;
  CHECK(napi_create_double(env, (double)s->id, &value));
  return value;
}

/* The socket named by argument 0, in `state` and `role` (0: any), or NULL after throwing. */
static sock *argument_sock(napi_env env, engine *e, napi_value value, int role, int state) {
  uint64_t id;
  sock *s = get_id(env, value, &id) == 0 ? find(e, id) : NULL;
  if (s == NULL || (role && s->role != role) || (state && s->state != state)) {
    napi_throw_error(env, "ERR_MOAT_TCP_GONE", "no such native socket in that state");
    return NULL;
  }
  return s;
}

static napi_value adopt(napi_env env, napi_callback_info info) {
  COMMAND(1);
  sock *s = argc < 1 ? NULL : argument_sock(env, e, argv[0], CLIENT, S_PARKED);
  if (s == NULL) return NULL;
  int fd = s->fd;
  drop(e, s, 1);
  napi_value value;
  CHECK(napi_create_int32(env, fd, &value));
  return value;
}

static napi_value splice_pair(napi_env env, napi_callback_info info) {
  COMMAND(6);
  uint32_t idle_ms, finished_idle_ms;
  bool watch_client;
  if (argc < 5 || napi_get_value_uint32(env, argv[2], &idle_ms) != napi_ok ||
      napi_get_value_uint32(env, argv[3], &finished_idle_ms) != napi_ok ||
      napi_get_value_bool(env, argv[4], &watch_client) != napi_ok) {
    napi_throw_type_error(env, NULL,
                          "splice(client, upstream, idleMs, finishedIdleMs, watch, toClient?)");
    return NULL;
  }
  void *to_client = NULL;
  size_t to_client_length = 0;
  if (argc >= 6) {
    bool is_buffer = false;
    napi_is_buffer(env, argv[5], &is_buffer);
    if (is_buffer) CHECK(napi_get_buffer_info(env, argv[5], &to_client, &to_client_length));
  }
  sock *client = argument_sock(env, e, argv[0], CLIENT, S_PARKED);
  if (client == NULL) return NULL;
  sock *upstream = argument_sock(env, e, argv[1], UPSTREAM, S_PARKED);
  if (upstream == NULL) return NULL;
  client->peer = upstream;
  upstream->peer = client;
  client->state = upstream->state = S_SPLICED;
  client->watched = watch_client;
  client->idle_ms = idle_ms;
  client->finished_idle_ms = finished_idle_ms;
  client->since = uv_now(e->loop);
  if (write_to(e, client, to_client, to_client_length) != 0) {
    fail(e, client);
    return NULL;
  }
  make_ready(e, client);
  make_ready(e, upstream);
  return NULL;
}

/*
 * The side read from in tunnel `id` (dir 0: the client, 1: the upstream), or NULL: after
 * throwing for a bad dir, or with *gone set when the tunnel has closed. A tunnel the relay
 * closed (a reset, an idle timeout) is told to JavaScript by a CLOSED event that may still be
 * queued behind the event it is answering, so a closed tunnel is no error here.
 */
static sock *tunnel_side(napi_env env, engine *e, napi_value id_value, napi_value dir_value,
                         int *gone) {
  int32_t dir;
  uint64_t id;
  if (napi_get_value_int32(env, dir_value, &dir) != napi_ok || (dir != 0 && dir != 1)) {
    napi_throw_range_error(env, NULL, "dir must be 0 (client to upstream) or 1");
    return NULL;
  }
  sock *client = get_id(env, id_value, &id) == 0 ? find(e, id) : NULL;
  if (client == NULL || client->role != CLIENT || client->state != S_SPLICED) {
    *gone = 1;
    return NULL;
  }
  return dir == 0 ? client : client->peer;
}

static napi_value boolean(napi_env env, bool value) {
  napi_value result;
  CHECK(napi_get_boolean(env, value, &result));
  return result;
}

/* watch(client, dir, on) -> false when the tunnel has closed */
static napi_value watch(napi_env env, napi_callback_info info) {
  COMMAND(3);
  bool on;
  if (argc < 3 || napi_get_value_bool(env, argv[2], &on) != napi_ok) {
    napi_throw_type_error(env, NULL, "watch(client, dir, on)");
    return NULL;
  }
  int gone = 0;
  sock *src = tunnel_side(env, e, argv[0], argv[1], &gone);
  if (src == NULL) return gone ? boolean(env, false) : NULL;
  src->watched = on;
  make_ready(e, src);
  return boolean(env, true);
}

/* send(client, dir, bytes) -> false when the tunnel has closed */
static napi_value send_bytes(napi_env env, napi_callback_info info) {
  COMMAND(3);
  void *data;
  size_t length;
  bool is_buffer = false;
  if (argc < 3 || napi_is_buffer(env, argv[2], &is_buffer) != napi_ok || !is_buffer) {
    napi_throw_type_error(env, NULL, "send(client, dir, bytes: Buffer)");
    return NULL;
  }
  int gone = 0;
  sock *src = tunnel_side(env, e, argv[0], argv[1], &gone);
  if (src == NULL) return gone ? boolean(env, false) : NULL;
  CHECK(napi_get_buffer_info(env, argv[2], &data, &length));
  sock *dst = src->peer;
  if (dst->wr_shut) return boolean(env, true); /* a write after its end: dropped */
  if (write_to(e, dst, data, length) != 0) fail(e, dst);
  return boolean(env, true);
}

/* end(client, dir) -> false when the tunnel has closed */
static napi_value end_side(napi_env env, napi_callback_info info) {
  COMMAND(2);
  if (argc < 2) {
    napi_throw_type_error(env, NULL, "end(client, dir)");
    return NULL;
  }
  int gone = 0;
  sock *src = tunnel_side(env, e, argv[0], argv[1], &gone);
  if (src == NULL) return gone ? boolean(env, false) : NULL;
  if (src->rd_eof && src->hold_end) {
    src->hold_end = 0;
    end_toward(e, src->peer);
  }
  return boolean(env, true);
}

static napi_value close_any(napi_env env, napi_callback_info info) {
  COMMAND(1);
  uint64_t id;
  sock *s = argc >= 1 && get_id(env, argv[0], &id) == 0 ? find(e, id) : NULL;
  napi_value result;
  if (s == NULL) {
    CHECK(napi_get_undefined(env, &result));
    return result;
  }
  double up = 0, down = 0;
  if (s->state == S_SPLICED) {
    sock *client = s->role == CLIENT ? s : s->peer;
    up = client->peer->written;
    down = client->written;
    close_tunnel(e, client, 0);
  } else {
    if (s->role == LISTENER) {
      /* Its clients that sent nothing yet have no one left to decide for them. */
      for (sock *other = e->live; other; other = other->next)
        if (other->state == S_HEAD && other->listener == s->id) drop(e, other, 0);
    } else if (s->role == CLIENT && s->state == S_HEAD) {
      /* Refused before a byte was read (over its budget): a reset, not an orderly end. */
      struct linger reset = {.l_onoff = 1, .l_linger = 0};
      setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    }
    drop(e, s, 0);
  }
  napi_value value;
  CHECK(napi_create_array_with_length(env, 2, &result));
  CHECK(napi_create_double(env, up, &value));
  CHECK(napi_set_element(env, result, 0, value));
  CHECK(napi_create_double(env, down, &value));
  CHECK(napi_set_element(env, result, 1, value));
  return result;
}

static napi_value stats(napi_env env, napi_callback_info info) {
  (void)info;
  engine *e = NULL;
  napi_get_instance_data(env, (void **)&e);
  napi_value result, value;
  CHECK(napi_create_array_with_length(env, 2, &result));
  CHECK(napi_create_double(env, e ? (double)e->live_count : 0, &value));
  CHECK(napi_set_element(env, result, 0, value));
  CHECK(napi_create_double(env, e ? e->pending_total : 0, &value));
  CHECK(napi_set_element(env, result, 1, value));
  return result;
}

/*
 * Where the kernel's NAT sent a connection the transparent listener accepted before it was
 * redirected (conntrack's original destination, IPv4): [address, port], or undefined when the
 * connection was not redirected. Needs no engine: it reads one option of the socket `fd`.
 */
static napi_value original_destination(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], result, value, nothing;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  CHECK(napi_get_undefined(env, &nothing));
  int32_t fd;
  if (argc < 1 || napi_get_value_int32(env, argv[0], &fd) != napi_ok || fd < 0) {
    napi_throw_type_error(env, NULL, "originalDestination(fd: a socket's descriptor)");
    return NULL;
  }
  struct sockaddr_in original;
  socklen_t length = sizeof original;
  if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &original, &length) != 0 ||
      original.sin_family != AF_INET)
    return nothing;
  char text[INET_ADDRSTRLEN];
  if (inet_ntop(AF_INET, &original.sin_addr, text, sizeof text) == NULL) return nothing;
  CHECK(napi_create_array_with_length(env, 2, &result));
  CHECK(napi_create_string_latin1(env, text, NAPI_AUTO_LENGTH, &value));
  CHECK(napi_set_element(env, result, 0, value));
  CHECK(napi_create_int32(env, ntohs(original.sin_port), &value));
  CHECK(napi_set_element(env, result, 1, value));
  return result;
}

/* ---- teardown ------------------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *handle) {
  engine *e = handle->data;
  if (--e->handles_open > 0) return;
  napi_delete_reference(e->env, e->on_event);
  napi_async_destroy(e->env, e->async);
  napi_remove_async_cleanup_hook(e->cleanup);
  bury(e);
  free(e->slots);
  free(e->free_slots);
  free(e->events);
  free(e->arena);
  free(e);
}

/* The environment is going away (process or worker exit): every socket is closed. */
static void close_handles(engine *e) {
  if (e->closing) return;
  e->closing = 1;
  while (e->live) drop(e, e->live, 0);
  for (sock *s = e->ready; s;) {
    sock *next = s->ready_next;
    s->ready_next = e->graveyard;
    e->graveyard = s;
    s = next;
  }
  for (sock *s = e->after; s;) {
    sock *next = s->ready_next;
    s->ready_next = e->graveyard;
    e->graveyard = s;
    s = next;
  }
  e->ready = e->ready_tail = e->after = e->after_tail = NULL;
  napi_set_instance_data(e->env, NULL, NULL, NULL);
  uv_poll_stop(&e->poll); /* before its descriptor closes, as libuv asks */
  close(e->epfd);
  uv_close((uv_handle_t *)&e->poll, on_handle_closed);
  uv_close((uv_handle_t *)&e->sweep, on_handle_closed);
  uv_close((uv_handle_t *)&e->later, on_handle_closed);
}

static napi_value Init(napi_env env, napi_value exports) {
  static const struct {
    const char *name;
    napi_callback fn;
  } functions[] = {
      {"init", init},         {"listen", listen_tcp}, {"dial", dial},
      {"adopt", adopt},       {"splice", splice_pair}, {"watch", watch},
      {"send", send_bytes},   {"end", end_side},      {"close", close_any},
      {"stats", stats},       {"originalDestination", original_destination},
  };
  for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++) {
    napi_value fn;
    CHECK(napi_create_function(env, functions[i].name, NAPI_AUTO_LENGTH, functions[i].fn, NULL,
                               &fn));
    CHECK(napi_set_named_property(env, exports, functions[i].name, fn));
  }
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
