/*
 * What both addons (udp_batch.c, tcp_relay.c) need from N-API alike: bail-outs, errors that
 * carry libuv's error code, and calls into JavaScript from a libuv callback.
 */
#ifndef MOAT_NAPI_SHARED_H
#define MOAT_NAPI_SHARED_H

#include <node_api.h>
#include <stdio.h>
#include <uv.h>

#define CHECK(call)                                                                            \
  do {                                                                                         \
    if ((call) != napi_ok) return NULL;                                                        \
  } while (0)

/* Throws `what: <message>` with the error's libuv name (EADDRINUSE, ...) as its code. */
static inline void throw_errno(napi_env env, const char *what, int error) {
  char message[256];
  int code = uv_translate_sys_error(error);
  snprintf(message, sizeof message, "%s: %s", what, uv_strerror(code));
  napi_throw_error(env, uv_err_name(code), message);
}

/* Calls fn from a libuv callback; an exception it throws goes where a throwing listener's would. */
static inline void call_js(napi_env env, napi_async_context async, napi_value fn, size_t argc,
                           const napi_value *argv) {
  napi_value receiver, result;
  napi_get_global(env, &receiver); /* MakeCallback wants an object */
  if (napi_make_callback(env, async, receiver, fn, argc, argv, &result) ==
      napi_pending_exception) {
    napi_value error;
    napi_get_and_clear_last_exception(env, &error);
    napi_fatal_exception(env, error);
  }
}

#endif
