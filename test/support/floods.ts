/**
 * Floods a hostile sandbox runs against what every sandbox on the host shares: each is one
 * Python program, bounded in count and time, that takes as much of one resource as it is
 * given and holds it until its time is up. It prints `flooding` once it holds something (or
 * has started), and at the end `took <n>`: how much it held or did.
 */

/** What a flood takes. */
export type FloodKind =
  | 'idle-connections'
  | 'keepalive-after-403'
  | 'connection-churn'
  | 'inotify'
  | 'ptys'
  | 'proxied-requests'
  | 'intercepted-names'
  | 'stopped-agent';

/** The longest any flood runs, and the most it takes of anything. */
const BOUND = { seconds: 12, count: 20_000 };

/**
 * Python: `stop_own_roles()` stops (SIGSTOP) every other process of the calling sandbox user
 * that runs Moat's roles (its file agent; its launcher too unless that is the caller's parent)
 * and returns their pids.
 */
export const STOP_OWN_ROLES = String.raw`
import os, signal
def stop_own_roles():
    stopped = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), os.getppid()): continue
        try:
            cmdline = open(f"/proc/{name}/cmdline", "rb").read()
            uid = int(open(f"/proc/{name}/status").read().split("Uid:")[1].split()[1])
        except OSError: continue
        if uid == os.getuid() and b"main.py" in cmdline:
            os.kill(int(name), signal.SIGSTOP)
            stopped.append(name)
    return stopped
`;

const PROGRAM = String.raw`
import ctypes, os, socket, ssl, sys, threading, time, urllib.parse
${STOP_OWN_ROLES}
kind = sys.argv[1]
seconds = min(float(sys.argv[2]), ${BOUND.seconds})
end = time.monotonic() + seconds
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
gateway = (proxy.hostname, proxy.port)
held = []
done = 0
said = False
def flooding():
    global said
    if not said:
        print("flooding", flush=True)
        said = True
def connect():
    s = socket.socket()
    s.settimeout(1)
    s.connect(gateway)
    return s
if kind == "idle-connections":
    while time.monotonic() < end and done < ${BOUND.count}:
        try:
            held.append(connect()); done += 1
        except OSError:
            time.sleep(0.02)
        if done % 100 == 0: flooding()
elif kind == "keepalive-after-403":
    head = b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    while time.monotonic() < end and done < ${BOUND.count}:
        try:
            s = connect(); s.sendall(head); s.recv(4096); held.append(s); done += 1
        except OSError:
            time.sleep(0.02)
        if done % 100 == 0: flooding()
elif kind == "connection-churn":
    while time.monotonic() < end and done < ${BOUND.count} * 5:
        try:
            connect().close(); done += 1
        except OSError:
            pass
        if done % 100 == 0: flooding()
elif kind == "inotify":
    libc = ctypes.CDLL(None, use_errno=True)
    while done < ${BOUND.count} and libc.inotify_init1(0) >= 0:
        done += 1
    flooding()
    time.sleep(max(0, end - time.monotonic()))
elif kind == "ptys":
    while done < ${BOUND.count}:
        try:
            held.append(os.openpty()); done += 1
        except OSError:
            break
    flooding()
    time.sleep(max(0, end - time.monotonic()))
elif kind == "proxied-requests":
    head = b"GET http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n\r\n"
    lock = threading.Lock()
    def requests():
        global done
        while time.monotonic() < end:
            try:
                s = connect()
                while time.monotonic() < end:
                    s.sendall(head)
                    if not s.recv(65536): break
                    with lock: done += 1
            except OSError:
                time.sleep(0.01)
    threads = [threading.Thread(target=requests, daemon=True) for _ in range(16)]
    for t in threads: t.start()
    flooding()
    for t in threads: t.join()
elif kind == "intercepted-names":
    # A TLS handshake through the proxy to name after name under a header rule's wildcard
    # (sys.argv[3]): each asks Moat to mint a leaf for a name it has not seen.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    lock = threading.Lock()
    def handshakes():
        global done
        while time.monotonic() < end:
            with lock:
                done += 1
                name = f"n{done}.{sys.argv[3]}"
            if done > ${BOUND.count}: return
            try:
                s = connect()
                s.sendall(f"CONNECT {name}:443 HTTP/1.1\r\nHost: {name}:443\r\n\r\n".encode())
                if b" 200" not in s.recv(4096): s.close(); continue
                context.wrap_socket(s, server_hostname=name).close()
            except OSError:
                time.sleep(0.01)
    threads = [threading.Thread(target=handshakes, daemon=True) for _ in range(8)]
    for t in threads: t.start()
    flooding()
    for t in threads: t.join()
elif kind == "stopped-agent":
    done = len(stop_own_roles())
    flooding()
    time.sleep(max(0, end - time.monotonic()))
flooding()
print("took", done, flush=True)
`;

/**
 * A shell command that runs one flood for `seconds` (at most 12), as the shell's own process;
 * `wildcard`: the domain under which `intercepted-names` asks for names.
 */
export function floodCommand(kind: FloodKind, seconds: number, wildcard = 'wild.test'): string {
  return `exec python3 -u -c '${PROGRAM.replaceAll("'", `'"'"'`)}' ${kind} ${seconds} ${wildcard}`;
}
