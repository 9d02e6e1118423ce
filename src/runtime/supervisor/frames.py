"""The frames Moat and a sandbox role (launcher or file agent) exchange over their socket.

A frame is an 8-byte head (header length, payload length, both unsigned 32-bit big-endian),
a JSON object (the header) and raw payload bytes. Moat parses what a role sends as hostile
(src/runtime/frames.ts); the same bounds hold here.
"""
import json
import os
import struct

HEAD = struct.Struct('!II')
MAX_HEADER = 4 << 20
MAX_PAYLOAD = 1 << 20


class ProtocolError(Exception):
    pass


def encode(header, payload=b''):
    data = json.dumps(header, separators=(',', ':'), ensure_ascii=False).encode()
    if len(data) > MAX_HEADER or len(payload) > MAX_PAYLOAD:
        raise ProtocolError('frame over its size bound')
    return HEAD.pack(len(data), len(payload)) + data + payload


def send(fd, header, payload=b''):
    """Writes one whole frame (blocking: the socket is Moat's, which always reads)."""
    data = memoryview(encode(header, payload))
    while data:
        data = data[os.write(fd, data) :]


class Reader:
    """Splits bytes read from the socket into (header, payload) frames."""

    def __init__(self):
        self.pending = bytearray()

    def feed(self, data):
        self.pending += data
        frames = []
        while len(self.pending) >= HEAD.size:
            header_length, payload_length = HEAD.unpack_from(self.pending)
            if header_length > MAX_HEADER or payload_length > MAX_PAYLOAD:
                raise ProtocolError('frame over its size bound')
            end = HEAD.size + header_length + payload_length
            if len(self.pending) < end:
                break
            header = json.loads(bytes(self.pending[HEAD.size : HEAD.size + header_length]))
            if not isinstance(header, dict):
                raise ProtocolError('frame header is not an object')
            frames.append((header, bytes(self.pending[HEAD.size + header_length : end])))
            del self.pending[:end]
        return frames
