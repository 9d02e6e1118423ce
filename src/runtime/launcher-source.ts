/**
 * The launcher: a small Python program that runs once per sandbox and user, already inside the
 * sandbox's namespaces and freezer cgroup, and starts that sandbox's commands by forking. Starting
 * a command then costs a fork and an exec, instead of a bubblewrap set-up (about 8 ms here), a
 * cgroup v1 join (4-17 ms: the kernel waits for an RCU grace period) and a fork of the whole Moat
 * process (a few ms, blocking Moat's event loop).
 *
 * Protocol, one JSON object per line. Moat writes to the launcher's stdin:
 *   {"op":"start","id":N,"argv":[...],"env":{...},"cwd":"...","stdin":bool,"group":bool,
 *    "pty":{"cols":C,"rows":R}?}   (with pty: a new session on a pseudo-terminal; its output is fd 1)
 *   {"op":"stdin","id":N,"data":"<base64>"}     {"op":"close","id":N}
 *   {"op":"signal","id":N,"signal":9|15}        {"op":"resize","id":N,"cols":C,"rows":R}
 * and reads from its stdout:
 *   {"ev":"started","id":N}   {"ev":"failed","id":N,"error":"..."}
 *   {"ev":"out","id":N,"fd":1|2,"data":"<base64>"}
 *   {"ev":"exit","id":N,"code":C} or {"ev":"exit","id":N,"signal":S}   (after all output)
 * The launcher exits when its stdin closes (Moat went away).
 *
 * It is Python because Python is on every Debian host, starts in tens of milliseconds, and
 * costs about 10 MB per sandbox; a Node launcher would cost several times that.
 */
export const LAUNCHER_SOURCE = String.raw`
import base64, fcntl, json, os, selectors, signal, struct, sys, termios

sel = selectors.DefaultSelector()
procs = {}
events = os.fdopen(1, 'wb', buffering=0)
commands = os.fdopen(0, 'rb', buffering=0)

def send(message):
    data = (json.dumps(message, separators=(',', ':')) + '\n').encode()
    while data:
        data = data[os.write(events.fileno(), data):]

def finish_if_done(pid):
    proc = procs.get(pid)
    if proc is None or proc['status'] is None or proc['open'] > 0:
        return
    del procs[pid]
    status = proc['status']
    if os.WIFSIGNALED(status):
        send({'ev': 'exit', 'id': proc['id'], 'signal': os.WTERMSIG(status)})
    else:
        send({'ev': 'exit', 'id': proc['id'], 'code': os.WEXITSTATUS(status)})

def by_id(ident):
    for pid, proc in procs.items():
        if proc['id'] == ident:
            return pid, proc
    return None, None

def set_size(fd, cols, rows):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', rows, cols, 0, 0))

def start(message):
    ident = message['id']
    terminal = message.get('pty')
    if terminal:
        # One pseudo-terminal: the child's stdin, stdout and stderr; Moat reads and writes its
        # master side.
        out_r, slave = os.openpty()
        set_size(slave, terminal['cols'], terminal['rows'])
        err_r = err_w = None
        in_r, in_w, out_w = slave, os.dup(out_r), slave
    else:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if message.get('stdin') else (os.open('/dev/null', os.O_RDONLY), None)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
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
        send({'ev': 'failed', 'id': ident, 'error': failure.decode(errors='replace')})
        return
    procs[pid] = {'id': ident, 'stdin': in_w, 'open': len(outputs), 'status': None,
                  'group': bool(terminal or message.get('group')), 'terminal': out_r if terminal else None}
    for fd, number in outputs:
        sel.register(fd, selectors.EVENT_READ, (pid, number))
    send({'ev': 'started', 'id': ident})

def command(message):
    op = message['op']
    if op == 'start':
        start(message)
        return
    pid, proc = by_id(message['id'])
    if proc is None:
        return
    if op == 'stdin' and proc['stdin'] is not None:
        try:
            os.write(proc['stdin'], base64.b64decode(message['data']))
        except OSError:
            pass
    elif op == 'close' and proc['stdin'] is not None:
        os.close(proc['stdin'])
        proc['stdin'] = None
    elif op == 'signal':
        try:
            os.kill(-pid if proc['group'] else pid, message['signal'])
        except OSError:
            pass
    elif op == 'resize' and proc['terminal'] is not None:
        try:
            set_size(proc['terminal'], message['cols'], message['rows'])
        except OSError:
            pass

def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        proc = procs.get(pid)
        if proc is None:
            continue
        proc['status'] = status
        if proc['stdin'] is not None:
            os.close(proc['stdin'])
            proc['stdin'] = None
        if proc['group'] and os.WIFSIGNALED(status):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        finish_if_done(pid)

wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
sel.register(wake_r, selectors.EVENT_READ, ('wake', 0))
sel.register(0, selectors.EVENT_READ, ('commands', 0))
pending = b''
while True:
    try:
        ready = sel.select()
    except InterruptedError:
        continue
    for key, _ in ready:
        what, fd_number = key.data
        if what == 'wake':
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            reap()
        elif what == 'commands':
            chunk = os.read(0, 1 << 16)
            if not chunk:
                sys.exit(0)
            pending += chunk
            while b'\n' in pending:
                line, pending = pending.split(b'\n', 1)
                if line:
                    command(json.loads(line))
        else:
            pid = what
            try:
                data = os.read(key.fd, 1 << 16)
            except OSError:
                data = b''
            if data:
                send({'ev': 'out', 'id': procs[pid]['id'], 'fd': fd_number,
                      'data': base64.b64encode(data).decode()})
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
                procs[pid]['open'] -= 1
                finish_if_done(pid)
    reap()
`;
