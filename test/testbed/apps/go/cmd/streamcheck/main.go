// Command streamcheck is the checking client of the stream servers (echo servers,
// proxies in front of them, the digest sink): it opens -connections connections to
// -connect, sends -bytes of a seeded pattern on each (connection i sends stream i),
// half-closes, and checks what comes back: in -expect echo every byte in order, in
// -expect digest the sink's "<sha256> <bytes>" line. It prints one JSON report and
// exits 1 on any failure; a connection gives up when no byte moves either way for -idle
// (however long it takes in all), so a lost byte is a report, never a hang.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"bypass.local/apps/internal/idle"
	"bypass.local/apps/internal/pattern"
	"bypass.local/apps/internal/report"
	"bypass.local/apps/internal/steps"
)

type config struct {
	size      int64
	writeSize int
	seed      uint64
	expect    string
	idle      time.Duration
}

// Report is what the test reads.
type Report struct {
	Connections int      `json:"connections"`
	Exact       int      `json:"exact"`
	BytesSent   int64    `json:"bytes_sent"`
	BytesBack   int64    `json:"bytes_back"`
	Secs        float64  `json:"secs"`
	Failures    []string `json:"failures"`
}

func main() {
	connect := flag.String("connect", "", "address:port of the server")
	conns := flag.Int("connections", 1, "connections, all at once")
	size := flag.Int64("bytes", 1<<20, "bytes sent on each connection")
	writeSize := flag.Int("write-size", 64<<10, "bytes per write")
	seed := flag.Uint64("seed", 1, "pattern seed")
	expect := flag.String("expect", "echo", "echo (every byte back) or digest (a sha256 line back)")
	idleFor := idle.Flag()
	gate := steps.Flags()
	flag.Parse()
	if *expect != "echo" && *expect != "digest" {
		log.Fatalf("unknown -expect %q", *expect)
	}
	start := time.Now()
	cs := make([]*net.TCPConn, *conns)
	for i := range cs {
		c, err := net.DialTimeout("tcp", *connect, *idleFor)
		if err != nil {
			log.Fatalf("connection %d: %v", i, err)
		}
		cs[i] = c.(*net.TCPConn)
	}
	gate.Hold()
	cfg := config{*size, *writeSize, *seed, *expect, *idleFor}
	var failures report.Failures
	var exact, sent, back atomic.Int64
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			s, b, err := exchange(c, uint64(i), &cfg)
			sent.Add(s)
			back.Add(b)
			if err != nil {
				failures.Add("connection %d (%s): %v", i, c.LocalAddr(), err)
				return
			}
			exact.Add(1)
		}()
	}
	wg.Wait()
	r := Report{*conns, int(exact.Load()), sent.Load(), back.Load(), time.Since(start).Seconds(), failures.List()}
	report.Print(r, len(r.Failures) > 0)
}

// exchange sends the pattern on `c` and checks the answer; returns bytes sent and
// bytes back (in echo: bytes verified in order).
func exchange(c *net.TCPConn, stream uint64, cfg *config) (int64, int64, error) {
	type sendResult struct {
		n      int64
		digest []byte
		err    error
	}
	done := make(chan sendResult, 1)
	go func() {
		n, digest, err := send(c, stream, cfg)
		done <- sendResult{n, digest, err}
	}()
	var back int64
	var err error
	var line string
	if cfg.expect == "echo" {
		back, err = checkEcho(c, stream, cfg)
	} else {
		line, err = bufio.NewReader(idle.Wrap(c, cfg.idle)).ReadString('\n')
	}
	s := <-done
	if s.err != nil {
		return s.n, back, fmt.Errorf("send: %v after %d of %d bytes", s.err, s.n, cfg.size)
	}
	if err != nil && cfg.expect == "digest" {
		return s.n, back, fmt.Errorf("no digest line from the sink (%v), got %q", err, line)
	}
	if err != nil {
		return s.n, back, err
	}
	if cfg.expect == "digest" {
		want := fmt.Sprintf("%x %d", s.digest, s.n)
		got := strings.TrimSpace(line)
		if got != want {
			return s.n, back, fmt.Errorf("the sink read %q, sent %q", got, want)
		}
		back = s.n
	}
	return s.n, back, nil
}

func send(c *net.TCPConn, stream uint64, cfg *config) (int64, []byte, error) {
	gen := pattern.New(cfg.seed, stream)
	h := sha256.New()
	buf := make([]byte, cfg.writeSize)
	var total int64
	for total < cfg.size {
		chunk := buf[:min(int64(len(buf)), cfg.size-total)]
		_, _ = gen.Read(chunk)
		h.Write(chunk)
		n, err := idle.Wrap(c, cfg.idle).Write(chunk)
		total += int64(n)
		if err != nil {
			return total, nil, err
		}
	}
	return total, h.Sum(nil), c.CloseWrite()
}

// checkEcho reads until EOF and compares with the pattern; returns the bytes that
// matched in order.
func checkEcho(c *net.TCPConn, stream uint64, cfg *config) (int64, error) {
	gen := pattern.New(cfg.seed, stream)
	buf := make([]byte, 64<<10)
	want := make([]byte, len(buf))
	var got int64
	r := idle.Wrap(c, cfg.idle)
	for {
		n, err := r.Read(buf)
		if int64(n) > cfg.size-got {
			return got, fmt.Errorf("%d bytes back, more than the %d sent", got+int64(n), cfg.size)
		}
		_, _ = gen.Read(want[:n])
		if i := firstDiff(buf[:n], want[:n]); i >= 0 {
			return got, fmt.Errorf("byte %d differs (%#x, sent %#x; %s)", got+int64(i), buf[i], want[i],
				locate(stream, cfg, buf[i:n]))
		}
		got += int64(n)
		switch {
		case err == io.EOF && got == cfg.size:
			return got, nil
		case err == io.EOF:
			return got, fmt.Errorf("EOF after %d of %d bytes back", got, cfg.size)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return got, fmt.Errorf("no byte for %v with %d of %d bytes back", cfg.idle, got, cfg.size)
		case err != nil:
			return got, fmt.Errorf("%v after %d of %d bytes back", err, got, cfg.size)
		}
	}
}

// locate says where in the sent stream the bytes that came back instead (`wrong`, at
// least their first 64) were sent: a skip or a repeat shows as another offset, bytes
// from no offset of the stream as such.
func locate(stream uint64, cfg *config, wrong []byte) string {
	probe := wrong[:min(len(wrong), 64)]
	if len(probe) < 16 {
		return "too few bytes to place"
	}
	all := pattern.Bytes(cfg.seed, stream, int(cfg.size))
	at := bytes.Index(all, probe)
	if at < 0 {
		return "they are from no offset of the stream sent"
	}
	return fmt.Sprintf("they were sent at offset %d", at)
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
