// Command httpcheck is the checking client of httpserver (directly or through a
// proxy): -requests rounds, each a GET of /bytes whose body must be the pattern byte
// for byte, and a POST of a pattern body whose answered SHA-256 must be the body's.
// Sizes cycle through -sizes. With keep-alive (the default) every request reuses one
// connection. One JSON report; exit 1 on any failure. A connection gives up when no
// byte moves either way for -idle, however long the whole run takes.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"time"

	"bypass.local/apps/internal/idle"
	"bypass.local/apps/internal/pattern"
	"bypass.local/apps/internal/report"
	"bypass.local/apps/internal/sizes"
)

// Report is what the test reads.
type Report struct {
	Requests    int      `json:"requests"`
	Exact       int      `json:"exact"`
	BytesGot    int64    `json:"bytes_got"`
	BytesPosted int64    `json:"bytes_posted"`
	NewConns    int      `json:"new_connections"`
	Secs        float64  `json:"secs"`
	Failures    []string `json:"failures"`
}

func main() {
	base := flag.String("base", "", "base URL, e.g. http://10.0.0.1:8080")
	rounds := flag.Int("requests", 10, "GET+POST rounds")
	sizesFlag := flag.String("sizes", "1,1000,100000,1048576", "body sizes in bytes, cycled")
	seed := flag.Uint64("seed", 1, "pattern seed")
	keepAlive := flag.Bool("keep-alive", true, "reuse one connection")
	idleFor := idle.Flag()
	flag.Parse()
	bodySizes := sizes.Parse(*sizesFlag)
	client := &http.Client{Transport: &http.Transport{
		DisableKeepAlives:   !*keepAlive,
		MaxIdleConnsPerHost: 1,
		MaxConnsPerHost:     1,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return idle.Dial(ctx, network, addr, *idleFor)
		},
	}}
	ctx := context.Background()
	r := Report{Requests: 2 * *rounds, Failures: []string{}}
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !info.Reused {
			r.NewConns++
		}
	}}
	ctx = httptrace.WithClientTrace(ctx, trace)
	start := time.Now()
	var failures report.Failures
	for i := range *rounds {
		size := int64(bodySizes[i%len(bodySizes)])
		s := *seed + uint64(i)
		if err := get(ctx, client, *base, size, s); err != nil {
			failures.Add("GET %d (%d bytes): %v", i, size, err)
		} else {
			r.Exact++
			r.BytesGot += size
		}
		if err := post(ctx, client, *base, size, s); err != nil {
			failures.Add("POST %d (%d bytes): %v", i, size, err)
		} else {
			r.Exact++
			r.BytesPosted += size
		}
	}
	r.Secs = time.Since(start).Seconds()
	r.Failures = failures.List()
	report.Print(r, len(r.Failures) > 0)
}

func get(ctx context.Context, c *http.Client, base string, size int64, seed uint64) error {
	resp, body, err := roundTrip(ctx, c, "GET", fmt.Sprintf("%s/bytes?n=%d&seed=%d", base, size, seed), nil)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	want := pattern.Bytes(seed, 0, int(size))
	if !bytes.Equal(body, want) {
		return fmt.Errorf("body of %d bytes differs from the %d sent", len(body), size)
	}
	return nil
}

func post(ctx context.Context, c *http.Client, base string, size int64, seed uint64) error {
	body := pattern.Bytes(seed, 1, int(size))
	resp, answer, err := roundTrip(ctx, c, "POST", base+"/sha256", bytes.NewReader(body))
	if err != nil {
		return err
	}
	want := fmt.Sprintf("%x %d", sha256.Sum256(body), size)
	if resp.StatusCode != http.StatusOK || string(answer) != want {
		return fmt.Errorf("status %s, answer %q, want %q", resp.Status, answer, want)
	}
	return nil
}

// roundTrip makes one request and reads the whole answer (the response's body is closed
// on return).
func roundTrip(ctx context.Context, c *http.Client, method, url string, body io.Reader) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%v after %d bytes", err, len(answer))
	}
	return resp, answer, nil
}
