"""What the netspeed pScheduler tool's methods share: reading their input,
the configuration, the test spec, ISO 8601 times, and running a child
process against a deadline.

Only Python 3's standard library (3.6 and later: EL8, Debian 11, Ubuntu
20.04), because the pScheduler Python library is not something this tool can
depend on outside perfSONAR's own packages. Where pScheduler's helpers would
be used, these functions do what they do: input JSON with '#' keys removed,
schema checks that say "Schema version N is not supported (highest is M)",
errors as one line on stderr with exit 1, and results as one JSON document on
stdout with exit 0.
"""

import configparser
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TOOL = "netspeed"

# The throughput test's highest spec schema this tool knows.
MAX_SPEC_SCHEMA = 7

CONFIG_FILE = "/etc/pscheduler/tool/netspeed.conf"
# Another configuration file, for tests and for trying the tool by hand.
CONFIG_ENV = "NETSPEED_PSCHEDULER_CONF"

# udp_server's port on the dest host. Not 35000, the port of a standalone
# udp_server service on the same host; open it in the dest's firewall.
DEFAULT_SERVER_PORT = 35100

DEFAULT_DURATION = 10.0
DEFAULT_LINK_RTT = 0.2

# The run's timeline, in seconds (see duration_seconds).
SERVER_WAIT = 2.0  # the client starts this long after the server
IDLE_PROBE = 1.0  # udp_client's --idle-probe, before the load
END_EXCHANGE = 2.0  # the End and its answer; a reverse stream's end
SHUTDOWN = 1.0  # the server's last summaries; the runner's margin

# How long before the slot ends each side is stopped if it still runs, and
# how long it then has to print its report before it is killed.
CLIENT_STOP_BEFORE_END = 2.0
SERVER_STOP_BEFORE_END = 1.0
CLIENT_GRACE = 1.5
SERVER_GRACE = 0.5


# --- Input and output ------------------------------------------------------


def fail(*messages):
    """One line on stderr and exit 1: how pScheduler's methods refuse bad
    input."""
    text = "".join(str(m) for m in messages).strip()
    sys.stderr.write(text + "\n")
    sys.exit(1)


def succeed_json(obj):
    """The method's one JSON document on stdout, and exit 0."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()
    sys.exit(0)


def strip_comments(value):
    """Removes every object key that starts with '#', at any depth, as
    pScheduler's json_load does."""
    if isinstance(value, dict):
        return {
            k: strip_comments(v)
            for k, v in value.items()
            if not (isinstance(k, str) and k.startswith("#"))
        }
    if isinstance(value, list):
        return [strip_comments(v) for v in value]
    return value


def load_input(max_schema=None):
    """The JSON document on stdin; exit 1 when it is not JSON or its schema
    is newer than max_schema."""
    text = sys.stdin.read()
    try:
        value = strip_comments(json.loads(text))
    except ValueError as e:
        fail("Invalid JSON: %s" % e)
    if max_schema is not None:
        try:
            check_schema(value, max_schema)
        except ValueError as e:
            fail(str(e))
    return value


def check_schema(obj, max_schema):
    """ValueError unless obj is an object whose 'schema' (default 1) is an
    integer no higher than max_schema."""
    if not isinstance(obj, dict):
        raise ValueError("Expected a JSON object")
    schema = obj.get("schema", 1)
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise ValueError("Schema version must be an integer")
    if schema > max_schema:
        raise ValueError(
            "Schema version %d is not supported (highest is %d)" % (schema, max_schema)
        )


# --- Times -----------------------------------------------------------------

# pScheduler's Duration: ISO 8601 without years and months.
_DURATION = re.compile(
    r"^P(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$"
)


def iso_duration_seconds(text):
    """'PT10S', 'PT0.05S', 'PT1M30S', 'P1D' as seconds; ValueError
    otherwise."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError("Invalid ISO 8601 duration %r" % (text,))
    weeks, days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return (((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 + seconds


def seconds_as_iso(seconds):
    """Whole seconds as pScheduler writes a duration: 'PT20S'."""
    return "PT%dS" % seconds


_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?"
    r"(Z|[+-]\d{2}(?::?\d{2})?)?$"
)


def parse_datetime(text):
    """An ISO 8601 time as an aware datetime; a time without an offset is
    local time (pScheduler writes the offset)."""
    match = _DATETIME.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError("Invalid ISO 8601 time %r" % (text,))
    year, month, day, hour, minute = (int(g) for g in match.groups()[:5])
    second = int(match.group(6) or 0)
    micro = int((match.group(7) or "0")[:6].ljust(6, "0"))
    zone = match.group(8)
    when = datetime.datetime(year, month, day, hour, minute, second, micro)
    if zone is None:
        return when.astimezone()
    if zone == "Z":
        offset = datetime.timedelta(0)
    else:
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * datetime.timedelta(
            hours=int(digits[:2]), minutes=int(digits[2:4] or 0)
        )
    return when.replace(tzinfo=datetime.timezone(offset))


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def seconds_until(when):
    return (when - now()).total_seconds()


def sleep_until(when):
    left = seconds_until(when)
    if left > 0:
        time.sleep(left)


def format_seconds(seconds):
    """A number of seconds for netspeed's flags: 2 -> '2s', 0.5 -> '0.5s'."""
    if float(seconds).is_integer():
        return "%ds" % seconds
    return "%rs" % float(seconds)


# --- Configuration ---------------------------------------------------------


class Config(object):
    """/etc/pscheduler/tool/netspeed.conf, section [netspeed]: the paths of
    udp_server and udp_client and the server's port."""

    def __init__(self, path):
        parser = configparser.ConfigParser()
        self.path = path
        if path and os.path.exists(path):
            try:
                parser.read(path)
            except configparser.Error as e:
                fail("%s: %s" % (path, e))
        section = parser["netspeed"] if parser.has_section("netspeed") else {}
        self.udp_server = section.get("udp_server") or find_binary("udp_server")
        self.udp_client = section.get("udp_client") or find_binary("udp_client")
        try:
            self.server_port = int(section.get("server_port") or DEFAULT_SERVER_PORT)
        except ValueError:
            fail("%s: server_port must be a port number" % path)
        if not 1 <= self.server_port <= 65535:
            fail("%s: server_port must be between 1 and 65535" % path)


def load_config():
    return Config(os.environ.get(CONFIG_ENV) or CONFIG_FILE)


def find_binary(name):
    """Where pScheduler's users (postgres, pscheduler) find a binary: not in
    someone's ~/.cargo/bin, so /usr/local/bin, /usr/bin, then PATH."""
    for folder in ("/usr/local/bin", "/usr/bin"):
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name) or os.path.join("/usr/local/bin", name)


def binary_version(path):
    """'0.1.0' from '<path> --version' ('udp_client 0.1.0 (wire protocol
    version 4)'), or None."""
    try:
        out = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            universal_newlines=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.stdout.split()
    if out.returncode != 0 or len(words) < 2:
        return None
    return words[1]


# --- The spec --------------------------------------------------------------

# Spec keys netspeed runs as asked. Everything else is refused.
SUPPORTED = {
    "schema": None,
    "source": None,
    "source-node": None,
    "dest": None,
    "dest-node": None,
    "duration": "--duration",
    "interval": "-i",
    "link-rtt": None,
    "parallel": "-P",
    "udp": None,
    "bandwidth": "--rate",
    "buffer-length": "-b",
    "ip-version": None,
    "local-address": "-B",
    "reverse": "-R",
}

# Why the options netspeed does not have are refused.
REFUSED = {
    "window-size": "it sizes its socket buffers itself (udp_server asks for 16 MiB)",
    "mss": "a TCP option",
    "congestion": "a TCP option",
    "no-delay": "a TCP option",
    "zero-copy": "it has no zero-copy send",
    "flow-label": "it cannot set an IPv6 flow label",
    "ip-tos": "it cannot set the IP TOS/DSCP byte",
    "omit": "its totals cover the whole run; it cannot leave out the first seconds",
    "single-ended": "it needs its own udp_server on the dest, started by pScheduler there",
    "single-ended-port": "it needs its own udp_server on the dest, started by pScheduler there",
    "loopback": "it runs between two pScheduler hosts",
    "reverse-connections": "its client always opens the exchange (reverse tests cross NAT without it)",
    "fq-rate": "it paces in its own sender, not with the fq qdisc",
    "bandwidth-strict": "it has no strict-bandwidth mode",
    "burst-size": "it has no burst size option",
    "client-cpu-affinity": "it does not pin itself to CPUs",
    "server-cpu-affinity": "it does not pin itself to CPUs",
}

# The largest UDP payload, over IPv4 (IPv6 allows 65527).
MAX_UDP_PAYLOAD = 65507


def spec_problems(test):
    """Why netspeed cannot run this test, one sentence per problem; empty
    when it can."""
    if not isinstance(test, dict):
        return ["Expected a test object"]
    if "type" not in test:
        return ["Missing test type"]
    if test["type"] != "throughput":
        return ["Unsupported test type %s" % test["type"]]
    spec = test.get("spec")
    if spec is None:
        return ["Missing test specification"]
    try:
        check_schema(spec, MAX_SPEC_SCHEMA)
    except ValueError as e:
        return [str(e)]
    reasons = []
    if spec.get("udp") is not True:
        reasons.append("netspeed only runs UDP tests: the spec must have udp true (--udp)")
    for key in sorted(spec):
        if key in SUPPORTED:
            continue
        why = REFUSED.get(key)
        if why:
            reasons.append("netspeed does not support the %s option: %s" % (key, why))
        else:
            reasons.append("netspeed does not support the %s option" % key)
    length = spec.get("buffer-length")
    if isinstance(length, int) and length > MAX_UDP_PAYLOAD:
        reasons.append(
            "buffer-length %d is larger than a UDP datagram can carry (%d bytes over IPv4)"
            % (length, MAX_UDP_PAYLOAD)
        )
    for key in ("duration", "interval", "link-rtt"):
        if key in spec:
            try:
                iso_duration_seconds(spec[key])
            except ValueError as e:
                reasons.append("%s: %s" % (key, e))
    return reasons


def spec_seconds(spec, key, default):
    """A Duration of the spec in seconds; exit 1 when it is not one."""
    if key not in spec:
        return default
    try:
        return iso_duration_seconds(spec[key])
    except ValueError as e:
        fail("%s: %s" % (key, e))


def setup_seconds(spec):
    """Time to set up over a long path: iperf3's rule, a second per 50 ms
    of round trip, at least one."""
    rtt = spec_seconds(spec, "link-rtt", DEFAULT_LINK_RTT)
    return max(rtt * 1000.0 / 50.0, 1.0)


def duration_seconds(spec):
    """The slot a run needs, in whole seconds: the server starts at the
    slot's start; the client SERVER_WAIT later; then its start probe and
    idle round-trip probe (IDLE_PROBE plus the setup time, which grows with
    link-rtt), the test's duration, the End exchange, and the server's
    shutdown."""
    total = (
        SERVER_WAIT
        + IDLE_PROBE
        + setup_seconds(spec)
        + spec_seconds(spec, "duration", DEFAULT_DURATION)
        + END_EXCHANGE
        + SHUTDOWN
    )
    whole = int(total)
    return whole if whole == total else whole + 1


# --- Addresses -------------------------------------------------------------


class AddressError(Exception):
    pass


def _addresses(host, family):
    try:
        infos = socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError):
        return []
    found = []
    for info in infos:
        ip = info[4][0].split("%")[0] if info[0] == socket.AF_INET6 else info[4][0]
        if ip not in found:
            found.append(ip)
    return found


FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}


def choose_addresses(spec):
    """(dest IP, bind IP or None) for the client, of one family: the spec's
    ip-version, or else one both ends have, IPv6 first (as pScheduler's
    ip_normalize_version). The client binds to local-address, or else to the
    source, as iperf3 does."""
    dest = spec["dest"]
    bind = spec.get("local-address") or spec.get("source")
    version = spec.get("ip-version")
    if version is not None:
        if version not in FAMILIES:
            raise AddressError("ip-version must be 4 or 6, not %r" % (version,))
        candidates = [version]
    else:
        candidates = [6, 4]
    for v in candidates:
        dests = _addresses(dest, FAMILIES[v])
        if not dests:
            continue
        if bind is None:
            return dests[0], None
        binds = _addresses(bind, FAMILIES[v])
        if binds:
            return dests[0], binds[0]
    if version is not None:
        if not _addresses(dest, FAMILIES[version]):
            raise AddressError("%s has no IPv%d address" % (dest, version))
        raise AddressError("%s has no IPv%d address" % (bind, version))
    if bind is None:
        raise AddressError("Cannot resolve %s" % dest)
    raise AddressError("Unable to find common IP version between %s and %s" % (bind, dest))


def host_port(ip, port):
    return "[%s]:%d" % (ip, port) if ":" in ip else "%s:%d" % (ip, port)


# --- Children --------------------------------------------------------------


class Stopped(Exception):
    """pScheduler's runner sent SIGTERM (the slot is over)."""


def _stopped(signum, frame):
    raise Stopped()


def stop_on_sigterm():
    signal.signal(signal.SIGTERM, _stopped)


class Finished(object):
    """What a child did: its exit status (negative: the signal that ended
    it), what it printed, and whether the deadline stopped it."""

    def __init__(self, argv, status, stdout, stderr, stopped):
        self.argv = argv
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
        self.stopped = stopped

    def command(self):
        return " ".join(self.argv)


def run_until(argv, deadline, grace):
    """Runs argv until it exits or until `deadline` (an aware datetime);
    then SIGTERM, and SIGKILL `grace` seconds later. Keeps everything it
    printed, also when it had to be stopped (pScheduler's run_program loses
    it). A SIGTERM to this process stops the child the same way and is then
    raised again as Stopped."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        stopped = False
        interrupted = False
        try:
            try:
                while child.poll() is None and seconds_until(deadline) > 0:
                    time.sleep(min(0.05, max(seconds_until(deadline), 0.001)))
            except Stopped:
                interrupted = True
            if child.poll() is None:
                stopped = True
                child.terminate()
                try:
                    child.wait(grace)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        out.seek(0)
        err.seek(0)
        finished = Finished(
            argv,
            child.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            stopped,
        )
    if interrupted:
        raise Stopped(finished)
    return finished


def json_lines(text):
    """The JSON objects of NDJSON output, skipping anything else."""
    values = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            values.append(value)
    return values


def write_psk(folder, psk):
    """The run's pre-shared key in a file only this user reads; None
    without a key (a task created without its key gets null)."""
    if not isinstance(psk, str) or not psk:
        return None
    path = os.path.join(folder, "psk")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(psk + "\n")
    return path
