"""The process role: starts a sandbox's commands by forking, relays their input and output.

One launcher runs per sandbox and user, already inside the sandbox (namespaces, cgroup,
seccomp filter, the user's identity), so starting a command costs a fork and an exec. Requests
from Moat (frames.py):
  {"op":"start","id":N,"argv":[...],"env":{...},"cwd":"...","stdin":bool,"group":bool,
   "pty":{"cols":C,"rows":R}?}      (with pty: a new session on a pseudo-terminal, output as fd 1)
  {"op":"stdin","id":N} + bytes    {"op":"close","id":N}
  {"op":"signal","id":N,"signal":S} {"op":"resize","id":N,"cols":C,"rows":R}
  {"op":"credit","id":N,"bytes":B}  (B more bytes of output may be sent: Moat delivered them)
Events to Moat:
  {"ev":"started","id":N,"pid":P}  {"ev":"failed","id":N,"error":"..."}
  {"ev":"out","id":N,"fd":1|2} + bytes
  {"ev":"taken","id":N,"bytes":B}  (B bytes of input reached the command, or were dropped)
  {"ev":"exit","id":N,"code":C} or {"ev":"exit","id":N,"signal":S}   (after all its output)

Both directions are flow-controlled: a command's output is read only while Moat has granted
room for it (OUTPUT_WINDOW at start, then what Moat credits back), so a client that does not
read makes the command wait, as a full pipe would; input waits here, in the sandbox's memory,
until the command reads it, and Moat sends no more than its window ahead of "taken".
"""
import fcntl
import os
import selectors
import signal
import struct
import termios

import frames
import sysapi

# Must equal OUTPUT_WINDOW in src/runtime/launcher.ts: Moat ends a launcher that sends more.
OUTPUT_WINDOW = 1 << 20
READ_CHUNK = 1 << 16


def _set_size(fd, cols, rows):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', rows, cols, 0, 0))


class Launcher:
    def __init__(self, sock):
        self.sock = sock
        self.selector = selectors.DefaultSelector()
        self.procs = {}

    def send(self, header, payload=b''):
        frames.send(self.sock, header, payload)

    def finish_if_done(self, pid):
        proc = self.procs.get(pid)
        if proc is None or proc['status'] is None or proc['outputs']:
            return
        del self.procs[pid]
        status = proc['status']
        if os.WIFSIGNALED(status):
            self.send({'ev': 'exit', 'id': proc['id'], 'signal': os.WTERMSIG(status)})
        else:
            self.send({'ev': 'exit', 'id': proc['id'], 'code': os.WEXITSTATUS(status)})

    def by_id(self, ident):
        for pid, proc in self.procs.items():
            if proc['id'] == ident:
                return pid, proc
        return None, None

    def start(self, message):
        ident = message['id']
        terminal = message.get('pty')
        opened = []
        try:
            if terminal:
                # One pseudo-terminal: the child's stdin, stdout and stderr; Moat reads its master side.
                out_r, slave = os.openpty()
                opened += [out_r, slave]
                _set_size(slave, int(terminal['cols']), int(terminal['rows']))
                err_r = err_w = None
                in_w = os.dup(out_r)
                opened.append(in_w)
                in_r, out_w = slave, slave
            else:
                out_r, out_w = os.pipe()
                opened += [out_r, out_w]
                err_r, err_w = os.pipe()
                opened += [err_r, err_w]
                in_r, in_w = os.pipe() if message.get('stdin') else (os.open('/dev/null', os.O_RDONLY), None)
                opened += [fd for fd in (in_r, in_w) if fd is not None]
            status_r, status_w = os.pipe2(os.O_CLOEXEC)
            opened += [status_r, status_w]
            pid = os.fork()
        except OSError as error:
            # Out of ptys, descriptors or processes (the sandbox's own budgets): this command
            # fails; the launcher and its other commands go on.
            for fd in opened:
                os.close(fd)
            self.send({'ev': 'failed', 'id': ident, 'error': f'cannot start it: {error.strerror or error}'})
            return
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                if terminal:
                    os.setsid()
                    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                elif message.get('group'):
                    os.setpgid(0, 0)
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w if err_w is not None else out_w, 2)
                os.closerange(3, status_w)
                os.closerange(status_w + 1, 65536)
                # Holding nothing of the launcher's now, the child may be dumpable (as it is after
                # exec anyway), and it may then give up the OOM killer's sparing that the
                # launcher has where the host allowed it.
                sysapi.prctl(sysapi.PR_SET_DUMPABLE, 1)
                try:
                    with open('/proc/self/oom_score_adj', 'w') as adj:
                        adj.write('0')
                except OSError:
                    pass
                os.chdir(message['cwd'])
                argv = message['argv']
                os.execvpe(argv[0], argv, message['env'])
            except BaseException as error:
                os.write(status_w, str(error).encode()[:4000])
            os._exit(127)
        for fd in {out_w, err_w, in_r, status_w} - {None}:
            os.close(fd)
        failure = b''
        while True:
            chunk = os.read(status_r, 4096)
            if not chunk:
                break
            failure += chunk
        os.close(status_r)
        outputs = [(out_r, 1)] + ([(err_r, 2)] if err_r is not None else [])
        if failure:
            for fd in [fd for fd, _ in outputs] + ([in_w] if in_w is not None else []):
                os.close(fd)
            os.waitpid(pid, 0)
            self.send({'ev': 'failed', 'id': ident, 'error': failure.decode(errors='replace')})
            return
        if in_w is not None:
            os.set_blocking(in_w, False)
        self.procs[pid] = {
            'id': ident,
            'stdin': in_w,
            'input': bytearray(),  # input not yet taken by the command
            'close_after_input': False,
            'outputs': dict(outputs),  # open output fd -> 1 or 2
            'credit': OUTPUT_WINDOW,
            'status': None,
            'group': bool(terminal or message.get('group')),
            'terminal': out_r if terminal else None,
        }
        for fd, number in outputs:
            self.selector.register(fd, selectors.EVENT_READ, (pid, number))
        self.send({'ev': 'started', 'id': ident, 'pid': pid})

    def command(self, message, payload):
        op = message.get('op')
        if op == 'start':
            self.start(message)
            return
        pid, proc = self.by_id(message.get('id'))
        if proc is None:
            return
        if op == 'stdin':
            if proc['stdin'] is None or proc['close_after_input']:
                self.taken(proc, len(payload))
            else:
                proc['input'] += payload
                self.feed_input(pid, proc)
        elif op == 'close' and proc['stdin'] is not None:
            proc['close_after_input'] = True
            self.feed_input(pid, proc)
        elif op == 'credit':
            was_out = proc['credit'] <= 0
            proc['credit'] += int(message['bytes'])
            if was_out and proc['credit'] > 0:
                for fd, number in proc['outputs'].items():
                    self.selector.register(fd, selectors.EVENT_READ, (pid, number))
        elif op == 'signal':
            try:
                os.kill(-pid if proc['group'] else pid, int(message['signal']))
            except OSError:
                pass
        elif op == 'resize' and proc['terminal'] is not None:
            try:
                _set_size(proc['terminal'], int(message['cols']), int(message['rows']))
            except OSError:
                pass

    def taken(self, proc, count):
        if count:
            self.send({'ev': 'taken', 'id': proc['id'], 'bytes': count})

    def feed_input(self, pid, proc):
        """Writes what input the command's stdin takes now; waits for it to be writable for the rest."""
        fd = proc['stdin']
        if fd is None:
            return
        written = 0
        try:
            while written < len(proc['input']):
                written += os.write(fd, memoryview(proc['input'])[written:])
        except BlockingIOError:
            pass
        except OSError:
            # The command closed its end: what it will never read counts as taken.
            written = len(proc['input'])
            proc['close_after_input'] = True
        del proc['input'][:written]
        self.taken(proc, written)
        waiting = fd in self.selector.get_map()
        if proc['input']:
            if not waiting:
                self.selector.register(fd, selectors.EVENT_WRITE, ('input', pid))
            return
        if waiting:
            self.selector.unregister(fd)
        if proc['close_after_input']:
            self.close_input(proc)

    def close_input(self, proc):
        fd = proc['stdin']
        if fd is None:
            return
        if fd in self.selector.get_map():
            self.selector.unregister(fd)
        os.close(fd)
        proc['stdin'] = None
        self.taken(proc, len(proc['input']))
        proc['input'] = bytearray()

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            proc = self.procs.get(pid)
            if proc is None:
                continue
            proc['status'] = status
            self.close_input(proc)
            if proc['group'] and os.WIFSIGNALED(status):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.finish_if_done(pid)

    def serve(self):
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(wake_r, selectors.EVENT_READ, ('wake', 0))
        self.selector.register(self.sock, selectors.EVENT_READ, ('commands', 0))
        reader = frames.Reader()
        while True:
            try:
                ready = self.selector.select()
            except InterruptedError:
                continue
            for key, _ in ready:
                what, fd_number = key.data
                if what == 'wake':
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self.reap()
                elif what == 'commands':
                    chunk = os.read(self.sock, 1 << 16)
                    if not chunk:
                        return
                    for header, payload in reader.feed(chunk):
                        self.command(header, payload)
                elif what == 'input':
                    proc = self.procs.get(fd_number)
                    if proc is not None:
                        self.feed_input(fd_number, proc)
                else:
                    self.relay_output(what, key.fd, fd_number)
            self.reap()


    def relay_output(self, pid, fd, number):
        proc = self.procs.get(pid)
        if proc is None or fd not in proc['outputs'] or proc['credit'] <= 0:
            return  # readiness reported before this select round paused or closed it
        try:
            data = os.read(fd, min(READ_CHUNK, proc['credit']))
        except OSError:
            data = b''
        if data:
            proc['credit'] -= len(data)
            self.send({'ev': 'out', 'id': proc['id'], 'fd': number}, data)
            if proc['credit'] <= 0:
                # Out of room: this command's output waits in its pipe until Moat credits more.
                for out_fd in proc['outputs']:
                    self.selector.unregister(out_fd)
        else:
            self.selector.unregister(fd)
            os.close(fd)
            del proc['outputs'][fd]
            self.finish_if_done(pid)


def serve(sock):
    Launcher(sock).serve()
