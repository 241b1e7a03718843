"""What the Python parts of bench/*.sh share: children whose CPU and
memory are read from the kernel, and ports on 127.0.0.1.

A script's Python (run as `python3 -` from the repository root) imports
it with `sys.path.insert(0, "bench")` and `import lib`.
"""
import os, signal, socket, subprocess, sys, tempfile, time
from collections import namedtuple

HOST = "127.0.0.1"
TICK = os.sysconf("SC_CLK_TCK")

# What a child left: its output, exit code, CPU-seconds (user + system,
# rusage at exit, microseconds), the same from /proc/PID/stat (clock
# ticks, a cross-check), and its peak resident set in MB.
Finished = namedtuple("Finished", "out err rc cpu proc_cpu peak_mb")


class Proc:
    """A child process whose CPU and peak memory are read when it exits."""

    def __init__(self, cmd, deadline):
        self.cmd = cmd
        # Files, not pipes: a child never blocks on a full pipe.
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(cmd, stdout=self.out, stderr=self.err,
                                  stdin=subprocess.DEVNULL, text=True)
        self.deadline = time.time() + deadline

    def first_line(self, timeout=10):
        """The child's first line of output, once written."""
        end = time.time() + timeout
        while time.time() < end:
            self.out.seek(0)
            line = self.out.readline()
            if line.endswith("\n"):
                return line
            if self.p.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"{self.cmd[0]} wrote no first line")

    def hwm_mb(self):
        """The process's peak resident set so far (VmHWM), MB; 0 once it
        has exited."""
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            pass
        return 0.0

    def finish(self, stop=False):
        """Waits for exit (SIGTERM first if `stop`, SIGKILL at the
        deadline); returns a `Finished`.

        The peak RSS is VmHWM, read every 10 ms while the process runs (it
        only grows): rusage's ru_maxrss would include this Python process,
        whose memory the child had until it called exec. The /proc CPU
        figure is read once the child has exited but before it is reaped,
        so that it still holds the totals of every thread."""
        if stop:
            self.p.send_signal(signal.SIGTERM)
        peak = 0.0
        while True:
            peak = max(peak, self.hwm_mb())
            try:
                info = os.waitid(os.P_PID, self.p.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except ChildProcessError:
                raise RuntimeError("child already reaped")
            if info is not None:
                break
            if time.time() > self.deadline:
                self.p.kill()
            time.sleep(0.01)
        try:
            f = open(f"/proc/{self.p.pid}/stat").read().rsplit(")", 1)[1].split()
            proc_cpu = (int(f[11]) + int(f[12])) / TICK
        except OSError:
            proc_cpu = float("nan")
        _, status, ru = os.wait4(self.p.pid, 0)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        self.out.seek(0); self.err.seek(0)
        return Finished(self.out.read(), self.err.read(), self.p.returncode,
                        ru.ru_utime + ru.ru_stime, proc_cpu, peak)


def free_port():
    """A port free for both TCP and UDP on HOST."""
    for _ in range(100):
        t = socket.socket(); t.bind((HOST, 0)); port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind((HOST, port)); return port
        except OSError:
            continue
        finally:
            u.close(); t.close()
    sys.exit("no free port")


def wait_listening(proc, port, udp=False):
    """Waits (at most 3 s) until `proc` holds HOST:`port`."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    for _ in range(300):
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.bind((HOST, port))
        except OSError:
            return  # taken: the server has it
        finally:
            s.close()
        if proc.p.poll() is not None:
            raise RuntimeError("server exited early")
        time.sleep(0.01)
    raise RuntimeError("server never bound its port")


def iperf3_version(iperf3):
    """The first line of `iperf3 --version`."""
    return subprocess.run([iperf3, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
