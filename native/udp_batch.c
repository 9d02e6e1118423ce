/*
 * Batched UDP for the DNS interceptor: recvmmsg(2) and sendmmsg(2) on a socket that libuv
 * polls, so that one wake-up, one call into JavaScript and two system calls serve up to BATCH
 * datagrams. node:dgram makes one call into JavaScript and one system call per datagram in each
 * direction, which costs more than dnsmasq's whole cached answer (README, "Benchmarks").
 *
 * This file moves bytes and addresses only; every byte is parsed in TypeScript. The buffers it
 * shares with JavaScript are fixed-size and every length and offset JavaScript hands back is
 * checked here before use.
 *
 * JavaScript face (src/dns/udp.ts):
 *   open(host, port, onBatch) -> { handle, port, received, receivedMeta, replies, replyMeta }
 *   send(handle, count) -> undefined | { failed, code }   sends replies[0..count)
 *   close(handle, onClosed)
 * Meta rows are META int32s: [length, family (4 or 6), port, address bytes (4 or 16)...,
 * IPv6 scope id (row[7])].
 * A received datagram longer than SLOT is reported with its real length and no bytes.
 */
#define _GNU_SOURCE
#define NAPI_VERSION 8
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <node_api.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>
#include "napi_shared.h"

enum {
  BATCH = 64,    /* datagrams per system call */
  SLOT = 4096,   /* bytes per received datagram; longer ones are reported, not read */
  META = 8,      /* int32s per meta row */
  ROUNDS = 4,    /* full batches per wake-up before the event loop gets its turn */
  REPLY_BYTES = BATCH * SLOT,
};

typedef struct udp_batch udp_batch;

/*
 * What JavaScript holds: a box that outlives the socket, so that a handle used after its socket
 * closed finds NULL here instead of freed memory. Freed by the external's finalizer.
 */
typedef struct {
  udp_batch *socket;
} handle_box;

/* Marks externals made here, so that no other external is ever taken for a socket. */
static const napi_type_tag HANDLE_TAG = {0x6d6f61745f756470ULL, 0x62617463685f7631ULL};

struct udp_batch {
  napi_env env;
  handle_box *box;
  napi_ref callback, on_closed;
  napi_ref buffers[4];
  napi_async_context async;
  napi_async_cleanup_hook_handle cleanup;
  uv_poll_t poll;
  int fd;
  int family;
  int closing;
  int env_ending; /* no JavaScript may run: the environment is being torn down */
  uint8_t *received;
  int32_t *received_meta;
  uint8_t *replies;
  int32_t *reply_meta;
  struct mmsghdr messages[BATCH];
  struct iovec slots[BATCH];
  struct sockaddr_in6 peers[BATCH];
};

/* Writes a peer into a meta row; IPv4-mapped IPv6 peers of a dual-stack socket become IPv4. */
static void write_peer(int32_t *row, const struct sockaddr_in6 *peer) {
  uint8_t *address = (uint8_t *)(row + 3);
  if (peer->sin6_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)peer;
    row[1] = 4;
    row[2] = ntohs(v4->sin_port);
    memcpy(address, &v4->sin_addr, 4);
  } else if (IN6_IS_ADDR_V4MAPPED(&peer->sin6_addr)) {
    row[1] = 4;
    row[2] = ntohs(peer->sin6_port);
    memcpy(address, &peer->sin6_addr.s6_addr[12], 4);
  } else {
    row[1] = 6;
    row[2] = ntohs(peer->sin6_port);
    memcpy(address, &peer->sin6_addr, 16);
    row[7] = (int32_t)peer->sin6_scope_id;
    return;
  }
  row[7] = 0;
}

/* Reads a meta row into a destination for this socket's family; 0 when it cannot be one. */
static socklen_t read_peer(const udp_batch *s, const int32_t *row, struct sockaddr_in6 *peer) {
  const uint8_t *address = (const uint8_t *)(row + 3);
  memset(peer, 0, sizeof *peer);
  if (row[2] < 1 || row[2] > 65535) return 0;
  if (s->family == AF_INET) {
    struct sockaddr_in *v4 = (struct sockaddr_in *)peer;
    if (row[1] != 4) return 0;
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)row[2]);
    memcpy(&v4->sin_addr, address, 4);
    return sizeof *v4;
  }
  peer->sin6_family = AF_INET6;
  peer->sin6_port = htons((uint16_t)row[2]);
  if (row[1] == 4) {
    peer->sin6_addr.s6_addr[10] = 0xff;
    peer->sin6_addr.s6_addr[11] = 0xff;
    memcpy(&peer->sin6_addr.s6_addr[12], address, 4);
  } else if (row[1] == 6) {
    memcpy(&peer->sin6_addr, address, 16);
    peer->sin6_scope_id = (uint32_t)row[7];
  } else {
    return 0;
  }
  return sizeof *peer;
}

static int receive_batch(udp_batch *s) {
  for (int i = 0; i < BATCH; i++) {
    struct msghdr *header = &s->messages[i].msg_hdr;
    header->msg_name = &s->peers[i];
    header->msg_namelen = sizeof s->peers[i];
    header->msg_iov = &s->slots[i];
    header->msg_iovlen = 1;
    header->msg_control = NULL;
    header->msg_controllen = 0;
    header->msg_flags = 0;
  }
  int count;
  do {
    /* MSG_TRUNC: msg_len is a longer datagram's real length, so it can be told apart. */
    count = recvmmsg(s->fd, s->messages, BATCH, MSG_DONTWAIT | MSG_TRUNC, NULL);
  } while (count < 0 && errno == EINTR);
  for (int i = 0; i < count; i++) {
    int32_t *row = s->received_meta + i * META;
    row[0] = (int32_t)s->messages[i].msg_len;
    write_peer(row, &s->peers[i]);
  }
  return count;
}

static void deliver(udp_batch *s, int count) {
  napi_value callback, argument;
  if (napi_get_reference_value(s->env, s->callback, &callback) != napi_ok) return;
  napi_create_int32(s->env, count, &argument);
  call_js(s->env, s->async, callback, 1, &argument);
}

static void on_readable(uv_poll_t *poll, int status, int events) {
  (void)events;
  udp_batch *s = poll->data;
  if (status < 0) {
    /* libuv stops a poll that saw POLLERR: clear the socket's error and poll again. */
    int error;
    socklen_t length = sizeof error;
    getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (!s->closing) uv_poll_start(&s->poll, UV_READABLE, on_readable);
    return;
  }
  napi_handle_scope scope;
  if (napi_open_handle_scope(s->env, &scope) != napi_ok) return;
  for (int round = 0; round < ROUNDS && !s->closing; round++) {
    int count = receive_batch(s);
    if (count <= 0) break;
    deliver(s, count);
    if (count < BATCH) break;
  }
  napi_close_handle_scope(s->env, scope);
}

static void on_poll_closed(uv_handle_t *handle) {
  udp_batch *s = handle->data;
  napi_env env = s->env;
  close(s->fd);
  napi_value on_closed = NULL;
  napi_handle_scope scope;
  int scoped = napi_open_handle_scope(env, &scope) == napi_ok;
  if (scoped && s->on_closed != NULL) napi_get_reference_value(env, s->on_closed, &on_closed);
  if (on_closed != NULL && !s->env_ending) call_js(s->env, s->async, on_closed, 0, NULL);
  if (scoped) napi_close_handle_scope(env, scope);
  napi_delete_reference(env, s->callback);
  if (s->on_closed != NULL) napi_delete_reference(env, s->on_closed);
  for (int i = 0; i < 4; i++) napi_delete_reference(env, s->buffers[i]);
  napi_async_destroy(env, s->async);
  if (s->cleanup != NULL) napi_remove_async_cleanup_hook(s->cleanup);
  if (s->box != NULL) s->box->socket = NULL;
  free(s);
}

static void begin_close(udp_batch *s) {
  if (s->closing) return;
  s->closing = 1;
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, on_poll_closed);
}

/* The handle was collected: close a socket still open (udp.ts always closes first). */
static void finalize_box(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  handle_box *box = data;
  if (box->socket != NULL) {
    box->socket->box = NULL;
    begin_close(box->socket);
  }
  free(box);
}

/* The environment is going away (process or worker exit) with the socket still open. */
static void on_env_cleanup(napi_async_cleanup_hook_handle handle, void *data) {
  (void)handle;
  udp_batch *s = data;
  s->env_ending = 1;
  begin_close(s);
}

static napi_value make_buffer(napi_env env, size_t size, void **data, napi_ref *ref) {
  napi_value buffer;
  CHECK(napi_create_buffer(env, size, data, &buffer));
  memset(*data, 0, size);
  CHECK(napi_create_reference(env, buffer, 1, ref));
  return buffer;
}

static int bind_socket(napi_env env, const char *host, int port, int *family) {
  struct sockaddr_in6 address;
  socklen_t length;
  memset(&address, 0, sizeof address);
  struct sockaddr_in *v4 = (struct sockaddr_in *)&address;
  if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    length = sizeof *v4;
  } else if (inet_pton(AF_INET6, host, &address.sin6_addr) == 1) {
    address.sin6_family = AF_INET6;
    address.sin6_port = htons((uint16_t)port);
    length = sizeof address;
  } else {
    napi_throw_error(env, "EINVAL", "udp listen address is not an IP address");
    return -1;
  }
  *family = address.sin6_family;
  int fd = socket(*family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw_errno(env, "udp socket", errno);
    return -1;
  }
  int off = 0;
  /* Like node:dgram's udp6: an IPv6 socket also takes IPv4 (peers arrive IPv4-mapped). */
  if (*family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  if (bind(fd, (struct sockaddr *)&address, length) != 0) {
    int error = errno;
    close(fd);
    throw_errno(env, "udp bind", error);
    return -1;
  }
  return fd;
}

static napi_value open_socket(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  char host[INET6_ADDRSTRLEN];
  size_t host_length;
  int32_t port;
  napi_valuetype callback_type;
  if (argc < 3 ||
      napi_get_value_string_utf8(env, argv[0], host, sizeof host, &host_length) != napi_ok ||
      napi_get_value_int32(env, argv[1], &port) != napi_ok || port < 0 || port > 65535 ||
      napi_typeof(env, argv[2], &callback_type) != napi_ok || callback_type != napi_function) {
    napi_throw_type_error(env, NULL, "open(host: string, port: number, onBatch: function)");
    return NULL;
  }
  int family;
  int fd = bind_socket(env, host, port, &family);
  if (fd < 0) return NULL;
  struct sockaddr_in6 bound;
  socklen_t bound_length = sizeof bound;
  getsockname(fd, (struct sockaddr *)&bound, &bound_length);

  udp_batch *s = calloc(1, sizeof *s);
  handle_box *box = malloc(sizeof *box);
  if (s == NULL || box == NULL) {
    free(s);
    free(box);
    close(fd);
    napi_throw_error(env, "ENOMEM", "udp batch: out of memory");
    return NULL;
  }
  box->socket = s;
  s->box = box;
  s->env = env;
  s->fd = fd;
  s->family = family;
  napi_value result, handle, value, resource_name;
  napi_value received = make_buffer(env, BATCH * SLOT, (void **)&s->received, &s->buffers[0]);
  napi_value received_meta =
      make_buffer(env, BATCH * META * 4, (void **)&s->received_meta, &s->buffers[1]);
  napi_value replies = make_buffer(env, REPLY_BYTES, (void **)&s->replies, &s->buffers[2]);
  napi_value reply_meta =
      make_buffer(env, BATCH * META * 4, (void **)&s->reply_meta, &s->buffers[3]);
  uv_loop_t *loop;
  if (received == NULL || received_meta == NULL || replies == NULL || reply_meta == NULL ||
      napi_create_reference(env, argv[2], 1, &s->callback) != napi_ok ||
      napi_create_string_utf8(env, "MOAT_DNS_UDP", NAPI_AUTO_LENGTH, &resource_name) != napi_ok ||
      napi_async_init(env, NULL, resource_name, &s->async) != napi_ok ||
      napi_get_uv_event_loop(env, &loop) != napi_ok) {
    close(fd);
    free(box);
    free(s); /* the references leak with the failed call, which only runs out of memory */
    return NULL;
  }
  for (int i = 0; i < BATCH; i++) {
    s->slots[i].iov_base = s->received + i * SLOT;
    s->slots[i].iov_len = SLOT;
  }
  uv_poll_init(loop, &s->poll, fd);
  s->poll.data = s;
  uv_poll_start(&s->poll, UV_READABLE, on_readable);
  napi_add_async_cleanup_hook(env, on_env_cleanup, s, &s->cleanup);

  CHECK(napi_create_object(env, &result));
  CHECK(napi_create_external(env, box, finalize_box, NULL, &handle));
  CHECK(napi_type_tag_object(env, handle, &HANDLE_TAG));
  CHECK(napi_set_named_property(env, result, "handle", handle));
  CHECK(napi_create_int32(env, ntohs(bound.sin6_port), &value));
  CHECK(napi_set_named_property(env, result, "port", value));
  CHECK(napi_set_named_property(env, result, "received", received));
  CHECK(napi_set_named_property(env, result, "receivedMeta", received_meta));
  CHECK(napi_set_named_property(env, result, "replies", replies));
  CHECK(napi_set_named_property(env, result, "replyMeta", reply_meta));
  return result;
}

static udp_batch *open_handle(napi_env env, napi_value value) {
  bool tagged = false;
  handle_box *box = NULL;
  if (napi_check_object_type_tag(env, value, &HANDLE_TAG, &tagged) == napi_ok && tagged)
    napi_get_value_external(env, value, (void **)&box);
  udp_batch *s = box != NULL ? box->socket : NULL;
  if (s == NULL || s->closing) {
    napi_throw_error(env, "ERR_SOCKET_DGRAM_NOT_RUNNING", "the udp socket is closed");
    return NULL;
  }
  return s;
}

static napi_value send_replies(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  int32_t count;
  udp_batch *s = argc == 2 ? open_handle(env, argv[0]) : NULL;
  if (s == NULL) return NULL;
  if (napi_get_value_int32(env, argv[1], &count) != napi_ok || count < 0 || count > BATCH) {
    napi_throw_range_error(env, NULL, "send: count must be 0..64");
    return NULL;
  }
  struct mmsghdr messages[BATCH];
  struct iovec parts[BATCH];
  struct sockaddr_in6 peers[BATCH];
  size_t offset = 0;
  int failed = 0, first_error = 0, ready = 0;
  for (int i = 0; i < count; i++) {
    const int32_t *row = s->reply_meta + i * META;
    socklen_t peer_length = read_peer(s, row, &peers[ready]);
    if (row[0] < 0 || (size_t)row[0] > REPLY_BYTES - offset) {
      napi_throw_range_error(env, NULL, "send: reply lengths overrun the reply buffer");
      return NULL;
    }
    size_t length = (size_t)row[0];
    if (peer_length == 0) {
      failed++;
      if (first_error == 0) first_error = EAFNOSUPPORT;
    } else {
      parts[ready].iov_base = s->replies + offset;
      parts[ready].iov_len = length;
      memset(&messages[ready], 0, sizeof messages[ready]);
      messages[ready].msg_hdr.msg_name = &peers[ready];
      messages[ready].msg_hdr.msg_namelen = peer_length;
      messages[ready].msg_hdr.msg_iov = &parts[ready];
      messages[ready].msg_hdr.msg_iovlen = 1;
      ready++;
    }
    offset += length;
  }
  for (int sent = 0; sent < ready;) {
    int done = sendmmsg(s->fd, messages + sent, (unsigned)(ready - sent), MSG_DONTWAIT);
    if (done > 0) {
      sent += done;
    } else if (done < 0 && errno == EINTR) {
      continue;
    } else {
      /* This datagram cannot go (a full send buffer, an unreachable peer): UDP drops it. */
      if (first_error == 0) first_error = done < 0 ? errno : EIO;
      failed++;
      sent++;
    }
  }
  napi_value result, value;
  if (failed == 0) {
    CHECK(napi_get_undefined(env, &result));
    return result;
  }
  int code = uv_translate_sys_error(first_error);
  CHECK(napi_create_object(env, &result));
  CHECK(napi_create_int32(env, failed, &value));
  CHECK(napi_set_named_property(env, result, "failed", value));
  CHECK(napi_create_string_utf8(env, uv_err_name(code), NAPI_AUTO_LENGTH, &value));
  CHECK(napi_set_named_property(env, result, "code", value));
  return result;
}

static napi_value close_socket(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  udp_batch *s = argc == 2 ? open_handle(env, argv[0]) : NULL;
  if (s == NULL) return NULL;
  CHECK(napi_create_reference(env, argv[1], 1, &s->on_closed));
  begin_close(s);
  return NULL;
}

NAPI_MODULE_INIT() {
  napi_value fn;
  CHECK(napi_create_function(env, "open", NAPI_AUTO_LENGTH, open_socket, NULL, &fn));
  CHECK(napi_set_named_property(env, exports, "open", fn));
  CHECK(napi_create_function(env, "send", NAPI_AUTO_LENGTH, send_replies, NULL, &fn));
  CHECK(napi_set_named_property(env, exports, "send", fn));
  CHECK(napi_create_function(env, "close", NAPI_AUTO_LENGTH, close_socket, NULL, &fn));
  CHECK(napi_set_named_property(env, exports, "close", fn));
  return exports;
}
