/*
 * stamp-load: STAMP test packets at a reflector, as fast or as steadily as
 * asked, counting the answers. The load generator of bench/stamp-reflector.sh:
 * it drives netspeed's reflector and stamp-suite's with the same packets.
 *
 *   stamp-load HOST PORT open  RATE   SECONDS SOCKETS [SIZE]
 *   stamp-load HOST PORT closed WINDOW SECONDS SOCKETS [SIZE]
 *
 * open:   RATE test packets a second in all, spread over SOCKETS sockets
 *         (each its own STAMP session: its own port and SSID), sent in
 *         1 ms ticks with sendmmsg;
 * closed: WINDOW packets in flight per socket; each answer releases the
 *         next, and a socket that hears nothing for 20 ms starts a fresh
 *         window (what was in flight is taken as lost).
 *
 * Prints one JSON line: {"sent":N,"answered":N,"seconds":S}. Answers are
 * counted by the socket they reach (each connected to the reflector);
 * one STAMP answer per datagram of at least 44 bytes.
 *
 * Only the C library and Linux's sendmmsg/recvmmsg; no STAMP code of
 * anyone else's. Build: cc -O2 -o stamp-load stamp-load.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SOCKETS 64
#define BATCH 64
#define MAX_SIZE 1500

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* NTP time of the wall clock, for T1. */
static uint64_t ntp_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    uint64_t sec = (uint64_t)t.tv_sec + 2208988800ULL;
    uint64_t frac = ((uint64_t)t.tv_nsec << 32) / 1000000000ULL;
    return (sec << 32) | frac;
}

struct flow {
    int fd;
    uint32_t seq;
    uint16_t ssid;
    long inflight;
    double last_answer;
};

static unsigned char packets[BATCH][MAX_SIZE];
static struct mmsghdr out[BATCH];
static struct iovec out_iov[BATCH];
static unsigned char inbuf[BATCH][MAX_SIZE];
static struct mmsghdr in[BATCH];
static struct iovec in_iov[BATCH];
static size_t size = 44;

/* Sends n test packets on flow f; returns how many went. */
static long send_n(struct flow *f, long n) {
    long sent = 0;
    while (n > 0) {
        int k = n > BATCH ? BATCH : (int)n;
        uint64_t t1 = ntp_now();
        for (int i = 0; i < k; i++) {
            unsigned char *p = packets[i];
            memset(p, 0, size);
            uint32_t seq = htonl(f->seq + i);
            memcpy(p, &seq, 4);
            uint32_t hi = htonl((uint32_t)(t1 >> 32)), lo = htonl((uint32_t)t1);
            memcpy(p + 4, &hi, 4);
            memcpy(p + 8, &lo, 4);
            p[13] = 1; /* error estimate: S=0, scale 0, multiplier 1 */
            uint16_t ssid = htons(f->ssid);
            memcpy(p + 14, &ssid, 2);
            out_iov[i].iov_base = p;
            out_iov[i].iov_len = size;
            memset(&out[i], 0, sizeof out[i]);
            out[i].msg_hdr.msg_iov = &out_iov[i];
            out[i].msg_hdr.msg_iovlen = 1;
        }
        int r = sendmmsg(f->fd, out, k, MSG_DONTWAIT);
        if (r <= 0)
            break;
        f->seq += r;
        sent += r;
        n -= r;
        if (r < k)
            break;
    }
    return sent;
}

/* Reads every answer queued on flow f; returns how many. */
static long drain(struct flow *f) {
    long got = 0;
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            in_iov[i].iov_base = inbuf[i];
            in_iov[i].iov_len = MAX_SIZE;
            memset(&in[i], 0, sizeof in[i]);
            in[i].msg_hdr.msg_iov = &in_iov[i];
            in[i].msg_hdr.msg_iovlen = 1;
        }
        int r = recvmmsg(f->fd, in, BATCH, MSG_DONTWAIT, NULL);
        if (r <= 0)
            return got;
        for (int i = 0; i < r; i++)
            if (in[i].msg_len >= 44)
                got++;
    }
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s HOST PORT open|closed RATE|WINDOW SECONDS SOCKETS [SIZE]\n", argv[0]);
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]);
    int closed = strcmp(argv[3], "closed") == 0;
    double param = atof(argv[4]);
    double seconds = atof(argv[5]);
    int nflows = atoi(argv[6]);
    if (argc > 7)
        size = (size_t)atoi(argv[7]);
    if (nflows < 1 || nflows > MAX_SOCKETS || size < 44 || size > MAX_SIZE || param <= 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &to.sin_addr) != 1) {
        fprintf(stderr, "HOST must be an IPv4 address\n");
        return 2;
    }
    struct flow flows[MAX_SOCKETS];
    struct pollfd fds[MAX_SOCKETS];
    for (int i = 0; i < nflows; i++) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        int buf = 4 << 20;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf);
        if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
            perror("socket");
            return 1;
        }
        flows[i] = (struct flow){.fd = fd, .seq = 0, .ssid = (uint16_t)(i + 1)};
        fds[i] = (struct pollfd){.fd = fd, .events = POLLIN};
    }
    long sent = 0, answered = 0;
    double start = now(), end = start + seconds, t = start;
    double per_flow_rate = param / nflows;
    double due[MAX_SOCKETS] = {0};
    if (closed)
        for (int i = 0; i < nflows; i++) {
            long s = send_n(&flows[i], (long)param);
            flows[i].inflight = s;
            flows[i].last_answer = start;
            sent += s;
        }
    double next_tick = start;
    while ((t = now()) < end) {
        if (!closed && t >= next_tick) {
            /* What is due since the start, per flow, goes out now. */
            for (int i = 0; i < nflows; i++) {
                long want = (long)((t - start) * per_flow_rate) - (long)due[i];
                if (want > 0) {
                    long s = send_n(&flows[i], want);
                    due[i] += want; /* not sent is not sent again: offered load */
                    sent += s;
                }
            }
            next_tick += 0.001;
        }
        int timeout_ms = closed ? 5 : (int)((next_tick - now()) * 1000);
        if (timeout_ms < 0)
            timeout_ms = 0;
        poll(fds, nflows, timeout_ms);
        t = now();
        for (int i = 0; i < nflows; i++) {
            long got = drain(&flows[i]);
            answered += got;
            if (!closed)
                continue;
            if (got > 0) {
                flows[i].inflight -= got;
                if (flows[i].inflight < 0)
                    flows[i].inflight = 0;
                flows[i].last_answer = t;
            } else if (t - flows[i].last_answer > 0.02) {
                flows[i].inflight = 0; /* the window was lost: a fresh one */
                flows[i].last_answer = t;
            }
            long s = send_n(&flows[i], (long)param - flows[i].inflight);
            flows[i].inflight += s;
            sent += s;
        }
    }
    /* Answers still on their way. */
    double stop = now() + 0.2;
    while (now() < stop) {
        poll(fds, nflows, 20);
        for (int i = 0; i < nflows; i++)
            answered += drain(&flows[i]);
    }
    printf("{\"sent\":%ld,\"answered\":%ld,\"seconds\":%.3f}\n", sent, answered, seconds);
    return 0;
}
