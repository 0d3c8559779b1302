// Package relay moves bytes from one TCP connection to another the two ways Go
// programs do: io.Copy, which for a *net.TCPConn source and destination is
// TCPConn.ReadFrom and so splice(2) through a pipe (net/splice_linux.go), or a plain
// Read/Write loop through a buffer.
package relay

import (
	"flag"
	"fmt"
	"io"
	"net"
)

// Mode is how bytes are moved.
type Mode string

const (
	// Copy is io.Copy(dst, src): splice(2) on Linux.
	Copy Mode = "copy"
	// ReadWrite is a Read/Write loop through a 64 KiB buffer.
	ReadWrite Mode = "rw"
)

// Parse checks a -mode flag.
func Parse(s string) (Mode, error) {
	switch Mode(s) {
	case Copy, ReadWrite:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown mode %q (copy or rw)", s)
}

// Flag declares -mode, `def` unless given (an unknown mode is a usage error); read it
// after flag.Parse.
func Flag(def Mode) *Mode {
	m := def
	flag.Var(&m, "mode", "copy (io.Copy) or rw (Read/Write)")
	return &m
}

// String is the mode as -mode takes it (flag.Value).
func (m *Mode) String() string {
	if m == nil {
		return ""
	}
	return string(*m)
}

// Set is [Parse] into m (flag.Value).
func (m *Mode) Set(s string) error {
	v, err := Parse(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Move copies `src` to `dst` until EOF, then half-closes `dst`; returns the bytes moved.
func Move(dst, src *net.TCPConn, mode Mode) (int64, error) {
	var n int64
	var err error
	if mode == Copy {
		n, err = io.Copy(dst, src)
	} else {
		n, err = readWrite(dst, src)
	}
	if cerr := dst.CloseWrite(); err == nil {
		err = cerr
	}
	return n, err
}

func readWrite(dst, src *net.TCPConn) (int64, error) {
	buf := make([]byte, 64<<10)
	var total int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
