{
  "targets": [
    {
      "target_name": "moat_udp_batch",
      "sources": ["native/udp_batch.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Werror"]
    },
    {
      "target_name": "moat_tcp_relay",
      "sources": ["native/tcp_relay.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Werror"]
    }
  ]
}
