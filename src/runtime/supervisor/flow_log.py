"""Moat's reader of the kernel's direct-flow log, run as the host's root, one for all sandboxes.

Each sandbox's firewall logs the first packet of every direct flow it allows or refuses to
NFLOG group GROUP of its own network namespace (rate-limited there). This process opens one
netfilter netlink socket inside each namespace Moat names (a socket stays in the namespace it
was made in) and writes one line per logged packet to standard output:

    <sandboxID> <allow|deny> <tcp|udp|icmp|other> <destination address> <destination port>

Standard input takes `add <sandboxID> <namespace file>` and `remove <sandboxID>`. Bytes in a log
message come from the sandbox's own packets: every length is checked, nothing is trusted.
"""
import os
import re
import select
import socket
import struct
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
import sysapi  # noqa: E402

# Moat reads this process's output: it must not outlive Moat.
sysapi.prctl(sysapi.PR_SET_PDEATHSIG, 9)  # SIGKILL
if os.getppid() == 1:
    sys.exit('flow_log: Moat ended before it started')

NETLINK_NETFILTER = 12
CLONE_NEWNET = 0x40000000
NFNL_SUBSYS_ULOG = 4
NFULNL_MSG_PACKET = 0
NFULNL_MSG_CONFIG = 1
NLM_F_REQUEST = 1
NFULA_PAYLOAD = 9
NFULA_PREFIX = 10
NFULA_CFG_CMD = 1
NFULA_CFG_MODE = 2
NFULA_CFG_TIMEOUT = 4
NFULA_CFG_QTHRESH = 5
# The kernel holds log messages back up to a second by default: flush within 50 ms, or sooner
# once 32 are queued (flows come at most a few hundred a second, by the firewall's limit).
FLUSH_HUNDREDTHS = 5
FLUSH_MESSAGES = 32
NFULNL_CFG_CMD_BIND = 1
NFULNL_CFG_CMD_PF_BIND = 3
NFULNL_COPY_PACKET = 2
# An IPv4 header with options and a transport header's ports.
COPY_BYTES = 64
SANDBOX_ID = re.compile(r'^[a-z0-9]{1,64}$')
PROTOCOLS = {6: 'tcp', 17: 'udp', 1: 'icmp'}

group = int(sys.argv[1])
own_namespace = os.open('/proc/self/ns/net', os.O_RDONLY | os.O_CLOEXEC)
sockets = {}  # sandboxID -> socket
owners = {}  # fd -> sandboxID
poller = select.epoll()


def attribute(kind, data):
    length = 4 + len(data)
    return struct.pack('HH', length, kind) + data + b'\0' * ((4 - length % 4) % 4)


def config(sock, family, resource, attributes, seq):
    body = struct.pack('BBH', family, 0, socket.htons(resource)) + attributes
    header = struct.pack('IHHII', 16 + len(body), (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
                         NLM_F_REQUEST, seq, 0)
    sock.send(header + body)


def open_in(namespace_file):
    """A netlink socket bound to GROUP inside the namespace of `namespace_file`."""
    fd = os.open(namespace_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        sysapi.setns(fd, CLONE_NEWNET)
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK,
                                 NETLINK_NETFILTER)
        finally:
            sysapi.setns(own_namespace, CLONE_NEWNET)
    finally:
        os.close(fd)
    sock.bind((0, 0))
    config(sock, socket.AF_INET, 0,
           attribute(NFULA_CFG_CMD, bytes([NFULNL_CFG_CMD_PF_BIND, 0, 0, 0])), 1)
    config(sock, 0, group, attribute(NFULA_CFG_CMD, bytes([NFULNL_CFG_CMD_BIND, 0, 0, 0])), 2)
    config(sock, 0, group,
           attribute(NFULA_CFG_MODE, struct.pack('>IBB', COPY_BYTES, NFULNL_COPY_PACKET, 0) + b'\0\0'),
           3)
    config(sock, 0, group, attribute(NFULA_CFG_TIMEOUT, struct.pack('>I', FLUSH_HUNDREDTHS)), 4)
    config(sock, 0, group, attribute(NFULA_CFG_QTHRESH, struct.pack('>I', FLUSH_MESSAGES)), 5)
    return sock


def destination(payload):
    """(protocol, address, port) of an IPv4 packet's start; None when it is not one."""
    if len(payload) < 20 or payload[0] >> 4 != 4:
        return None
    header = (payload[0] & 0x0F) * 4
    if header < 20 or len(payload) < header:
        return None
    protocol = payload[9]
    address = socket.inet_ntoa(payload[16:20])
    port = 0
    if protocol in (6, 17) and len(payload) >= header + 4:
        port = struct.unpack('>H', payload[header + 2:header + 4])[0]
    return PROTOCOLS.get(protocol, 'other'), address, port


def messages(data):
    """Each netfilter log packet of a netlink read: (prefix, payload)."""
    at = 0
    while at + 16 <= len(data):
        length, kind = struct.unpack_from('IH', data, at)
        if length < 16 or at + length > len(data):
            return
        if kind == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET:
            prefix, payload = b'', b''
            inner = at + 16 + 4  # past nlmsghdr and nfgenmsg
            end = at + length
            while inner + 4 <= end:
                size, attr_kind = struct.unpack_from('HH', data, inner)
                if size < 4 or inner + size > end:
                    break
                value = data[inner + 4:inner + size]
                attr_kind &= 0x7FFF
                if attr_kind == NFULA_PREFIX:
                    prefix = value.rstrip(b'\0')
                elif attr_kind == NFULA_PAYLOAD:
                    payload = value
                inner += (size + 3) & ~3
            yield prefix, payload
        at += (length + 3) & ~3


def command(line):
    parts = line.split()
    if len(parts) == 3 and parts[0] == 'add' and SANDBOX_ID.match(parts[1]):
        remove(parts[1])
        try:
            sock = open_in(parts[2])
        except OSError as error:
            print(f'{parts[1]} error {error.strerror}', flush=True)
            return
        sockets[parts[1]] = sock
        owners[sock.fileno()] = parts[1]
        poller.register(sock.fileno(), select.EPOLLIN)
    elif len(parts) == 2 and parts[0] == 'remove':
        remove(parts[1])


def remove(sandbox_id):
    sock = sockets.pop(sandbox_id, None)
    if sock is not None:
        owners.pop(sock.fileno(), None)
        poller.unregister(sock.fileno())
        sock.close()


def main():
    pending = b''
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    poller.register(stdin, select.EPOLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == stdin:
                try:
                    chunk = os.read(stdin, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                pending += chunk
                *lines, pending = pending.split(b'\n')
                pending = pending[-4096:]
                for line in lines:
                    command(line.decode('ascii', 'replace'))
                continue
            sandbox_id = owners.get(fd)
            if sandbox_id is None:
                continue
            try:
                data = sockets[sandbox_id].recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                # ENOBUFS: the kernel dropped messages it could not queue; the next ones come.
                continue
            out = []
            for prefix, payload in messages(data):
                verdict = {b'moat-allow': 'allow', b'moat-deny': 'deny'}.get(prefix.strip())
                found = destination(payload)
                if verdict and found:
                    out.append(f'{sandbox_id} {verdict} {found[0]} {found[1]} {found[2]}\n')
            if out:
                sys.stdout.write(''.join(out))
                sys.stdout.flush()


main()
