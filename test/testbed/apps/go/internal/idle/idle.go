// Package idle gives the suite's clients a no-progress timeout instead of a deadline:
// each read or write may wait at most the idle time for its bytes, however long the
// whole exchange takes, so a slower machine is never a failure and a stall still is.
package idle

import (
	"context"
	"flag"
	"net"
	"time"
)

// Flag declares -idle; call before flag.Parse.
func Flag() *time.Duration {
	return flag.Duration("idle", 3*time.Minute, "give up when no byte moves either way for this long")
}

// Conn is a connection whose every Read and Write waits at most its idle time.
type Conn struct {
	net.Conn
	idle time.Duration
}

// Wrap gives `c` the no-progress timeout `idle`.
func Wrap(c net.Conn, idle time.Duration) *Conn {
	return &Conn{c, idle}
}

// Read reads, waiting at most the idle time for a byte.
func (c *Conn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

// Write writes, each of its waits for room at most the idle time.
func (c *Conn) Write(p []byte) (int, error) {
	var done int
	for done < len(p) {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.idle)); err != nil {
			return done, err
		}
		// At most 64 KiB at a time, so that a slow reader that keeps reading renews
		// the deadline.
		n, err := c.Conn.Write(p[done:min(len(p), done+64<<10)])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// Dial connects (waiting at most the idle time) and wraps the connection.
func Dial(ctx context.Context, network, addr string, idle time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: idle}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return Wrap(c, idle), nil
}
