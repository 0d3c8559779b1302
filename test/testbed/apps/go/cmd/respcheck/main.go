// Command respcheck is a pipelined Redis client that checks values byte for byte: on
// one connection it writes SET of every value, then GET of every value, all without
// waiting (a pipeline), while it reads and checks the replies: "+OK" for each SET, and
// for each GET exactly the random binary value it set. Values come in -sizes (bytes),
// -per-size of each. One JSON report; exit 1 on any failure; it gives up when no byte
// moves either way for -idle.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"time"

	"bypass.local/apps/internal/idle"
	"bypass.local/apps/internal/pattern"
	"bypass.local/apps/internal/report"
	"bypass.local/apps/internal/sizes"
	"bypass.local/apps/internal/steps"
)

// Report is what the test reads.
type Report struct {
	Values       int      `json:"values"`
	Exact        int      `json:"exact"`
	ValueBytes   int64    `json:"value_bytes"`
	BytesWritten int64    `json:"bytes_written"`
	BytesRead    int64    `json:"bytes_read"`
	Secs         float64  `json:"secs"`
	Failures     []string `json:"failures"`
}

// countingReader counts what the replies took on the wire.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func main() {
	connect := flag.String("connect", "", "address:port of redis-server")
	sizesFlag := flag.String("sizes", "0,1,100,65536,65537,300000", "value sizes in bytes")
	perSize := flag.Int("per-size", 2, "values of each size")
	seed := flag.Uint64("seed", 1, "pattern seed")
	idleFor := idle.Flag()
	gate := steps.Flags()
	flag.Parse()
	var values [][]byte
	var valueBytes int64
	for _, n := range sizes.Parse(*sizesFlag) {
		for range *perSize {
			values = append(values, pattern.Bytes(*seed, uint64(len(values)), n))
			valueBytes += int64(n)
		}
	}
	start := time.Now()
	raw, err := net.DialTimeout("tcp", *connect, *idleFor)
	if err != nil {
		log.Fatalf("connect %s: %v", *connect, err)
	}
	defer raw.Close()
	gate.Hold()
	c := idle.Wrap(raw, *idleFor)
	written := make(chan int64, 1)
	var failures report.Failures
	go func() {
		n, err := writePipeline(c, values, *seed)
		if err != nil {
			failures.Add("write: %v after %d bytes", err, n)
		}
		written <- n
	}()
	cr := &countingReader{r: c}
	exact := readReplies(bufio.NewReaderSize(cr, 64<<10), values, &failures)
	r := Report{len(values), exact, valueBytes, <-written, cr.n, time.Since(start).Seconds(), failures.List()}
	report.Print(r, len(r.Failures) > 0 || exact != len(values))
}

func key(seed uint64, i int) string {
	return fmt.Sprintf("bypass:%d:%d", seed, i)
}

// command encodes one RESP array of bulk strings.
func command(w *bufio.Writer, args ...[]byte) {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(w, "$%d\r\n", len(a))
		w.Write(a)
		w.WriteString("\r\n")
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func writePipeline(c net.Conn, values [][]byte, seed uint64) (int64, error) {
	cw := &countingWriter{w: c}
	w := bufio.NewWriterSize(cw, 64<<10)
	for i, v := range values {
		command(w, []byte("SET"), []byte(key(seed, i)), v)
	}
	for i := range values {
		command(w, []byte("GET"), []byte(key(seed, i)))
	}
	err := w.Flush()
	return cw.n, err
}

// readReplies checks every SET's "+OK" and every GET's value; returns how many values
// came back exact.
func readReplies(r *bufio.Reader, values [][]byte, failures *report.Failures) int {
	for i := range values {
		line, err := r.ReadString('\n')
		if err != nil {
			failures.Add("SET %d reply: %v", i, err)
			return 0
		}
		if line != "+OK\r\n" {
			failures.Add("SET %d replied %q", i, line)
			return 0
		}
	}
	exact := 0
	for i, want := range values {
		line, err := r.ReadString('\n')
		if err != nil {
			failures.Add("GET %d reply: %v", i, err)
			return exact
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(line, "$"), "\r\n"))
		if err != nil || !strings.HasPrefix(line, "$") {
			failures.Add("GET %d replied %q", i, line)
			return exact
		}
		got := make([]byte, n+2)
		if _, err := io.ReadFull(r, got); err != nil {
			failures.Add("GET %d: %v reading %d bytes", i, err, n)
			return exact
		}
		switch {
		case n != len(want):
			failures.Add("GET %d: %d bytes, set %d", i, n, len(want))
		case !bytes.Equal(got[:n], want):
			failures.Add("GET %d: the %d-byte value differs from the one set", i, n)
		case string(got[n:]) != "\r\n":
			failures.Add("GET %d: no CRLF after the value", i)
		default:
			exact++
		}
	}
	return exact
}
