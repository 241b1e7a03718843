// costpeer: the ends of bench/proxy-cost.sh (not part of the product), in
// Go's standard library only, so that neither end is the bottleneck that a
// Python one would be. Three subcommands:
//
//	costpeer echo -listen 127.0.0.1:0
//	    an echo server; prints "listening on ADDR"
//	costpeer http -listen 127.0.0.1:0 -size 1024
//	    an HTTP server answering every request with SIZE bytes (the
//	    backend of wrk's connections-per-second runs); prints "listening on ADDR"
//	costpeer hold -addr ADDR -n N [-pid PID] [-msg 64] [-rtts 5000]
//	    one probe connection, then N idle connections to ADDR (an echo
//	    server, or a proxy in front of one), each checked with one echo;
//	    the probe's ping-pong round trips before and while they are open;
//	    the RSS and open fds of process PID (the proxy) before and while
//	    they are open. Prints one JSON object. Every wait is bounded.
//
// Go raises its own soft RLIMIT_NOFILE to the hard limit at start (1.19+),
// so the client holds 10,000 connections whatever the shell's limit.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: costpeer echo|http|hold [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "echo":
		echo(os.Args[2:])
	case "http":
		httpServer(os.Args[2:])
	case "hold":
		hold(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: costpeer echo|http|hold [flags]")
		os.Exit(2)
	}
}

func listen(addr string) net.Listener {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "costpeer:", err)
		os.Exit(1)
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	return ln
}

func echo(args []string) {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	addr := fs.String("listen", "127.0.0.1:0", "address to listen on")
	_ = fs.Parse(args)
	ln := listen(*addr)
	for {
		c, err := ln.Accept()
		if err != nil {
			// EMFILE and friends: back off instead of spinning.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func(c net.Conn) {
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}(c)
	}
}

func httpServer(args []string) {
	fs := flag.NewFlagSet("http", flag.ExitOnError)
	addr := fs.String("listen", "127.0.0.1:0", "address to listen on")
	size := fs.Int("size", 1024, "bytes in every response body")
	_ = fs.Parse(args)
	body := []byte(strings.Repeat("x", *size))
	ln := listen(*addr)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(body)
		}),
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 30 * time.Second,
		ErrorLog:     nil,
	}
	_ = srv.Serve(ln)
}

// procStats returns VmRSS (KiB) and the number of open fds of pid.
func procStats(pid int) (int64, int) {
	if pid <= 0 {
		return 0, 0
	}
	var rss int64 = -1
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				f := strings.Fields(l)
				if len(f) >= 2 {
					rss, _ = strconv.ParseInt(f[1], 10, 64)
				}
			}
		}
	}
	fds := -1
	if d, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		fds = len(d)
	}
	return rss, fds
}

func classify(stage string, err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return stage + "_eof"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return stage + "_reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return stage + "_refused"
	case errors.As(err, &ne) && ne.Timeout():
		return stage + "_timeout"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return stage + "_client_out_of_fds"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return stage + "_no_local_port"
	}
	return stage + "_other"
}

type rttStats struct {
	N     int     `json:"n"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	Error string  `json:"error,omitempty"`
}

func pingPong(c net.Conn, size, n int, limit time.Duration) rttStats {
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte('a' + i%26)
	}
	got := make([]byte, size)
	_ = c.SetDeadline(time.Now().Add(limit))
	rtts := make([]float64, 0, n)
	for i := 0; i < n+n/10; i++ { // the first tenth warms up and is dropped
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return rttStats{N: len(rtts), Error: err.Error()}
		}
		if _, err := io.ReadFull(c, got); err != nil {
			return rttStats{N: len(rtts), Error: err.Error()}
		}
		if i >= n/10 {
			rtts = append(rtts, float64(time.Since(t0).Nanoseconds())/1e3)
		}
	}
	sort.Float64s(rtts)
	q := func(p float64) float64 { return rtts[int(p*float64(len(rtts)-1))] }
	return rttStats{N: len(rtts), P50us: q(0.50), P99us: q(0.99)}
}

func hold(args []string) {
	fs := flag.NewFlagSet("hold", flag.ExitOnError)
	addr := fs.String("addr", "", "HOST:PORT of an echo server or a proxy in front of one")
	n := fs.Int("n", 10000, "idle connections to open")
	pid := fs.Int("pid", 0, "process whose RSS and fds to read (0: none)")
	msg := fs.Int("msg", 64, "bytes per ping-pong message")
	rtts := fs.Int("rtts", 5000, "ping-pong round trips, before and while the idle connections are open")
	conc := fs.Int("dial-concurrency", 2000, "connections being set up at once")
	dialTimeout := fs.Duration("dial-timeout", 2*time.Second, "per connect")
	echoTimeout := fs.Duration("echo-timeout", 3*time.Second, "per first echo")
	overall := fs.Duration("deadline", 60*time.Second, "for opening them all")
	settle := fs.Duration("settle", 500*time.Millisecond, "pause before reading RSS")
	_ = fs.Parse(args)

	out := map[string]interface{}{"target": *n}
	rss0, fds0 := procStats(*pid)
	out["rss_before_kib"], out["fds_before"] = rss0, fds0

	// The probe first, so that it is served whatever happens to the rest.
	probe, err := net.DialTimeout("tcp", *addr, *dialTimeout)
	if err != nil {
		out["probe_error"] = err.Error()
	} else {
		out["rtt_no_idle"] = pingPong(probe, *msg, *rtts, 30*time.Second)
	}

	start := time.Now()
	end := start.Add(*overall)
	failures := map[string]int{}
	var mu sync.Mutex
	var conns []net.Conn
	sem := make(chan struct{}, *conc)
	var wg sync.WaitGroup
	for i := 0; i < *n; i++ {
		if time.Now().After(end) {
			failures["not_tried_deadline"] += *n - i
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", *addr, *dialTimeout)
			if err != nil {
				mu.Lock()
				failures[classify("connect", err)]++
				mu.Unlock()
				return
			}
			_ = c.SetDeadline(time.Now().Add(*echoTimeout))
			m := []byte(fmt.Sprintf("%08d", i))
			got := make([]byte, len(m))
			_, err = c.Write(m)
			if err == nil {
				_, err = io.ReadFull(c, got)
			}
			if err == nil && string(got) != string(m) {
				err = errors.New("echo mismatch")
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures[classify("echo", err)]++
				c.Close()
				return
			}
			_ = c.SetDeadline(time.Time{})
			conns = append(conns, c)
		}(i)
	}
	wg.Wait()
	out["open_seconds"] = time.Since(start).Seconds()
	out["served"] = len(conns)
	out["failed"] = failures
	time.Sleep(*settle)
	rss1, fds1 := procStats(*pid)
	out["rss_open_kib"], out["fds_open"] = rss1, fds1
	if probe != nil {
		out["rtt_idle_open"] = pingPong(probe, *msg, *rtts, 30*time.Second)
		// Served connections still alive after the probe: a proxy that
		// dropped some would show it here.
		// dropped some would show it here. All at once, 2 s at most.
		alive := 0
		var awg sync.WaitGroup
		for _, c := range conns {
			awg.Add(1)
			go func(c net.Conn) {
				defer awg.Done()
				buf := []byte{'z'}
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Write(buf); err == nil {
					if _, err := io.ReadFull(c, buf); err == nil {
						mu.Lock()
						alive++
						mu.Unlock()
					}
				}
			}(c)
		}
		awg.Wait()
		out["alive_after"] = alive
		probe.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
